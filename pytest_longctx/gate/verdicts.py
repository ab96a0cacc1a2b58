"""The verdict per length and metric: beyond both the tolerance and the noise."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.records import (
    Record,
)
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import (
    answer_counts,
    format_mean_std,
    latest_records,
    summarize_values,
)

from .noise import (
    DEFAULT_LEVEL,
    PERCENT_SLACK,
    NoiseTest,
    sample_mean,
    sample_variance,
    session_test,
    welch_test,
)
from .tolerances import METRICS, Tolerances

#: ``insufficient``: a gated figure one side (or both) lacks, which fails the length: a
#: verdict never passes a figure it could not compare.
VERDICT_STATUSES = ("ok", "regressed", "improved", "insufficient")
LENGTH_STATUSES = (*VERDICT_STATUSES, "missing_in_current", "missing_in_baseline")

WITHIN_ONLY = "one-session baseline: within-session noise only"
#: The verdict on a length's answers to the probe (regressed when the baseline's were all
#: right and some are wrong now): a metric of its own, beside the figures of :data:`METRICS`.
ANSWERS_METRIC = "fidelity"


@dataclass(frozen=True)
class Stats:
    """One side's figures at one length.

    With one session, ``mean`` and ``std`` are over its repeats (``std`` None with a single
    sample). With several (the baseline of a history), ``mean`` is the mean of the per-session
    means and ``std`` their spread: the between-session noise.
    """

    n: int
    mean: float
    std: float | None
    sessions: int = 1

    @classmethod
    def of(cls, name: str, values: list[float]) -> Stats:
        summary = summarize_values(name, values)
        return cls(n=summary.n, mean=summary.mean, std=summary.std if summary.n > 1 else None)

    @classmethod
    def of_sessions(cls, groups: Sequence[Sequence[float]]) -> Stats:
        groups = [values for values in groups if values]
        if len(groups) == 1:
            return cls.of("", list(groups[0]))
        means = [sample_mean(values) for values in groups]
        return cls(
            n=sum(len(values) for values in groups),
            mean=sample_mean(means),
            std=math.sqrt(sample_variance(means)),
            sessions=len(groups),
        )


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    length: int
    status: str  # one of VERDICT_STATUSES
    baseline: Stats | None
    current: Stats | None
    #: Signed relative change of the mean, current vs baseline (+ is up, whatever is worse).
    change_pct: float | None
    tolerance_pct: float
    #: The noise test; None when a side has a single sample (tolerance alone decides).
    test: NoiseTest | None
    level: float
    message: str
    #: Whose figures the verdict compared where not all were the streams' own: a decode
    #: verdict's (``decode figures: this run's from the server at 2 of 3 points ...``), an ITL
    #: verdict judged on the server's per-request mean ITL, a stall verdict whose side had
    #: background figures set aside; else empty.
    sources: str = ""

    @property
    def noise(self) -> str:
        """``between-session``, ``within-session`` or ``tolerance-only``."""
        return self.test.model if self.test is not None else "tolerance-only"


@dataclass(frozen=True)
class LengthVerdict:
    length: int
    status: str  # one of LENGTH_STATUSES
    verdicts: tuple[MetricVerdict, ...] = ()
    #: Why a length has no metric verdicts (one-sided, or nothing gated).
    note: str = ""

    @property
    def regressed(self) -> bool:
        return self.status == "regressed"

    @property
    def message(self) -> str:
        """Regressions first, then the rest: what a failing test item shows."""
        if not self.verdicts:
            return self.note
        order = {"regressed": 0, "insufficient": 1, "improved": 2, "ok": 3}
        ranked = sorted(self.verdicts, key=lambda verdict: order[verdict.status])
        return "\n".join(verdict.message for verdict in ranked)


@dataclass(frozen=True)
class GateReport:
    lengths: tuple[LengthVerdict, ...]  # every length on either side, ascending
    tolerances: Tolerances
    #: Non-fatal trouble while reading, e.g. corrupt baseline lines.
    problems: tuple[str, ...] = ()
    level: float = DEFAULT_LEVEL
    #: Sessions (run ids) among the baseline's passed records.
    baseline_sessions: int = 1

    def for_length(self, length: int) -> LengthVerdict | None:
        return next((verdict for verdict in self.lengths if verdict.length == length), None)

    @property
    def regressed(self) -> tuple[LengthVerdict, ...]:
        return self._with_status("regressed")

    @property
    def improved(self) -> tuple[LengthVerdict, ...]:
        return self._with_status("improved")

    @property
    def missing_in_current(self) -> tuple[int, ...]:
        return tuple(verdict.length for verdict in self._with_status("missing_in_current"))

    @property
    def missing_in_baseline(self) -> tuple[int, ...]:
        return tuple(verdict.length for verdict in self._with_status("missing_in_baseline"))

    @property
    def passed(self) -> bool:
        return not self.regressed

    def _with_status(self, status: str) -> tuple[LengthVerdict, ...]:
        return tuple(verdict for verdict in self.lengths if verdict.status == status)

    def summary_lines(self) -> list[str]:
        """A headline, then every finding that is not plain ok, then the problems."""

        def sizes(lengths: Iterable[int]) -> str:
            return ", ".join(format_size(length) for length in lengths)

        compared = [v for v in self.lengths if not v.status.startswith("missing")]
        headline = (
            f"regression gate ({self.tolerances.describe()}, level {self.level:g}, "
            f"{noise_model_words(self.baseline_sessions)}): "
        )
        if self.regressed:
            headline += (
                f"{len(self.regressed)} of {len(compared)} lengths regressed "
                f"({sizes(v.length for v in self.regressed)})"
            )
        else:
            headline += f"no regression over {len(compared)} lengths"
        lines = [headline]
        for verdict in self.lengths:
            if not verdict.verdicts:
                if verdict.status != "ok":
                    lines.append(verdict.note)
                continue
            lines.extend(v.message for v in verdict.verdicts if v.status != "ok")
        lines.extend(self.problems)
        return lines


def noise_model_words(sessions: int) -> str:
    """How the gate estimates noise for a baseline of ``sessions`` sessions."""
    if sessions >= 2:
        return f"{sessions} baseline sessions: between-session noise"
    return WITHIN_ONLY


def session_key(record: Record) -> tuple[str, int]:
    """The server start a record was measured on: (run id, start number).

    Repeats measured on one server start share its state; a relaunch after a crash is a new
    start, so its repeats spread like another session's, and the noise model counts it as one.
    """
    index = record.server_start.get("index") if record.server_start else None
    return record.run_id, index if isinstance(index, int) else 0


def session_count(records: Iterable[Record]) -> int:
    """Distinct server starts (sessions, and relaunches within them) among passed records."""
    return len({session_key(record) for record in records if record.outcome == "passed"})


def compare(
    baseline: Iterable[Record],
    current: Iterable[Record],
    tolerances: Tolerances | None = None,
    *,
    level: float = DEFAULT_LEVEL,
    problems: Iterable[str] = (),
) -> GateReport:
    """Verdicts for every length either side measured.

    Only passed records count, and a point re-measured by a resumed run counts once (its latest
    record), as in every other report.
    """
    tolerances = tolerances or Tolerances()
    baseline_list = latest_records(baseline)
    baseline_by_length = passed_by_length(baseline_list)
    current_list = latest_records(current)
    current_by_length = passed_by_length(current_list)
    attempted = Counter(record.length for record in current_list)
    lengths = sorted(set(baseline_by_length) | set(current_by_length))
    verdicts = tuple(
        _with_answers(
            _judge_length(
                length,
                baseline_by_length.get(length, []),
                current_by_length.get(length, []),
                attempted[length],
                tolerances,
                level,
            ),
            [r for r in baseline_list if r.length == length],
            [r for r in current_list if r.length == length],
            level,
        )
        for length in lengths
    )
    return GateReport(
        lengths=verdicts,
        tolerances=tolerances,
        problems=tuple(problems),
        level=level,
        baseline_sessions=session_count(baseline_list),
    )


def compare_length(
    baseline: Iterable[Record],
    current: Iterable[Record],
    length: int,
    tolerances: Tolerances | None = None,
    *,
    level: float = DEFAULT_LEVEL,
) -> LengthVerdict:
    """The verdict at one length: what the per-length test item reports after its repeats."""
    current_here = [record for record in latest_records(current) if record.length == length]
    baseline_here = [record for record in latest_records(baseline) if record.length == length]
    verdict = _judge_length(
        length,
        [r for r in baseline_here if r.outcome == "passed"],
        [r for r in current_here if r.outcome == "passed"],
        len(current_here),
        tolerances or Tolerances(),
        level,
    )
    return _with_answers(verdict, baseline_here, current_here, level)


def _with_answers(
    verdict: LengthVerdict, baseline: list[Record], current: list[Record], level: float
) -> LengthVerdict:
    """``verdict``, regressed when the length's answers were all right in the baseline and
    some are wrong now (any outcome: a wrong answer fails its point under
    ``--longctx-fidelity=check``)."""
    before = answer_counts(baseline)
    now = answer_counts(current)
    if not before.get("correct") or before.get("wrong") or not now.get("wrong"):
        return verdict
    wrong = [r for r in current if r.fidelity.get("verdict") == "wrong"]
    examples = "; ".join(
        f"expected {r.fidelity.get('expected')}, answered {r.fidelity.get('answer')}"
        for r in wrong[:3]
    )
    answers = MetricVerdict(
        metric=ANSWERS_METRIC,
        length=verdict.length,
        status="regressed",
        baseline=None,
        current=None,
        change_pct=None,
        tolerance_pct=0.0,
        test=None,
        level=level,
        message=(
            f"{format_size(verdict.length)} fidelity: regressed, {now['wrong']} of "
            f"{sum(now.values())} answers wrong now, all {before['correct']} right in the "
            f"baseline ({examples})"
        ),
    )
    return LengthVerdict(verdict.length, "regressed", (answers, *verdict.verdicts), verdict.note)


def passed_by_length(records: Iterable[Record]) -> dict[int, list[Record]]:
    """The passed records by length: what a verdict and a calibration compare."""
    grouped: dict[int, list[Record]] = {}
    for record in records:
        if record.outcome == "passed":
            grouped.setdefault(record.length, []).append(record)
    return grouped


def _judge_length(
    length: int,
    baseline: list[Record],
    current: list[Record],
    attempted: int,
    tolerances: Tolerances,
    level: float = DEFAULT_LEVEL,
) -> LengthVerdict:
    size = format_size(length)
    if not baseline:
        now = "measured now" if current else "no passed point now either"
        return LengthVerdict(
            length,
            "missing_in_baseline",
            note=f"{size}: absent from the baseline ({now}); refresh the baseline to gate it",
        )
    if not current:
        why = f"{attempted} attempts, none passed" if attempted else "not measured"
        return LengthVerdict(
            length,
            "missing_in_current",
            note=f"{size}: in the baseline but not compared, this run has no passed point ({why})",
        )
    verdicts = []
    for metric in METRICS.values():
        tolerance = tolerances.for_metric(metric.name, length)
        if tolerance is None:
            continue
        if metric.per_level:
            verdicts += _judge_levels(metric, length, baseline, current, tolerance, level)
            continue
        verdict = _judge_metric(metric, length, baseline, current, tolerance, level)
        if verdict is not None:
            verdicts.append(verdict)
    statuses = {verdict.status for verdict in verdicts}
    if not verdicts:
        gated = any(tolerances.for_metric(name, length) is not None for name in METRICS)
        note = f"{size}: no gated figure on either side" if gated else f"{size}: not gated"
        return LengthVerdict(length, "insufficient" if gated else "ok", note=note)
    for status in ("regressed", "insufficient", "improved"):
        if status in statuses:
            return LengthVerdict(length, status, tuple(verdicts))
    return LengthVerdict(length, "ok", tuple(verdicts))


def _figure_values(records: list[Record], figure: str) -> list[float]:
    values = (record.figure(figure) for record in records)
    return [float(value) for value in values if value is not None and math.isfinite(value)]


def session_values(records: list[Record], figure: str) -> list[list[float]]:
    """The figure's values grouped by server start (:func:`session_key`), in the order they
    first appear."""
    by_session: dict[tuple[str, int], list[Record]] = {}
    for record in records:
        by_session.setdefault(session_key(record), []).append(record)
    groups = [_figure_values(group, figure) for group in by_session.values()]
    return [values for values in groups if values]


def _judge_levels(
    metric: Metric,
    length: int,
    baseline: list[Record],
    current: list[Record],
    tolerance: float,
    level: float,
) -> list[MetricVerdict]:
    """A concurrency metric at each level both sides measured: a level's aggregate is
    compared with the same level's, never with another's."""
    both = {r.concurrency_level for r in baseline} & {r.concurrency_level for r in current}
    verdicts = []
    for requests in sorted(both - {0}):
        named = dataclasses.replace(metric, label=f"{metric.label} of {requests} at once")
        verdict = _judge_metric(
            named,
            length,
            [r for r in baseline if r.concurrency_level == requests],
            [r for r in current if r.concurrency_level == requests],
            tolerance,
            level,
        )
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def _judge_metric(
    metric: Metric,
    length: int,
    baseline_records: list[Record],
    current_records: list[Record],
    tolerance: float,
    level: float = DEFAULT_LEVEL,
) -> MetricVerdict | None:
    baseline_records = [r for r in baseline_records if r.cache_state == metric.cache_state]
    current_records = [r for r in current_records if r.cache_state == metric.cache_state]
    if metric.optional and not (baseline_records and current_records):
        return None  # warm points are gated only where both sides measured them
    sources = ""
    if metric.figure in STREAM_GAP_METRICS:
        metric, sources = _per_token_metric(metric, baseline_records, current_records)
    before_groups = session_values(baseline_records, metric.figure)
    after_values = _figure_values(current_records, metric.figure)
    set_aside = _set_aside(metric, baseline_records, current_records)
    if not before_groups and not after_values and set_aside is None:
        return None  # neither side records it: nothing to judge (e.g. a prefill-only profile)
    where = f"{metric.label} at {format_size(length)}"
    before = Stats.of_sessions(before_groups) if before_groups else None
    after = Stats.of(metric.figure, after_values) if after_values else None
    if metric.is_decode:
        sources = _decode_sources(baseline_records, current_records)
    elif metric.figure == BACKGROUND_GAP_METRIC:
        sources = _background_sources(baseline_records, current_records)

    def verdict(status: str, message: str, **figures: Any) -> MetricVerdict:
        return MetricVerdict(
            metric=metric.name,
            length=length,
            status=status,
            baseline=before,
            current=after,
            change_pct=figures.get("change_pct"),
            tolerance_pct=tolerance,
            test=figures.get("test"),
            level=level,
            message=message,
            sources=sources,
        )

    missing = _why_not_compared(metric, before, after)
    if missing is not None and set_aside is not None:
        missing = set_aside
    said = f"; {sources}" if sources else ""
    if missing is not None or before is None or after is None:
        return verdict("insufficient", f"{where}: not compared, {missing}{said}")
    worse_sign = 1.0 if metric.higher_is_worse else -1.0
    test = _noise_test_for(before_groups, after_values, before, after, worse_sign)
    change_pct = 100.0 * (after.mean - before.mean) / before.mean
    status, message = _status_and_message(
        metric, where, before, after, change_pct, tolerance, test, level
    )
    return verdict(status, message + said, change_pct=change_pct, test=test)


#: Gated figures read from the stream's per-token gaps: a point whose stream did not show the
#: server's decode keeps them only as ``stream_*``.
STREAM_GAP_METRICS = frozenset({"itl_median"})
#: The server's own mean inter-token latency of each request (vLLM's per-request metrics,
#: the record's ``server_timing``): what ITL is judged on where a side's streams show no
#: per-token gap. A mean, never compared with a stream's median.
SERVER_ITL_FIGURE = "server_request_itl"
SERVER_ITL_LABEL = "the server's mean inter-token latency per request"
#: The stall metric's figure: the background streams' gaps, which a point whose gaps the
#: server's figures refuted sets aside (workloads/interference/under_load.py).
BACKGROUND_GAP_METRIC = "bg_itl_prefill_p99"
PER_REQUEST_HINT = "vLLM's --enable-per-request-metrics, which a launched server gets"


def _sides(baseline: list[Record], current: list[Record]) -> dict[str, list[Record]]:
    return {"the baseline": baseline, "this run": current}


def _has(records: list[Record], figure: str) -> bool:
    return bool(_figure_values(records, figure))


def _per_token_metric(
    metric: Metric, baseline: list[Record], current: list[Record]
) -> tuple[Metric, str]:
    """The ITL metric on the per-token figure both sides have: the streams' gaps, else the
    server's own mean ITL per request (a stream merged, burst or chunked has no gap of one
    token, and vLLM timed every token of it); the metric as it is where neither is on both
    sides, and what was compared where it is the server's."""
    if _has(baseline, metric.figure) and _has(current, metric.figure):
        return metric, ""
    if not (_has(baseline, SERVER_ITL_FIGURE) and _has(current, SERVER_ITL_FIGURE)):
        return metric, ""
    server = dataclasses.replace(metric, figure=SERVER_ITL_FIGURE, label=SERVER_ITL_LABEL)
    why = _gapless_words(baseline, current)
    return server, (
        "judged on the server's own mean inter-token latency per request (vLLM's per-request "
        f"metrics) on both sides{': ' + why if why else ''}"
    )


