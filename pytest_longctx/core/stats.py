"""Per-length summaries over repeats: what every report prints, computed in one place.

A summary reads only :class:`~pytest_longctx.core.records.Record` objects, so the same numbers come
out of a live session, a run killed half-way and a campaign merged from several days.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_longctx.core.records import FAILURE_CLASSES, FIGURE_UNITS, OUTCOMES, Record

DEFAULT_FIGURES: tuple[str, ...] = ("ttft", "decode_throughput")


@dataclass(frozen=True)
class FigureSummary:
    """One figure at one length, over the passed repeats that carry it.

    ``std`` is the sample standard deviation (divisor n - 1), the spread the study reports as
    "mean ± stddev" over its three passes. With a single value there is no spread to estimate;
    ``std`` is then 0.0 rather than undefined, so tables stay printable. ``cv`` (std / mean) is
    None when the mean is 0, where the ratio has no meaning.
    """

    name: str
    unit: str
    values: tuple[float, ...]
    mean: float
    std: float
    cv: float | None
    min: float
    max: float

    @property
    def n(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class LengthSummary:
    """Everything measured at one prompt length, across repeats and runs."""

    length: int
    #: Count of every outcome in :data:`~pytest_longctx.core.records.OUTCOMES`, zeros included.
    outcomes: Mapping[str, int]
    figures: Mapping[str, FigureSummary] = field(default_factory=dict)
    #: Records that did not pass, in the order they were written, for "why" lists.
    non_passed: tuple[Record, ...] = ()
    #: Distinct prompt token counts the server reported for passed records.
    prompt_tokens: tuple[int, ...] = ()
    run_ids: tuple[str, ...] = ()
    #: Points by what they came to: ``passed``, their failure class, ``skipped (class)`` for
    #: a skip a failure caused, or their outcome when they carry no class (a skip the plan
    #: decided), in :func:`label_counts` order.
    labels: Mapping[str, int] = field(default_factory=dict)
    #: Points per fidelity verdict (``correct``, ``wrong``, ``not_checked``), of the points
    #: that carry one.
    answers: Mapping[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Passed repeats: the sample size behind every mean in the row."""
        return self.outcomes.get("passed", 0)

    def figure(self, name: str) -> FigureSummary | None:
        return self.figures.get(name)


def format_mean_std(
    mean: float,
    std: float | None,
    decimals: int,
    *,
    unit: str = "",
    after_unit: str = "",
    count: str | None = None,
    grouped: bool = True,
) -> str:
    """The one way a mean and its spread are written: ``0.670 ± 0.010 s (n=3)``.

    ``std`` None (one sample has no spread) prints the mean alone; ``after_unit`` follows the
    unit (``between 4 sessions``), ``count`` goes in parentheses; ``grouped`` puts thousands
    separators in (``40,172``). Each report decides its decimals; the form is shared.
    """
    spec = f",.{decimals}f" if grouped else f".{decimals}f"
    text = format(mean, spec)
    if std is not None:
        text += " ± " + format(std, spec)
    if unit:
        text += f" {unit}"
    if after_unit:
        text += f" {after_unit}"
    if count:
        text += f" ({count})"
    return text


def summarize_values(name: str, values: Sequence[float]) -> FigureSummary:
    """Mean, sample std (0.0 for one value), CV, min and max of a non-empty sample."""
    if not values:
        raise ValueError(f"figure {name!r} has no values to summarize")
    count = len(values)
    mean = math.fsum(values) / count
    if count > 1:
        variance = math.fsum((value - mean) ** 2 for value in values) / (count - 1)
        std = math.sqrt(variance)
    else:
        std = 0.0
    return FigureSummary(
        name=name,
        unit=FIGURE_UNITS.get(name, ""),
        values=tuple(values),
        mean=mean,
        std=std,
        cv=std / mean if mean != 0 else None,
        min=min(values),
        max=max(values),
    )


