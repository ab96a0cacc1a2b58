"""Each supported API shape of vLLM asked directly: the published source of the releases
whose parser or allocator differ in what the product calls (0.25.1: the parser in
``entrypoints.openai``, no cache layout, MLA specs without the newer fields; 0.29.0: the
parser in ``entrypoints.launchers``, the pool's bytes per block from the groups alone;
0.33.0: the parser in ``entrypoints.common``, the allocator in ``kv_cache_planning`` behind a
config builder), imported on this host's CPU platform with this environment's torch
(``tests/support/vllm_sources.py``). The installed 0.32 is asked by the other capacity tests.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator

import pytest
from vllm_sources import SourceUnavailable, python_for, site_path_for

from pytest_longctx import capacity
from pytest_longctx.capacity import oracle
from pytest_longctx.core import warm_python
from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import load_profile, vllm_releases
from pytest_longctx.serving import vllm_command

pytestmark = pytest.mark.oracle

MI = 1024**2
SHAPES = ("0.25.1", "0.29.0", "0.33.0")


@pytest.fixture(scope="module", params=SHAPES)
def published(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(version, a Python importing that release's published ``vllm``)."""
    try:
        python = python_for(request.param)
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM {request.param}'s source is not at hand: {exc}")
    yield request.param, python
    warm_python.stop(python)


def test_its_parser_is_found_and_judges_the_study_command(
    published: tuple[str, str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    version, python = published
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path))
    vllm_command.ask_parser.cache_clear()
    command = vllm_command.build_server_command(
        load_profile("kimi-linear-mi355x"),
        model_path="moonshotai/Kimi-Linear-48B-A3B-Instruct",
        tokenizer_path=None,
        max_model_len=64 * MI + 1024,
        port=8123,
        entry=(sys.executable, "-m", vllm_command.SERVER_MODULE),
        prompt_tokens_details=True,
        sse_keep_alive_s=30,
    )
    _, check = vllm_command.check_flags(command, python=python)
    vllm_command.ask_parser.cache_clear()
    assert check is not None, f"vLLM {version}'s parser was not found"
    assert check.version == version
    row = vllm_releases.row_for(version)
    assert row is not None
    assert set(check.left_out) == {
        flag for flag in vllm_command.plugin_flags(command.argv) if not row.accepts(flag)
    }
    assert check.problem() is None, check.problem()


def _asked(layout: capacity.CacheLayout, tokens: int, python: str) -> oracle.OracleAnswer:
    allocation = layout.allocation
    assert allocation is not None
    return oracle.ask_in_subprocess(
        layout.layers,
        allocation.settings,
        allocation.stages,
        layout.element_bytes,
        tokens,
        python=python,
    )


def test_its_allocator_agrees_with_the_plan_made_for_it(
    published: tuple[str, str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """The study's model under the release's own defaults (0.25.1: prefix caching off for
    hybrids, no 128-token MLA alignment), asked of that release's allocator functions."""
    version, python = published
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path))
    row = vllm_releases.row_for(version)
    assert row is not None
    layout = capacity_check.layout_for(load_profile("kimi-linear-mi355x"), release=row)
    assert layout is not None and layout.allocation is not None
    expected_mode = "align" if row.hybrid_prefix_caching else "none"
    assert layout.allocation.settings.mamba_cache_mode == expected_mode
    answer = _asked(layout, 64 * MI, python)
    assert answer.version == f"vLLM {version}"
    assert answer.per_rank_bytes == sum(layout.request_bytes(64 * MI))
    assert answer.bytes_per_block[0] == layout.allocation.bytes_per_block()


def test_its_allocator_agrees_on_deepseek_v32_where_it_starts(
    published: tuple[str, str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """The shipped DeepSeek-V3.2 profile at the largest length its start-up workspace lets
    start under the release: that release's allocator needs what the plan counts."""
    version, python = published
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path))
    row = vllm_releases.row_for(version)
    assert row is not None
    profile = load_profile("deepseek-v3.2-mi355x")
    layout = capacity_check.layout_for(profile, release=row)
    settings = capacity_check.workspace_settings(profile, layout, row)
    assert layout is not None and layout.allocation is not None and settings is not None
    tokens = capacity.fit_point(
        layout,
        capacity_check.hardware_for(profile),
        1,
        workspace=capacity_check.workspace_rule(profile, layout, settings),
    ).max_tokens
    assert 0 < tokens < 64 * MI
    answer = _asked(layout, tokens, python)
    assert answer.version == f"vLLM {version}"
    assert answer.per_rank_bytes == sum(layout.request_bytes(tokens))


def test_its_allocator_agrees_on_a_sliding_window_model(
    published: tuple[str, str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    version, python = published
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path))
    from longctx_testing import REPO

    published = REPO / "tests" / "support" / "published_configs"
    config = json.loads((published / "gpt-oss-20b.json").read_text())
    layout = capacity.cache_layout(config, tensor_parallel=1, block_size=16)
    answer = _asked(layout, 1 * MI, python)
    assert answer.per_rank_bytes == sum(layout.request_bytes(1 * MI)), version


def test_the_release_shapes_are_the_ones_the_table_names() -> None:
    rows = [vllm_releases.row_for(v) for v in SHAPES]
    assert [r.parser_module for r in rows if r] == [
        "vllm.entrypoints.openai.cli_args",
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.common.cli_args",
    ]
    assert dataclasses.replace(rows[2], version="x").allocator_module.endswith("kv_cache_planning")


def test_the_plan_names_and_asks_the_installed_release(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With vLLM 0.33.0 installed (its published package on the path), ``--longctx-plan``
    for the H200 profile names 0.33.0, checks its flags with 0.33.0's parser (moved to
    ``entrypoints.common``) and asks 0.33.0's allocator (moved to ``kv_cache_planning``)."""
    from longctx_testing import SWEEP_TEST

    try:
        site = site_path_for("0.33.0")
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM 0.33.0's source is not at hand: {exc}")
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    monkeypatch.setenv("PYTHONPATH", site)
    monkeypatch.setenv(warm_python.WARM_ENV, "0")  # its questions in Pythons of their own
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        "--longctx-profile=kimi-linear-h200",
        "--longctx-to=64Ki",
        f"--longctx-output={pytester.path / 'out'}",
    )
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "vLLM planned for: 0.33.0+cpu (installed here, the one a launch runs)",
            "flags checked by vLLM 0.33.0's parser (installed here): all accepted",
            "vLLM 0.33.0 asked here (its KV-cache groups and memory functions*the plan agrees*",
        ]
    )