def _gapless(record: Record) -> str | None:
    """Why a point's stream has no per-token gap figure: in bursts (or off the server's
    decode), merged into chunks of several tokens at stream interval 1, or streamed in
    chunks of several tokens; None where it has one, or has no decode to time."""
    if record.figure("itl_median") is not None:
        return None
    if _burst(record):
        return "in bursts, off the server's decode"
    if _merged(record):
        return (
            "merged into chunks of several tokens at a stream interval of 1, the stream "
            "behind the server"
        )
    if _chunked(record):
        interval = record.stream.get("stream_interval") or "unknown"
        return f"in chunks of several tokens (stream interval {interval})"
    return None


def _gapless_words(baseline: list[Record], current: list[Record]) -> str:
    """``this run's streams showed no per-token gap at 3 of 3 points (merged ...)``: each
    side whose streams lack gaps somewhere, and why; sides alike are said once."""
    said: dict[tuple[int, int, str], list[str]] = {}
    for side, records in _sides(baseline, current).items():
        reasons = [why for why in map(_gapless, records) if why is not None]
        if reasons:
            key = (len(reasons), len(records), "; ".join(sorted(set(reasons))))
            said.setdefault(key, []).append(side.replace("the baseline", "the baseline's"))
    parts = []
    for (count, total, causes), sides in said.items():
        names = " and ".join(s.replace("this run", "this run's") for s in sides)
        each = " each" if len(sides) > 1 else ""
        parts.append(
            f"{names} streams showed no per-token gap at {count} of {total} points{each} ({causes})"
        )
    return "; ".join(parts)