def outcome_label(record: Record) -> str:
    """``passed``, or why not: the failure class, else the outcome. A skip a failure caused
    reads ``skipped (oom)``: the point never ran, so it is not counted as one more crash."""
    if record.outcome == "passed":
        return "passed"
    if record.outcome == "skipped" and record.failure_class:
        return f"skipped ({record.failure_class})"
    return record.failure_class or record.outcome


def _label_order(label: str) -> tuple[int, int]:
    order = ["passed", *FAILURE_CLASSES, *OUTCOMES]
    outcome, _, klass = label.partition(" (")
    return order.index(outcome), order.index(klass[:-1]) + 1 if klass else 0


def label_counts(records: Iterable[Record]) -> dict[str, int]:
    """Points per :func:`outcome_label`, passed first, then the classes in their order, then
    the outcomes (a classed skip after the plain ones)."""
    counts: dict[str, int] = {}
    for record in records:
        label = outcome_label(record)
        counts[label] = counts.get(label, 0) + 1
    return {label: counts[label] for label in sorted(counts, key=_label_order)}


def latest_records(records: Iterable[Record]) -> list[Record]:
    """One record per (run_id, length, repeat, question, workload, level): the last one
    written.

    A resumed run re-measures a point that failed or never finished; its newer line is the
    answer for that point, the older one is history. A warm follow-up is a point of its own,
    and so are an interference point and each concurrency level.
    """
    latest: dict[tuple[str, int, int, int, str, int], tuple[int, Record]] = {}
    for position, record in enumerate(records):
        key = (
            record.run_id,
            record.length,
            record.repeat,
            record.question,
            record.cache_state,
            record.concurrency_level,
        )
        latest[key] = (position, record)
    return [record for _, record in sorted(latest.values(), key=lambda item: item[0])]


def summarize(
    records: Iterable[Record], figures: Sequence[str] = DEFAULT_FIGURES, cache_state: str = "cold"
) -> list[LengthSummary]:
    """Per-length summaries sorted by length; repeats of every run count as one sample.

    Only points of one ``cache_state``: a warm follow-up's TTFT is not a cold prefill's."""
    by_length: dict[int, list[Record]] = {}
    for record in latest_records(records):
        if record.cache_state == cache_state:
            by_length.setdefault(record.length, []).append(record)

    summaries = []
    for length in sorted(by_length):
        group = by_length[length]
        passed = [record for record in group if record.outcome == "passed"]
        outcomes = {outcome: 0 for outcome in OUTCOMES}
        for record in group:
            outcomes[record.outcome] = outcomes.get(record.outcome, 0) + 1
        figure_summaries = {}
        for name in figures:
            values = [record.figures[name] for record in passed if name in record.figures]
            if values:
                figure_summaries[name] = summarize_values(name, values)
        summaries.append(
            LengthSummary(
                length=length,
                outcomes=outcomes,
                figures=figure_summaries,
                non_passed=tuple(record for record in group if record.outcome != "passed"),
                prompt_tokens=tuple(
                    sorted({r.prompt_tokens for r in passed if r.prompt_tokens is not None})
                ),
                run_ids=tuple(dict.fromkeys(record.run_id for record in group)),
                labels=label_counts(group),
                answers=answer_counts(group),
            )
        )
    return summaries


#: The order of the fidelity verdicts in counts.
VERDICTS = ("correct", "wrong", "not_checked")


def answer_counts(records: Iterable[Record]) -> dict[str, int]:
    """Points per fidelity verdict, in :data:`VERDICTS` order, zeros left out."""
    counts = dict.fromkeys(VERDICTS, 0)
    for record in records:
        verdict = record.fidelity.get("verdict")
        if verdict in counts:
            counts[verdict] += 1
    return {verdict: count for verdict, count in counts.items() if count}


def unchecked_reasons(records: Iterable[Record]) -> dict[str, int]:
    """Points per reason their answer was not checked, in the order first seen: a reason the
    whole run shares (a model that did not answer the probe in the warm-ups) is said once."""
    reasons: dict[str, int] = {}
    for record in records:
        if record.fidelity.get("verdict") == "not_checked":
            reason = str(record.fidelity.get("reason") or "no reason recorded")
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons
