"""The fidelity probe: every measured prompt carries a needle, every record a verdict.

The fake server answers the probe as the embedded tiny-llama does (the planted needle's token
first), or wrongly where a test says so: these tests are about what the plugin makes of an
answer (verdict, failure class, options, properties). That the embedded model answers on real
vLLM is tests/test_e2e_fidelity.py's.
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
            "needle depths: len=512Ki-rep=0 0, len=1Mi-rep=0 0.5, len=2Mi-rep=0 1",
        ]
    )