def _set_aside(metric: Metric, baseline: list[Record], current: list[Record]) -> str | None:
    """Why a side has no figure of ``metric`` where its points were measured: no per-token
    figure from either source (ITL), its background figures set aside (the stall); None when
    that is not why."""
    if metric.figure in STREAM_GAP_METRICS or metric.figure == SERVER_ITL_FIGURE:
        return (
            _chunked_stream(baseline, current)
            or _stream_set_aside(baseline, current)
            or _unlike_per_token(baseline, current)
        )
    if metric.figure == BACKGROUND_GAP_METRIC:
        return _background_set_aside(baseline, current)
    return None


def _stream_set_aside(baseline: list[Record], current: list[Record]) -> str | None:
    """Why a side has no per-token figure from either source: its streams showed no gap of
    one token (in bursts, or merged into chunks of several by a server that fell behind
    them) and the server sent no mean ITL of its own for any of its points; None where
    every side has one, or no point of a side has a decode to time. A length so left fails:
    neither the stream nor the server says what a token took."""
    lacking = {
        side: records
        for side, records in _sides(baseline, current).items()
        if records
        and not _has(records, "itl_median")
        and not _has(records, SERVER_ITL_FIGURE)
        and any(_gapless(r) for r in records)
    }
    if not lacking:
        return None
    reasons = sorted({why for rs in lacking.values() for r in rs if (why := _gapless(r))})
    counts = {side: (sum(bool(_gapless(r)) for r in rs), len(rs)) for side, rs in lacking.items()}
    if len(set(counts.values())) == 1:
        count, total = next(iter(counts.values()))
        at = f"{count} of {total} points{' each' if len(counts) > 1 else ''}"
    else:
        at = ", ".join(f"{n} of {t} points in {side}" for side, (n, t) in counts.items())
    both = len(lacking) > 1
    return (
        f"{' and '.join(lacking)} {'have' if both else 'has'} no per-token figure: "
        f"{'their' if both else 'its'} streams showed no per-token gap ({'; '.join(reasons)}: "
        f"{at}) and the server sent no mean inter-token latency of its own "
        f"({PER_REQUEST_HINT}); measure on a server that sends per-request metrics, or gate "
        "with itl=off"
    )


