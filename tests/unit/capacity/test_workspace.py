"""The sparse-MLA start-up workspace: the rule per release, checked against each release's own
source (its functions run on the question), vLLM's workspace manager (installed), and the plan
of the shipped DeepSeek-V3.2 profile that it decides."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from vllm_sources import SourceUnavailable, source_tree

from pytest_longctx.capacity import workspace as ws
from pytest_longctx.capacity.layout import GIB
from pytest_longctx.core.sizes import format_size


def settings(release: str, **changes: Any) -> ws.WorkspaceSettings:
    base = ws.WorkspaceSettings(
        release=release,
        backend=ws.ROCM_BACKEND,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        index_head_dim=128,
    )
    return dataclasses.replace(base, **changes)


def release_function(version: str, relative: str, name: str, **names: Any) -> Any:
    """``name`` as ``version``'s published source defines it, run with ``names`` as its
    module's globals (the source is fetched once; offline, the test skips)."""
    try:
        folder = source_tree(version, whole=True)
    except SourceUnavailable as exc:
        pytest.skip(str(exc))
    text = (Path(folder) / "vllm" / relative).read_text()
    tree = ast.parse(text)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        return None
    module = ast.Module(body=found, type_ignores=[])
    namespace: dict[str, Any] = {"VllmConfig": object, **names}
    exec(compile(module, f"vllm-{version}/{relative}", "exec"), namespace)  # noqa: S102
    return namespace[name]


def config(max_model_len: int, factor: int | None = None, seqs: int = 1024, spec: int = 0):
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        attention_config=SimpleNamespace(sparse_mla_prefill_workspace_factor=factor),
        scheduler_config=SimpleNamespace(max_num_seqs=seqs),
        speculative_config=SimpleNamespace(num_speculative_tokens=spec),
    )


@pytest.mark.parametrize("version", ["0.25.1", "0.34.0"])
@pytest.mark.parametrize("max_model_len", [4096, 300_000, 4_195_328])
def test_the_prefill_keys_are_the_releases_own(version: str, max_model_len: int) -> None:
    """``get_max_prefill_buffer_size`` of each release, run: 40 per token up to 0.31.0, then
    8 x the factor (5 up to 256Ki, 2 above, unless given)."""
    published = release_function(
        version, "v1/attention/backends/mla/indexer.py", "get_max_prefill_buffer_size"
    )
    factor = ws.WorkspaceSettings.factor(settings(version), max_model_len)
    assert published(config(max_model_len, factor)) == settings(version).prefill_entries(
        max_model_len
    )
    if version == "0.34.0":  # a factor given is the one used
        assert published(config(max_model_len, 3)) == settings(
            version, prefill_factor=3
        ).prefill_entries(max_model_len)


@pytest.mark.parametrize(("seqs", "spec"), [(1, 0), (1024, 0), (16, 3), (20000, 0)])
def test_the_decode_rows_are_the_releases_own(seqs: int, spec: int) -> None:
    """0.25.1 reserves the dummy run's tokens (max_num_batched_tokens) rows of decode logits;
    0.34.0's ``_max_decode_logits_rows`` bounds them by max_num_seqs x (1 + spec)."""
    question = config(1, seqs=seqs, spec=spec)
    bounded = release_function(
        "0.34.0",
        "v1/attention/ops/rocm_aiter_mla_sparse.py",
        "_max_decode_logits_rows",
        get_current_vllm_config=lambda: question,
    )
    ours = settings("0.34.0", max_num_seqs=seqs, speculative_tokens=spec)
    assert bounded(8192) == ours.decode_rows()
    assert (
        release_function(
            "0.25.1", "v1/attention/ops/rocm_aiter_mla_sparse.py", "_max_decode_logits_rows"
        )
        is None
    )
    assert settings("0.25.1", max_num_seqs=seqs, speculative_tokens=spec).decode_rows() == 8192


