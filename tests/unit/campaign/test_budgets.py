"""First-token budgets of lengths nothing in the process measured yet, vLLM's step limit against
the longest planned step, and what ``--longctx-plan`` says of both.

The reference study's 64Mi TTFT is 40,171.67 s. A point that starts with nothing measured
before it in its process (the longest one first under pytest-xdist, the first after
``--longctx-resume``, ``--longctx-from=64Mi``) once waited the profile's flat default of 6 h
and ended ``timeout``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, schedule_on_two

from pytest_longctx.campaign import point_setup
from pytest_longctx.core.records import Record, append_record
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.measure.timeouts import FirstTokenBudget, KnownTtft
from pytest_longctx.plan.points import Point
from pytest_longctx.profiles import load_profile, vllm_releases
from pytest_longctx.profiles.profile import PROFILE_DIR, ProfileError
from pytest_longctx.serving import step_limit
from pytest_longctx.workloads import points_of

MI = 1024**2
#: The study's 64Mi TTFT (Table 1, n=3 mean).
STUDY_64MI_TTFT_S = 40_171.67
SIX_HOURS_S = 6 * 3600.0
SERVER = ServerInfo("http://127.0.0.1:9", "kimi", None, "launched")


def budget_of(run, length: int) -> tuple[float, str]:  # noqa: ANN001
    """The budget the session gives a point of ``length``, as its setup decides it."""
    settings = point_setup.prepare(
        run.description,
        SERVER,
        Point(length, 0),
        selected=run.selected_points,
        records=run.results.all_records(),
        measured_ttft=run.sweep.measured_ttft,
        stream_interval=None,
    ).settings
    return settings.first_token_budget_s, settings.budget_source


# -- item 1: the budget of a length nothing in the process has measured ----------------------


def test_the_longest_point_xdist_sends_first_waits_by_the_profiles_expected_ttft(
    pytester: pytest.Pytester,
) -> None:
    """pytest-xdist's scheduler (the sweep's own, longest first) hands each worker a 64Mi or
    32Mi point first, in a process that has measured nothing: its budget is three times what
    the profile's expected TTFT (the study's Table 1) predicts, not the 6 h default."""
    from pytest_longctx.session.activation import PREPARED_KEY

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-profile=kimi-linear-mi355x")
    run = config.stash[PREPARED_KEY].run
    collection = [f"test_sweep.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    _, a, b, _ = schedule_on_two(config, run, collection)
    first = [points_of(run.plan)[node.sent[0]] for node in (a, b)]
    assert [p.length for p in first] == [64 * MI, 32 * MI]  # the scheduler's own order
    assert run.sweep.measured_ttft == {}  # nothing measured in the process
    seconds, source = budget_of(run, 64 * MI)
    assert seconds >= 3 * STUDY_64MI_TTFT_S * 0.95  # the model is within 5% of the table
    assert "expected_ttft" in source and not source.startswith("default")
    seconds_32, source_32 = budget_of(run, 32 * MI)
    assert 3 * 10_224.59 * 0.95 <= seconds_32 < seconds
    assert "expected_ttft" in source_32


def earlier_run(pytester: pytest.Pytester, ttft_by_length: dict[int, float]) -> Path:
    """A run of kimi-linear-mi355x that measured these lengths (passed, cold) and then
    stopped: the folder ``--longctx-resume`` continues."""
    run_dir = pytester.path / "reports" / "20260101T000000Z-abcdef"
    for length, ttft in ttft_by_length.items():
        append_record(
            run_dir / "results.jsonl",
            Record(
                run_id=run_dir.name,
                nodeid=f"test_sweep.py::test_prefill_decode[len={length}-rep=0]",
                length=length,
                repeat=0,
                outcome="passed",
                figures={"ttft": ttft, "decode_throughput": 20.0},
                prompt_tokens=length,
                completion_tokens=1024,
                fingerprint={"profile": "kimi-linear-mi355x"},
            ),
        )
    return run_dir


def test_a_resumed_run_budgets_64mi_from_its_records(pytester: pytest.Pytester) -> None:
    """The run got to 32Mi (9,000 s on this node) and stopped; resumed, 64Mi is the first
    point the new process measures: its budget is extrapolated from the 32Mi record (an upper
    bound: TTFT grows at most as the square of the length), not the 6 h default, and not the
    profile's expected figures (the records are this node's)."""
    from pytest_longctx.session.activation import PREPARED_KEY

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    run_dir = earlier_run(pytester, {MI: 17.0, 8 * MI: 700.0, 32 * MI: 9_000.0})
    config = pytester.parseconfigure(
        "--longctx-output=reports",
        f"--longctx-resume={run_dir.name}",
        "--longctx-profile=kimi-linear-mi355x",
    )
    run = config.stash[PREPARED_KEY].run
    assert run.results.resumed and run.sweep.measured_ttft == {}
    seconds, source = budget_of(run, 64 * MI)
    assert seconds == pytest.approx(9_000.0 * 2**2 * 3)
    assert source.startswith("extrapolated: 32Mi took 9e+03 s (recorded in this run)")


def test_what_the_run_knows_comes_in_order_records_then_models_then_expected_figures() -> None:
    budget = FirstTokenBudget(floor_s=60.0, safety_factor=3.0, default_s=SIX_HOURS_S)
    records = KnownTtft(
        "recorded in this run",
        {32 * MI: 10_000.0, 64 * MI: 40_000.0},
        model=lambda n: 40_000.0 * (n / (64 * MI)) ** 2,
        model_text="the records' model",
        of_this_run=True,
    )
    expected = KnownTtft("expected", {MI: 18.0, 8 * MI: 745.0})
    # a record at or below counts as a measurement of this process
    seconds, why = budget.for_length(64 * MI, {}, known=(records, expected))
    assert seconds == pytest.approx(40_000.0 * 3) and "(recorded in this run)" in why
    # below every record: the records' model, before the expected figures
    seconds, why = budget.for_length(16 * MI, {}, known=(records, expected))
    assert seconds == pytest.approx(2_500.0 * 3) and why.startswith("predicted: the records'")
    # no model: the expected figure at or below, extrapolated
    one_record = KnownTtft("recorded in this run", {64 * MI: 40_000.0}, of_this_run=True)
    seconds, why = budget.for_length(16 * MI, {}, known=(one_record, expected))
    assert seconds == pytest.approx(745.0 * 4 * 3) and "is expected to take 745 s" in why
    # nothing at or below anywhere: the shortest known length above bounds it
    seconds, why = budget.for_length(2 * MI, {}, known=(one_record,))
    assert seconds == pytest.approx(40_000.0 * 3) and why.startswith("bounded by 64Mi's")
    # this process's own measurement still wins where it is the closest base
    seconds, why = budget.for_length(40 * MI, {36 * MI: 12_000.0}, known=(records,))
    assert why.startswith("extrapolated: 36Mi took 1.2e+04 s;")
    assert budget.for_length(64 * MI, {})[0] == SIX_HOURS_S  # nothing known at all


def test_the_budgets_edges_ties_and_sources() -> None:
    """Where two sources say the same, the first named wins; a figure at the length itself is
    a base; a model that predicts nothing (0 s) is passed over, one that predicts under a
    second is not; a budget exactly at the floor is its own figure."""
    budget = FirstTokenBudget(floor_s=60.0, safety_factor=3.0, default_s=SIX_HOURS_S)
    this_run = KnownTtft("recorded in this run", {MI: 20.0}, of_this_run=True)
    seconds, why = budget.for_length(MI, {MI: 20.0}, known=(this_run,))
    assert seconds == 60.0 and why.startswith("extrapolated: 1Mi took 20 s;"), why
    expected = KnownTtft("expected", {16 * MI: 100.0})
    seconds, why = budget.for_length(16 * MI, {}, known=(expected,))
    assert seconds == 300.0 and "16Mi is expected to take 100 s" in why
    only_above = KnownTtft("expected", {64 * MI: 40_000.0})
    seconds, why = budget.for_length(16 * MI, {}, known=(only_above,))
    assert seconds == 120_000.0 and why.startswith("bounded by 64Mi's 4e+04 s (expected)")
    records_above = KnownTtft("recorded in this run", {64 * MI: 40_000.0}, of_this_run=True)
    _, why = budget.for_length(2 * MI, {}, known=(records_above, only_above))
    assert "(recorded in this run)" in why, why
    nothing = KnownTtft("recorded in this run", {}, model=lambda n: 0.0, model_text="flat")
    assert budget.for_length(MI, {}, known=(nothing,))[0] == SIX_HOURS_S
    quick = KnownTtft("recorded in this run", {}, model=lambda n: 0.5, model_text="quick")
    seconds, why = budget.for_length(MI, {}, known=(quick,))
    assert seconds == 60.0 and why.startswith("floor of 60 s (predicted: quick predicts 0.5 s")


def test_the_profile_reads_expected_ttft_and_refuses_what_is_not_seconds_by_length(
    tmp_path: Path,
) -> None:
    assert load_profile("kimi-linear-mi355x").sweep.expected_ttft[64 * MI] == STUDY_64MI_TTFT_S
    base = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    for table, said in (
        ('{ "1Ki" = -1 }', r"\[sweep.expected_ttft\] '1Ki' = -1 must be a positive number"),
        ('{ "1Kx" = 2 }', r"\[sweep.expected_ttft\] 1Kx"),
        ('"fast"', r"\[sweep\] expected_ttft must be a table of lengths to seconds"),
    ):
        path = tmp_path / "bad.toml"
        path.write_text(base.replace("[sweep]\n", f"[sweep]\nexpected_ttft = {table}\n"))
        with pytest.raises(ProfileError, match=said):
            load_profile(str(path))


# -- item 2: vLLM's step limit, as each release's source says -------------------------------


@pytest.mark.parametrize("version", [row.version for row in vllm_releases.RELEASES])
def test_each_supported_release_limits_a_multiprocessing_step_to_300_s(version: str) -> None:
    (limit,) = step_limit.step_limits(version, "mp", {})
    assert (limit.variable, limit.default_s) == ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300)
    assert f"vLLM {version}'s multiprocessing executor" in limit.where
    assert "multiproc_executor.py" in limit.where
    assert step_limit.step_limits(version, "uni", {}) == ()  # one process: no limit
    # Ray runs RayExecutorV2, a multiprocessing executor, unless switched off where it can be
    (ray,) = step_limit.step_limits(version, "ray", {})
    assert ray.variable == "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
    (ray_v1,) = step_limit.step_limits(version, "ray", {step_limit.RAY_V2_SWITCH: "0"})
    facts = vllm_releases.row_for(version)
    if facts.ray_cgraph_get_timeout_s is None:  # 0.33.0 on: the compiled-graph executor is gone
        assert ray_v1.variable == "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
    else:
        assert (ray_v1.variable, ray_v1.default_s) == ("RAY_CGRAPH_get_timeout", 300)
        assert "ray_executor.py:" in ray_v1.where


def test_a_version_between_or_outside_the_table() -> None:
    assert "vLLM 0.32.0's" in step_limit.step_limits("0.32.0+cpu", "mp", {})[0].where
    assert "vLLM 0.30.0's" in step_limit.step_limits("0.30.1", "mp", {})[0].where
    assert "version unknown" in step_limit.step_limits("0.5.0.post1", "mp", {})[0].where
    unknown = step_limit.step_limits(None, "ray", {})
    assert {limit.variable for limit in unknown} == {
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
        "RAY_CGRAPH_get_timeout",
    }


def test_the_limit_is_raised_only_where_a_step_exceeds_it_and_never_over_the_users() -> None:
    (limit,) = step_limit.step_limits("0.25.1", "mp", {})
    within = step_limit.decide((limit,), 19.9, 3.0, {})
    assert within.env == {} and "holds the longest planned step (19.9 s)" in within.said[0]
    raised = step_limit.decide((limit,), 317.5, 3.0, {})
    assert raised.env == {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "953"}
    assert "raised to 953 s" in raised.said[0] and "multiproc_executor.py" in raised.said[0]
    given = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": ("120", "profile p's [serving.env]")}
    kept = step_limit.decide((limit,), 317.5, 3.0, given)
    assert kept.env == {} and len(kept.warnings) == 1
    assert "=120 (profile p's [serving.env]) is below the longest planned step" in kept.warnings[0]
    enough = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": ("3600", "this session's environment")}
    assert step_limit.decide((limit,), 317.5, 3.0, enough).warnings == ()


# -- what --longctx-plan says -----------------------------------------------------------------


def plan(pytester: pytest.Pytester, *args: str) -> str:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", *args)
    assert result.ret == 0, result.stdout.str()
    return result.stdout.str()


def budget_line(out: str, size: str) -> tuple[float, str]:
    match = re.search(rf"^  {size}: ([\d,]+) s \([^)]*\): (.*)$", out, re.MULTILINE)
    assert match, out
    return float(match.group(1).replace(",", "")), match.group(2)


def test_the_plan_prints_64mis_budget_from_the_expected_ttft_with_from_64mi(
    pytester: pytest.Pytester,
) -> None:
    out = plan(pytester, "--longctx-profile=kimi-linear-mi355x", "--longctx-from=64Mi")
    seconds, why = budget_line(out, "64Mi")
    assert seconds >= 3 * STUDY_64MI_TTFT_S * 0.95
    assert why.startswith(
        "predicted: the TTFT model of profile kimi-linear-mi355x's expected_ttft predicts"
    )
    assert "the TTFT model of profile kimi-linear-mi355x's expected_ttft: TTFT ≈ " in out
    # the study's default chunk of 16,384 tokens at 64Mi: about 20 s, within vLLM's 300 s
    # vLLM 0.25.1 (the profile's pin) chunks by 8,192 tokens on any device from 70 GiB
    step = re.search(r"longest planned engine step: ([\d.]+) s, the last 8,192-token", out)
    assert step and 5 < float(step.group(1)) < 20, out
    assert "under vLLM 0.25.1 (pinned by the profile)" in out
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s unless set) holds" in out
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=" not in out  # the command leaves it alone


def test_the_plan_prints_budgets_from_a_resumed_runs_records(pytester: pytest.Pytester) -> None:
    run_dir = earlier_run(pytester, {MI: 17.0, 8 * MI: 700.0, 32 * MI: 9_000.0})
    out = plan(
        pytester,
        "--longctx-output=reports",
        f"--longctx-resume={run_dir.name}",
        "--longctx-profile=kimi-linear-mi355x",
        "--longctx-from=16Mi",
    )
    assert budget_line(out, "64Mi") == (
        108_000.0,
        "extrapolated: 32Mi took 9e+03 s (recorded in this run); x (64Mi/32Mi)^2 x 3 = 1.08e+05 s",
    )
    seconds, why = budget_line(out, "16Mi")
    assert seconds == pytest.approx(700.0 * 4 * 3, abs=1)
    assert why.startswith("extrapolated: 8Mi took 700 s (recorded in this run)")


def chunked_profile(pytester: pytest.Pytester, env: str = "") -> Path:
    """kimi-linear-mi355x with a 256Ki-token prefill chunk: its last step at 64Mi takes
    about 317 s at the study's speed, past vLLM's 300 s."""
    text = (PROFILE_DIR / "kimi-linear-mi355x.toml").read_text()
    chunk = 'extra_args = ["--max-num-batched-tokens", "262144"]\n'
    text = text.replace("max_num_seqs = 1\n", f"max_num_seqs = 1\n{chunk}")
    text = text.replace('config = "', f'config = "{PROFILE_DIR.parent / "data"}/')
    text = text.replace("[serving.env]\n", f"[serving.env]\n{env}")
    path = pytester.path / "chunked.toml"
    path.write_text(text)
    return path


def test_the_plan_raises_vllms_step_limit_where_the_longest_step_exceeds_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    out = plan(pytester, f"--longctx-profile={chunked_profile(pytester)}", "--longctx-from=64Mi")
    step = re.search(r"longest planned engine step: ([\d.]+) s, the last 262,144-token", out)
    assert step and float(step.group(1)) > 300, out
    raised = re.search(r"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS raised to (\d+) s", out)
    assert raised and int(raised.group(1)) > 3 * 300, out
    assert f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={raised.group(1)} " in out  # in the command


def test_attached_the_plan_names_the_step_limit_to_start_the_server_with(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is launched: the plan must not claim it raises the limit in an environment
    it never sets, but name the value the attached server needs."""
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    out = plan(
        pytester,
        f"--longctx-profile={chunked_profile(pytester)}",
        "--longctx-from=64Mi",
        "--longctx-url=http://127.0.0.1:9",
    )
    assert "raised to" not in out
    needed = re.search(
        r"attached, nothing is raised here: start the server with "
        r"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=(\d+) or more",
        out,
    )
    assert needed and int(needed.group(1)) > 3 * 300, out


@pytest.mark.parametrize("where", ["profile", "session"])
def test_the_plan_keeps_a_step_limit_the_user_set_and_warns(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    if where == "profile":
        profile = chunked_profile(pytester, 'VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS = "120"\n')
        said = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=120 (profile chunked's [serving.env])"
    else:
        profile = chunked_profile(pytester)
        monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "120")
        said = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=120 (this session's environment)"
    out = plan(pytester, f"--longctx-profile={profile}", "--longctx-from=64Mi")
    assert f"  WARNING: {said} is below the longest planned step" in out
    assert "raised to" not in out
    command = out.split("server command (port chosen at start):\n", 1)[1].splitlines()[0]
    assert ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=120 " in command) == (where == "profile")