def _unlike_per_token(baseline: list[Record], current: list[Record]) -> str | None:
    """Why ITL is not compared where each side has a per-token figure but not the same one:
    one side's streams showed per-token gaps and not the other's, and the side with gaps has
    no server mean ITL (a baseline recorded before per-request metrics, or against a server
    without them); None otherwise."""
    for side, other, name in ((baseline, current, "the baseline"), (current, baseline, "this run")):
        gaps_only = _has(side, "itl_median") and not _has(side, SERVER_ITL_FIGURE)
        server_only = _has(other, SERVER_ITL_FIGURE) and not _has(other, "itl_median")
        if gaps_only and server_only:
            words = _gapless_words(baseline, current)
            return (
                f"{name} has per-token gaps but no server mean inter-token latency "
                f"({SERVER_ITL_FIGURE}: recorded before per-request metrics, or against a "
                f"server without them), and {words or 'the other side has no per-token gap'}; "
                f"record {name} again on a server that sends them ({PER_REQUEST_HINT}), or gate "
                "with itl=off"
            )
    return None


def _decode_source(record: Record) -> str:
    return str(record.stream.get("decode_source") or "stream") if record.stream else "stream"


def _burst(record: Record) -> bool:
    """The point kept the server's decode figure, or none: its stream arrived in bursts."""
    return _decode_source(record) != "stream"


def _merged(record: Record) -> bool:
    """A server that streams every token merged all the point's tokens after the first into
    chunks of several: the stream fell behind, and no gap of it is one token's."""
    stream = record.stream or {}
    return bool(
        stream.get("per_token_gaps")
        and stream.get("coalesced_chunks")
        and "itl_median" not in record.figures
    )


def _chunked(record: Record) -> bool:
    """The server streamed chunks of several tokens (its stream interval), not a burst."""
    stream = record.stream or {}
    return bool(stream) and not stream.get("per_token_gaps", True) and not _burst(record)


def _decode_sources(baseline: list[Record], current: list[Record]) -> str:
    """``decode figures: this run's from the server at 2 of 3 points ...``: where a side's
    decode figures are not all its streams'; empty where they are."""
    parts = []
    for side, records in (("the baseline's", baseline), ("this run's", current)):
        server = sum(_decode_source(r) == "server" for r in records)
        none = sum(_decode_source(r) == "none" for r in records)
        if server:
            parts.append(f"{side} from the server at {server} of {len(records)} points")
        if none:
            parts.append(f"{side} absent at {none} of {len(records)} points")
    if not parts:
        return ""
    return f"decode figures: {', '.join(parts)} (their streams arrived in bursts)"


def _unconfirmed(record: Record) -> bool:
    """An interference point whose background figures were set aside: the server's figures
    refuted its background streams' gaps (workloads/interference/under_load.py)."""
    return bool(record.interference.get("unconfirmed_figures"))


def _background_sources(baseline: list[Record], current: list[Record]) -> str:
    """``background figures: this run's set aside at 1 of 3 points ...``; empty where no
    point of either side set them aside."""
    parts = [
        f"{side} set aside at {count} of {len(records)} points"
        for side, records in (("the baseline's", baseline), ("this run's", current))
        if (count := sum(_unconfirmed(r) for r in records))
    ]
    if not parts:
        return ""
    return (
        f"background figures: {', '.join(parts)} (the server's figures refuted their "
        "streams' gaps; --longctx-allow-unconfirmed keeps and gates them)"
    )


def _background_set_aside(baseline: list[Record], current: list[Record]) -> str | None:
    """Why a side has no background gap figure: every interference point of it had its
    background figures set aside; None otherwise."""
    lacking = [
        side
        for side, records in _sides(baseline, current).items()
        if records
        and not _has(records, BACKGROUND_GAP_METRIC)
        and all(_unconfirmed(r) for r in records)
    ]
    if not lacking:
        return None
    records = baseline if lacking[0] == "the baseline" else current
    first = next(
        str(r.interference.get("background_gaps", {}).get("why", "")) for r in records
    )
    return (
        f"{' and '.join(lacking)} set every interference point's background figures aside: "
        f"the server's figures refuted the background streams' gaps (first: {first}), so no "
        "stall was measured; --longctx-allow-unconfirmed keeps and gates them"
    )


def _why_not_compared(metric: Metric, before: Stats | None, after: Stats | None) -> str | None:
    if before is None:
        return f"the baseline has no {metric.figure} figure (now n={after.n if after else 0})"
    if after is None:
        return f"this run has no {metric.figure} figure (baseline n={before.n})"
    if before.mean <= 0:
        return f"the baseline mean is {before.mean:g}, no base for a percentage"
    return None


def _chunked_stream(baseline: list[Record], current: list[Record]) -> str | None:
    """Why a side has no inter-token latency: its chunks carried several tokens each, so its
    gaps are between chunks and are never gated as if they were between tokens; None when
    every chunk of both sides carried one token, or arrived in a burst (the server's decode
    not shown: :func:`_stream_set_aside`)."""
    chunked = {
        side: [r for r in records if _chunked(r)]
        for side, records in _sides(baseline, current).items()
    }
    chunked = {side: records for side, records in chunked.items() if records}
    if not chunked:
        return None
    intervals = sorted(
        {str(r.stream.get("stream_interval") or "unknown") for rs in chunked.values() for r in rs}
    )
    return (
        f"{' and '.join(chunked)} streamed chunks of several tokens (stream interval "
        f"{', '.join(intervals)}): {'their' if len(chunked) > 1 else 'its'} gaps are between "
        "chunks, not tokens, and are never gated "
        "as inter-token latency; gate with itl=off (TTFT and decode throughput compare at any "
        "stream interval), or measure both sides on a server that streams every token (stream "
        "interval 1) or that sends per-request metrics (the server's mean inter-token latency "
        f"compares at any stream interval; {PER_REQUEST_HINT})"
    )


def _noise_test_for(
    before_groups: list[list[float]],
    after_values: list[float],
    before: Stats,
    after: Stats,
    worse_sign: float,
) -> NoiseTest | None:
    """Against a history of sessions, between repeats of one, or none (n=1 on a side)."""
    if before.sessions >= 2:
        return session_test(before_groups, after_values, worse_sign)
    if before.n >= 2 and after.n >= 2:
        return welch_test(before_groups[0], after_values, worse_sign)
    return None


