"""The shared statistics of records, on records made up here: what each point came to and in
which order the reports list it, the fidelity counts, the prompt lengths a summary names, and
the one way a mean and its spread are written."""

from __future__ import annotations

from pytest_longctx.core.records import Record
from pytest_longctx.core.stats import (
    answer_counts,
    format_mean_std,
    label_counts,
    outcome_label,
    summarize,
    unchecked_reasons,
)

KI = 1024


def record(
    repeat: int,
    outcome: str = "passed",
    failure_class: str | None = None,
    prompt_tokens: int | None = KI,
    fidelity: str | None = None,
) -> Record:
    return Record(
        run_id="run",
        nodeid=f"t[len=1Ki-rep={repeat}]",
        length=KI,
        repeat=repeat,
        outcome=outcome,
        figures={"ttft": 0.1} if outcome == "passed" else {},
        prompt_tokens=prompt_tokens,
        failure_class=failure_class,
        fidelity={"verdict": fidelity} if fidelity else {},
    )


def test_each_point_is_labelled_by_what_it_came_to() -> None:
    assert outcome_label(record(0)) == "passed"
    assert outcome_label(record(0, "failed", "oom")) == "oom"
    assert outcome_label(record(0, "skipped", "oom")) == "skipped (oom)"  # never ran
    assert outcome_label(record(0, "skipped")) == "skipped"  # the plan left it out
    assert outcome_label(record(0, "error")) == "error"


def test_labels_are_counted_passed_first_then_classes_then_outcomes() -> None:
    records = [
        record(0, "skipped"),
        record(1, "skipped", "start_failed"),
        record(2, "skipped", "oom"),
        record(3, "failed", "hang"),
        record(4, "failed", "oom"),
        record(5, "failed", "oom"),
        record(6),
        record(7, "interrupted"),
    ]
    counts = label_counts(records)
    # the classes in their order (an interrupted point's class is its outcome), then the
    # outcomes, a skip a failure caused after the plain ones
    assert list(counts.items()) == [
        ("passed", 1),
        ("hang", 1),
        ("oom", 2),
        ("interrupted", 1),
        ("skipped", 1),
        ("skipped (oom)", 1),
        ("skipped (start_failed)", 1),
    ]


def test_a_skip_a_failure_caused_comes_after_the_plain_skips_whatever_its_class() -> None:
    """Even a skip of the first class (``contract``), seen first: the plain skips lead."""
    records = [record(0, "skipped", "contract"), record(1, "skipped"), record(2, "skipped")]
    assert list(label_counts(records).items()) == [("skipped", 2), ("skipped (contract)", 1)]


def test_points_whose_answer_was_not_checked_are_counted_per_reason_in_the_order_seen() -> None:
    def unchecked(repeat: int, reason: str | None, verdict: str = "not_checked") -> Record:
        fidelity = {"verdict": verdict, **({"reason": reason} if reason else {})}
        return Record(run_id="run", nodeid=f"t[{repeat}]", length=KI, repeat=repeat,
                      outcome="passed", fidelity=fidelity)  # fmt: skip

    records = [
        unchecked(0, "the model did not answer the probe in the warm-ups"),
        unchecked(1, "no needle fits"),
        unchecked(2, "the model did not answer the probe in the warm-ups"),
        unchecked(3, None),
        unchecked(4, "a reason of a checked point", verdict="correct"),
        record(5, fidelity="wrong"),
    ]
    assert list(unchecked_reasons(records).items()) == [
        ("the model did not answer the probe in the warm-ups", 2),
        ("no needle fits", 1),
        ("no reason recorded", 1),
    ]
    assert unchecked_reasons([record(0, fidelity="correct")]) == {}


def test_answers_are_counted_per_verdict_zeros_left_out() -> None:
    records = [record(0, fidelity="correct"), record(1, fidelity="correct"), record(2)]
    records.append(record(3, fidelity="wrong"))
    assert answer_counts(records) == {"correct": 2, "wrong": 1}
    assert answer_counts([record(0)]) == {}


def test_a_summary_names_the_prompt_lengths_its_passed_points_had() -> None:
    records = [record(0, prompt_tokens=1030), record(1, prompt_tokens=None), record(2)]
    records.append(record(3, "failed", "oom", prompt_tokens=999))
    (summary,) = summarize(records)
    assert summary.prompt_tokens == (KI, 1030)
    assert summary.labels == {"passed": 3, "oom": 1}


def test_a_mean_and_its_spread_are_written_one_way() -> None:
    assert format_mean_std(0.67, 0.01, 3, unit="s", count="n=3") == "0.670 ± 0.010 s (n=3)"
    assert format_mean_std(0.67, None, 3, unit="s") == "0.670 s"
    assert format_mean_std(40172.0, 12.5, 0, unit="tok/s") == "40,172 ± 12 tok/s"
    assert format_mean_std(40172.0, None, 0, grouped=False) == "40172"
    assert (
        format_mean_std(322.0, 15.0, 0, unit="tok/s", after_unit="between 4 sessions", count="n=8")
        == "322 ± 15 tok/s between 4 sessions (n=8)"
    )
