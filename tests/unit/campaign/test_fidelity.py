"""The fidelity probe: every measured prompt carries a needle, every record a verdict.

The fake server answers the probe as the embedded tiny-llama does (the planted needle's token
first), or wrongly where a test says so: these tests are about what the plugin makes of an
answer (verdict, failure class, options, properties). That the embedded model answers on real
vLLM is tests/e2e/test_e2e_fidelity.py's.
"""

from __future__ import annotations

import json

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import SWEEP_TEST, fault_session, run_folder


@pytest.fixture
def session(pytester: pytest.Pytester, fake_vllm: FakeVLLM):  # noqa: ANN201
    """Sessions on a fake server (a burst keeps the server's figure, as by default)."""
    return fault_session(pytester, fake_vllm)


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
    result.stdout.fnmatch_lines(["fidelity: 1 wrong answer(s) of 3 point(s) (2 correct, 1 wrong)"])


def test_record_keeps_a_wrong_answer_passed_and_reported(
    session,  # noqa: ANN001
    pytester: pytest.Pytester,
) -> None:
    result, records = session("--longctx-to=2Ki", "--longctx-fidelity=record", answers="random")
    result.assert_outcomes(passed=2)
    assert [r.fidelity["verdict"] for r in records] == ["wrong", "wrong"]
    assert {r.fidelity["mode"] for r in records} == {"record"}
    assert all(r.fidelity["answer"] is None for r in records)  # " tok tok": no digits at all
    folder = run_folder(pytester.path / "reports")
    markdown = (folder / "report.md").read_text()
    assert "| answers |" in markdown and "| 1 wrong |" in markdown
    depth_map = markdown.split("## Answers by length and needle depth")[1].split("\n## ")[0]
    rows = [line for line in depth_map.splitlines() if line.startswith(("| 1Ki", "| 2Ki"))]
    assert len(rows) == 2 and all(row.count("✗") == 1 and "✓" not in row for row in rows)
    entries = json.loads((folder / "benchmark.json").read_text())["benchmarks"]
    ttft = [e for e in entries if e["extra_info"]["metric"] == "ttft"]
    assert [e["extra_info"]["answers"] for e in ttft] == [{"wrong": 1}, {"wrong": 1}]
    rounds = [r for e in ttft for r in e["extra_info"]["rounds"]]
    assert [r["fidelity"]["verdict"] for r in rounds] == ["wrong", "wrong"]


def test_a_model_that_cannot_retrieve_fails_every_length(session) -> None:  # noqa: ANN001
    """The negative control: no accidental passes."""
    result, records = session("--longctx-to=4Ki", "--longctx-fidelity=check", answers="random")
    result.assert_outcomes(failed=3)
    assert {r.failure_class for r in records} == {"wrong_answer"}


def test_auto_keeps_every_point_of_a_model_that_does_not_answer_in_the_warm_ups(
    session,  # noqa: ANN001
    fake_vllm: FakeVLLM,
    pytester: pytest.Pytester,
) -> None:
    """A model that answers nothing from its first request on (a base model, another prompt
    convention, random weights): the default mode learns it from the warm-ups, before any
    point, and keeps every point with its figures, the answer recorded and the reason said once
    in the summary and the report."""
    fake_vllm.configure(answers="random")
    result, records = session("--longctx-to=4Ki")
    result.assert_outcomes(passed=3)
    assert {r.fidelity["verdict"] for r in records} == {"not_checked"}
    assert {r.fidelity["answered"] for r in records} == {"wrong"}  # what came back, recorded
    assert all(r.figures["ttft"] > 0 and r.fidelity["expected"] for r in records)
    (reason,) = {r.fidelity["reason"] for r in records}
    assert reason.startswith(
        "the served model fake-model did not answer the fidelity probe in the warm-up at 1Ki "
        "tokens (0 of 3 right; expected "
    )
    assert reason.endswith(
        f"(completion {' tok' * 10!r})): its answers are recorded, not checked "
        "(--longctx-fidelity=check checks them)"
    )
    output = result.stdout.str()
    assert "fidelity: 0 wrong answer(s) of 3 point(s) (3 not checked)" in output
    assert output.count(reason) == 1
    assert f"fidelity not checked at 3 point(s): {reason}" in output
    markdown = (run_folder(pytester.path / "reports") / "report.md").read_text()
    assert markdown.count(reason) == 1 and f"- Not checked at 3 point(s): {reason}" in markdown


def test_check_fails_every_point_of_a_model_that_does_not_answer(
    session,  # noqa: ANN001
    fake_vllm: FakeVLLM,
) -> None:
    fake_vllm.configure(answers="random")
    result, records = session("--longctx-to=4Ki", "--longctx-fidelity=check")
    result.assert_outcomes(failed=3)
    assert {r.failure_class for r in records} == {"wrong_answer"}
    assert all(r.figures["ttft"] > 0 for r in records)


@pytest.mark.parametrize(("decode", "answered"), [(96, "correct"), (48, "not_checked")])
def test_a_reasoning_model_is_judged_by_the_answer_after_its_thinking(
    session,  # noqa: ANN001
    fake_vllm: FakeVLLM,
    decode: int,
    answered: str,
) -> None:
    """A model that thinks for 70 tokens (about 280 characters) before it answers. With a decode
    length that holds its thinking, its answer is read after it, in the warm-ups (asked again
    with that length to think in) and at every point; with one that does not, it never answers
    within the budget and its answers are not checked."""
    fake_vllm.configure(thinking_tokens=70)
    result, records = session("--longctx-to=2Ki", f"--longctx-decode-tokens={decode}")
    result.assert_outcomes(passed=2)
    verdicts = [r.fidelity for r in records]
    if answered == "correct":
        assert all(v["verdict"] == "correct" and v["answer"] == v["expected"] for v in verdicts)
        assert all(v["reasoning_chars"] > 200 for v in verdicts), verdicts
        assert all(v["completion"].startswith("<|needle-") for v in verdicts)
    else:
        assert {v["verdict"] for v in verdicts} == {"not_checked"}
        (reason,) = {v["reason"] for v in verdicts}
        assert "did not answer the fidelity probe in the warm-up" in reason
        assert "still reasoning when the completion ended" in reason


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


def test_the_plan_shows_the_probe_and_which_lengths_are_checked(pytester: pytest.Pytester) -> None:
    """A GPU profile's plan, on a machine without its GPU or its tokenizer: the pass key in
    words, and the lengths beyond the model's advertised context (1Mi) recorded only."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "--longctx-plan", "--longctx-profile=kimi-linear-h200", "--longctx-from=512Ki",
        "--longctx-to=2Mi",
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        [
            "fidelity probe (text): *the needle 'The pass key of Alice is * at a depth *"
            "and ends with the question 'What is the pass key of Alice? The pass key of Alice "
            "is'*",
            "fidelity --longctx-fidelity=auto (the model's advertised context is 1Mi tokens): "
            "checked 512Ki, 1Mi; recorded only 2Mi",
            "fidelity auto: the 3 warm-up(s) at 1Ki tokens carry the probe; a served model that "
            "does not answer it there has every point's answer recorded as not_checked, *",
            "needle depths: len=512Ki-rep=0 0, len=1Mi-rep=0 0.5, len=2Mi-rep=0 1",
        ]
    )