def _status_and_message(
    metric: Metric,
    where: str,
    before: Stats,
    after: Stats,
    change_pct: float,
    tolerance: float,
    test: NoiseTest | None,
    level: float,
) -> tuple[str, str]:
    """A regression needs both: beyond the tolerance, and significant at ``level``."""
    worse_pct = (1.0 if metric.higher_is_worse else -1.0) * change_pct
    beyond_tolerance = abs(change_pct) > tolerance + PERCENT_SLACK
    significant_worse = test is None or test.p_worse < level
    significant_better = test is None or test.p_better < level
    sides = f"baseline {_describe(before, metric)}, now {_describe(after, metric)}"
    change = f"{change_pct:+.1f}%"
    signed_tolerance = f"{'+' if metric.higher_is_worse else '-'}{tolerance:g}%"
    if test is None:
        sides_of_one = (("the baseline", before), ("this run", after))
        single = [side for side, stats in sides_of_one if stats.n == 1]
        noise = f"n=1 on {' and '.join(single)}, spread unknown: judged on tolerance alone"
    else:
        noise = _test_words(test, level, worse_pct >= 0)
    if beyond_tolerance and worse_pct > 0 and significant_worse:
        return "regressed", (
            f"{where} {metric.worse_verb}: {sides}, {change} "
            f"(tolerance {signed_tolerance}, {noise})"
        )
    if beyond_tolerance and worse_pct < 0 and significant_better:
        return "improved", (
            f"{where} {metric.better_verb}: {sides}, {change} (beyond tolerance {tolerance:g}%, "
            f"{noise}); refresh the baseline so later changes are measured from here"
        )
    if beyond_tolerance:
        return "ok", (
            f"{where} ok within noise: {sides}, {change} exceeds tolerance {signed_tolerance} "
            f"but is not significant ({noise})"
        )
    label = noise if test is None else _model_words(test)
    return "ok", f"{where} ok: {sides}, {change} (tolerance {signed_tolerance}; {label})"


def _model_words(test: NoiseTest) -> str:
    if test.model == "between-session":
        return f"against {test.sessions} baseline sessions"
    return WITHIN_ONLY


def _test_words(test: NoiseTest, level: float, worse: bool) -> str:
    """``p=0.003 < 0.01, t=4.20, df=3.1; one-session baseline: within-session noise only``."""
    p = test.p_worse if worse else test.p_better
    relation = "<" if p < level else ">="
    t = test.t if worse else -test.t
    name = "t" if test.model == "between-session" else "Welch t"
    t_text = f"{t:.2f}" if math.isfinite(t) else ("inf" if t > 0 else "-inf")
    return f"p={p:.2g} {relation} {level:g}, {name}={t_text}, df={test.df:.1f}; " + _model_words(
        test
    )


def shown_decimals(mean: float, spread: float | None = None) -> int:
    """Three significant digits of the mean and at least one of the spread, at most six:
    ``0.670 ± 0.010 s``, ``275.0 ± 0.2 tok/s``, ``18.4 ± 0.2 s``, ``40172 ± 115 s``."""
    wanted = 2 - _exponent(mean, digits=3)
    if spread:
        wanted = max(wanted, -_exponent(spread, digits=1))
    return min(6, max(0, wanted))


def _exponent(value: float, digits: int) -> int:
    """Decimal exponent of ``value`` once rounded to ``digits`` (0.000999999 -> -3, not -4)."""
    if value == 0 or not math.isfinite(value):
        return 0
    return int(f"{abs(value):.{digits - 1}e}".split("e")[1])


def _describe(stats: Stats, metric: Metric) -> str:
    """``0.120 ± 0.001 s (n=3)``; a history: ``0.120 ± 0.004 s between 4 sessions (n=12)``."""
    return format_mean_std(
        stats.mean,
        stats.std,
        shown_decimals(stats.mean, stats.std),
        unit=metric.unit,
        after_unit=f"between {stats.sessions} sessions" if stats.sessions > 1 else "",
        count=f"n={stats.n}",
        grouped=False,
    )