def test_the_0_25_1_profiling_branch_reserves_what_the_rule_counts() -> None:
    """The two requests of 0.25.1's profiling branch, as its source writes them."""
    try:
        folder = source_tree("0.25.1", whole=True)
    except SourceUnavailable as exc:
        pytest.skip(str(exc))
    text = (folder / "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py").read_text()
    branch = text[text.index("Profiling early-exit") : text.index("max_logits_elems")]
    assert "((total_seq_lens, head_dim), fp8_dtype)" in branch
    assert "((total_seq_lens, 4), torch.uint8)" in branch
    assert "((hidden_states.shape[0], max_model_len), torch.float32)" in branch


@pytest.mark.oracle  # imports vLLM and torch into the session's own process
def test_vllms_workspace_manager_holds_the_largest_request(monkeypatch) -> None:
    """The installed vLLM's WorkspaceManager, given the two requests of the ROCm profiling
    branch, ends exactly as large as the rule says (each tensor rounded to 256 B, a request
    summed, the workspace the larger request)."""
    torch = pytest.importorskip("torch")
    from vllm.v1.worker.workspace import WorkspaceManager

    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)  # no device here
    for release, max_model_len, batched in [("0.25.1", 1001, 8), ("0.25.1", 999, 300)]:
        rule = settings(release, max_num_batched_tokens=batched)
        manager = WorkspaceManager(torch.device("cpu"))
        entries = rule.prefill_entries(max_model_len)
        manager.get_simultaneous(((entries, 128), torch.float8_e4m3fn), ((entries, 4), torch.uint8))
        manager.get_simultaneous(((rule.decode_rows(), max_model_len), torch.float32))
        manager.lock()
        predicted = ws.workspace_for(rule, max_model_len).bytes
        manager.get_simultaneous(((predicted,), torch.uint8))  # fits what was reserved
        with pytest.raises(AssertionError, match="locked"):
            manager.get_simultaneous(((predicted + 1,), torch.uint8))


def test_the_issues_figures_per_mi_of_max_model_len() -> None:
    """About 32 GiB of decode logits per Mi at 8,192 batched tokens, about 5.2 GiB of prefill
    keys per Mi, under 0.25.1; the workspace the larger."""
    held = ws.workspace_for(settings("0.25.1"), 1024 * 1024)
    assert held.decode_bytes == 32 * GIB
    assert held.prefill_bytes == 1024 * 1024 * 40 * 132
    assert held.bytes == held.decode_bytes and held.largest.startswith("decode logits")
    newer = ws.workspace_for(settings("0.34.0", max_num_seqs=1), 1024 * 1024)
    assert newer.decode_bytes == 4 * 1024 * 1024  # one row
    assert newer.bytes == newer.prefill_bytes == 1024 * 1024 * 16 * 132  # factor 2


def test_cuda_reserves_the_prefill_keys_and_flashmlas_buffer() -> None:
    rule = settings("0.25.1", backend="FLASHMLA_SPARSE", packed_cache=True, heads_per_rank=16)
    held = ws.workspace_for(rule, 1 << 20)
    assert held.decode_bytes == 0
    assert held.prefill_bytes == (1 << 20) * 40 * 132 + ws.RADIX_TOPK_WORKSPACE_BYTES
    assert held.attention_bytes == 8192 * 16 * 1152 + 5 * (1 << 20) * 1152
    assert held.bytes == held.attention_bytes


def test_largest_passing_finds_the_boundary() -> None:
    assert ws.largest_passing(lambda n: n <= 777, 1, 10_000) == 777
    assert ws.largest_passing(lambda n: False, 1, 10) is None
    assert ws.largest_passing(lambda n: True, 1, 10) == 10


# --- the plan of the shipped DeepSeek-V3.2 profile ------------------------------------------


def shipped(tmp_path: Path, drop_env: str | None = None, extra: str = ""):
    from pytest_longctx.profiles import load_profile

    source = Path(__file__).parents[3] / "pytest_longctx/profiles/shipped/deepseek-v3.2-mi355x.toml"
    text = source.read_text()
    if drop_env:
        text = "\n".join(line for line in text.splitlines() if not line.startswith(drop_env))
    text = text.replace('config = "deepseek-v3.2-config.json"', f'config = "{_data()}"')
    text = text.replace("startup_timeout_s = 7200", f"startup_timeout_s = 7200\n{extra}")
    path = tmp_path / "v32.toml"
    path.write_text(text)
    return load_profile(str(path))


def _data() -> str:
    return str(Path(__file__).parents[3] / "pytest_longctx/profiles/data/deepseek-v3.2-config.json")


def plan_for(profile):
    from longctx_testing import plan_settings

    from pytest_longctx.plan.points import build_plan

    return build_plan(plan_settings(profile=str(profile.path)), profile)


def test_the_plan_counts_the_workspace_at_each_lengths_max_model_len(tmp_path) -> None:
    """Under 0.25.1 the lengths whose cache, weights and workspace pass the budget cannot
    start, and without the workspace the first of them would have been said to fit."""
    from pytest_longctx import capacity
    from pytest_longctx.plan import capacity_check

    profile = shipped(tmp_path)
    plan = plan_for(profile)
    fits = capacity_check.check_points(plan, plan.lengths)
    layout = capacity_check.layout_for(profile)
    hardware = capacity_check.hardware_for(profile)
    rule = capacity_check.workspace_settings(profile, layout)
    assert rule is not None and rule.release == "0.25.1" and rule.max_num_batched_tokens == 8192
    blocked = [n for n, fit in fits.items() if fit.cannot_start]
    assert blocked and blocked == sorted(blocked) and blocked[-1] == plan.lengths[-1]
    for length, fit in fits.items():
        tokens = length + plan.tokens_after_prefix
        kv = sum(layout.request_bytes(tokens))
        reserved = ws.workspace_for(rule, tokens).bytes
        weights = hardware.weights_on_rank(8, 8)
        whole = kv + weights + reserved + layout.allocation.bytes_per_block()
        assert fit.workspace_bytes == reserved
        assert fit.fits == (whole <= hardware.usable_per_device_bytes)
    bare = capacity.fit_point(layout, hardware, blocked[0], plan.tokens_after_prefix)
    assert bare.fits, "the first length that cannot start fits without the workspace"


def test_the_plan_names_the_largest_length_and_the_lever(tmp_path) -> None:
    from pytest_longctx.plan import capacity_check

    profile = shipped(tmp_path)
    plan = plan_for(profile)
    rows = list(capacity_check.check_points(plan, plan.lengths).values())
    text = "\n".join(capacity_check.workspace_lines(plan, rows))
    largest = max(r.length for r in rows if r.fits)
    first = min(r.length for r in rows if r.cannot_start)
    assert f"largest length that can start: {format_size(largest)} " in text
    assert f"at {format_size(first)} " in text and "decode logits 8,192 rows" in text
    lever = next(line for line in text.splitlines() if "--max-num-batched-tokens" in line)
    batched = int(lever.split("--max-num-batched-tokens ")[1].split()[0])
    # the lever lets the first blocked length start, and 256 more tokens would not
    extra = f'extra_args = ["--max-num-batched-tokens", "{batched}"]'
    lowered = shipped(tmp_path, extra=extra)
    assert capacity_check.check_points(plan_for(lowered), [first])[first].fits
    raised = shipped(tmp_path, extra=extra.replace(str(batched), str(batched + 256)))
    assert not capacity_check.check_points(plan_for(raised), [first])[first].fits
    assert "lever: vLLM 0.34.0" in text


def test_the_plan_says_the_indexer_needs_aiter(tmp_path) -> None:
    from pytest_longctx.plan import capacity_check

    for profile, said in [
        (shipped(tmp_path), False),
        (shipped(tmp_path, "VLLM_ROCM_USE_AITER"), True),
    ]:
        plan = plan_for(profile)
        rows = list(capacity_check.check_points(plan, plan.lengths[:1]).values())
        lines = capacity_check.workspace_lines(plan, rows)
        assert any("VLLM_ROCM_USE_AITER" in line for line in lines) == said
