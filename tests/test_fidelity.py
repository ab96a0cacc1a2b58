"""The fidelity probe: every measured prompt carries a needle, every record a verdict.

The fake server answers the probe as the embedded tiny-llama does (the planted needle's token
first), or wrongly where a test says so: these tests are about what the plugin makes of an
answer (verdict, failure class, options, properties). That the embedded model answers on real
vLLM is tests/test_e2e_fidelity.py's.
"""

from __future__ import annotations

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import KEEP_BURSTS, SWEEP_TEST, fault_session


@pytest.fixture
def session(pytester: pytest.Pytester, fake_vllm: FakeVLLM):  # noqa: ANN201
    """Sessions that keep a burst (not what these tests are about), on a fake server."""
    run = fault_session(pytester, fake_vllm)
    return lambda *args, **changes: run(KEEP_BURSTS, *args, **changes)


def test_every_record_carries_a_correct_verdict_at_varied_depths(session) -> None:  # noqa: ANN001
    result, records = session("--longctx-to=4Ki", "--longctx-repeats=2")
    result.assert_outcomes(passed=6)
    verdicts = [r.fidelity for r in records]
    assert all(v["verdict"] == "correct" for v in verdicts), verdicts
    assert all(v["answer"] == v["expected"] and v["mode"] == "check" for v in verdicts)
    assert all(0.0 <= v["depth"] <= 1.0 for v in verdicts)
    assert len({v["depth"] for v in verdicts}) == len(verdicts)  # depths vary by point
    assert all(v["judged_by"] for v in verdicts)


def test_a_wrong_answer_at_one_length_fails_that_length_alone(session) -> None:  # noqa: ANN001
    result, records = session("--longctx-to=4Ki", wrong_at_lengths=(2048,))
    result.assert_outcomes(passed=2, failed=1)
    by_length = {r.length: r for r in records}
    wrong = by_length[2048]
    assert (wrong.outcome, wrong.failure_class) == ("failed", "wrong_answer")
    assert wrong.fidelity["verdict"] == "wrong"
    expected, answer = wrong.fidelity["expected"], wrong.fidelity["answer"]
    assert answer != expected
    assert f"expected {expected}, answered {answer}" in wrong.reason
    assert wrong.figures["ttft"] > 0  # what was measured is kept with the failure
    for length in (1024, 4096):
        assert by_length[length].outcome == "passed"
        assert by_length[length].fidelity["verdict"] == "correct"


def test_record_keeps_a_wrong_answer_passed(session) -> None:  # noqa: ANN001
    result, records = session("--longctx-to=2Ki", "--longctx-fidelity=record", answers="random")
    result.assert_outcomes(passed=2)
    assert [r.fidelity["verdict"] for r in records] == ["wrong", "wrong"]
    assert {r.fidelity["mode"] for r in records} == {"record"}
    assert all(r.fidelity["answer"] is None for r in records)  # " tok tok": no digits at all


def test_a_model_that_cannot_retrieve_fails_every_length(session) -> None:  # noqa: ANN001
    """The negative control: no accidental passes."""
    result, records = session("--longctx-to=4Ki", "--longctx-fidelity=check", answers="random")
    result.assert_outcomes(failed=3)
    assert {r.failure_class for r in records} == {"wrong_answer"}


def test_off_plants_no_probe(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", "--longctx-fidelity=off", answers="random")
    result.assert_outcomes(passed=1)
    assert records[0].fidelity == {"verdict": "not_checked", "reason": "--longctx-fidelity=off"}


def test_the_verdict_is_a_junit_property(session, pytester: pytest.Pytester) -> None:  # noqa: ANN001
    junit = pytester.path / "junit.xml"
    result, _ = session("-m", "len==1Ki", f"--junitxml={junit}")
    result.assert_outcomes(passed=1)
    assert '<property name="longctx_fidelity" value="correct"' in junit.read_text()


@pytest.mark.parametrize("where", ["option", "ini"])
def test_a_bad_mode_is_a_usage_error_naming_the_forms(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM, where: str
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    if where == "ini":
        pytester.makeini("[pytest]\nlongctx_fidelity = strict\n")
    args = ["--longctx-fidelity=strict"] if where == "option" else []
    result = pytester.runpytest(f"--longctx-url={fake_vllm.url}", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--longctx-fidelity=strict: expected 'auto' or 'check' or 'record' or 'off'*"]
    )
