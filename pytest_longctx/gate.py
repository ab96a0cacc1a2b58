"""The regression gate: does this run serve long contexts slower than the committed baseline?

The gate reads records only (:mod:`pytest_longctx.records`); it never talks to a server.

The rule
--------
At every length, for every gated metric, the gate compares the mean of this run's passed repeats
with the mean of the baseline's. A point **regresses** only when the change in the bad direction
(TTFT or inter-token latency up, decode throughput down) is beyond BOTH

1. the tolerance: ``|mean_now - mean_base| > tolerance% * mean_base``, the change the team has
   declared it cares about (it also absorbs day-to-day drift a single run cannot see), and
2. the run-to-run spread: ``|mean_now - mean_base| > SPREAD_FACTOR * SE`` with the Welch standard
   error ``SE = sqrt(std_base**2 / n_base + std_now**2 / n_now)`` (sample std over repeats).
   With ``SPREAD_FACTOR = 3`` and three repeats a side this is roughly a one-sided Welch t-test at
   the 2% level: one wild repeat inflates its side's std and keeps the gate quiet, while a
   consistent slowdown has a small std and fails.

When one side has a single sample its std is unknown; the other side's std stands in for it
(same server, same prompt: the noise is alike). When both sides have a single sample the spread
is unknown and the tolerance alone decides; the message says so, and more repeats fix it.

An **improvement** beyond both bounds is reported (``improved``) so the team refreshes the
baseline; it never fails. A change beyond the tolerance but within the spread is ``ok`` with a
message saying it is noise-sized. Lengths measured on one side only are reported
(``missing_in_current`` / ``missing_in_baseline``), never silently dropped.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import FIGURE_UNITS, Record, append_record, read_records, results_path
from .sizes import SizeError, format_size, parse_size
from .stats import latest_records, summarize_values

TOLERANCE_OPTION = "--longctx-tolerance"

#: How many Welch standard errors a change must exceed to count as more than noise.
SPREAD_FACTOR = 3.0

#: Changes this close to the tolerance (in percentage points) count as within it, so that
#: ``1.0 s -> 1.1 s`` passes a 10% tolerance despite binary floating point.
_PERCENT_SLACK = 1e-9


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """One gated quantity: which figure it reads and which direction hurts."""

    name: str  # the key in the tolerance spec
    figure: str  # the key in Record.figures
    label: str  # how messages name it
    higher_is_worse: bool
    default_tolerance_pct: float
    worse_verb: str
    better_verb: str

    @property
    def unit(self) -> str:
        return FIGURE_UNITS.get(self.figure, "")


#: Gated metrics in report order. ITL gates the median gap: the p90 and max of a few hundred
#: gaps swing with a single scheduler hiccup and would cry wolf.
METRICS: Mapping[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric("ttft", "ttft", "TTFT", True, 10.0, "regressed", "improved"),
        Metric("decode", "decode_throughput", "decode throughput", False, 5.0, "fell", "rose"),
        Metric("itl", "itl_median", "median inter-token latency", True, 10.0, "rose", "fell"),
    )
}

DEFAULT_TOLERANCES: Mapping[str, float] = {
    name: metric.default_tolerance_pct for name, metric in METRICS.items()
}


# --------------------------------------------------------------------------- tolerances

TOLERANCE_FORM = (
    "comma-separated METRIC=PERCENT or LENGTH:METRIC=PERCENT items, "
    "e.g. 'ttft=10%,decode=5%,64Ki:ttft=20%,1Mi:itl=off'; "
    f"METRIC is one of {', '.join(METRICS)}; PERCENT is a number of percent, '%' optional "
    "(10 and 10% both mean ten percent; 0.1 is refused as ambiguous, write 0.1% or 10%), "
    "or 'off' to stop gating that metric"
)


class ToleranceError(ValueError):
    """A ``--longctx-tolerance`` value that does not parse."""

    def __init__(self, part: str, problem: str) -> None:
        super().__init__(f"{TOLERANCE_OPTION}: {part!r} {problem}; expected {TOLERANCE_FORM}")
        self.part = part


@dataclass(frozen=True)
class Tolerances:
    """Allowed change in percent per metric; ``None`` means the metric is not gated.

    Per-length entries override the defaults for that length only; metrics a spec leaves out
    keep their default (ttft 10%, decode 5%, itl 10%).
    """

    default: Mapping[str, float | None] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    per_length: Mapping[int, Mapping[str, float | None]] = field(default_factory=dict)

    def for_metric(self, metric: str, length: int) -> float | None:
        override = self.per_length.get(length, {})
        if metric in override:
            return override[metric]
        return self.default.get(metric)

    def describe(self) -> str:
        """The spec back as text (parses to an equal value), for report headers."""
        parts = [f"{name}={_format_tolerance(self.default.get(name))}" for name in METRICS]
        for length in sorted(self.per_length):
            for name, value in self.per_length[length].items():
                parts.append(f"{format_size(length)}:{name}={_format_tolerance(value)}")
        return ",".join(parts)


def _format_tolerance(value: float | None) -> str:
    return "off" if value is None else f"{value:g}%"


def parse_tolerances(text: str | None) -> Tolerances:
    """Parse ``ttft=10%,decode=5%,64Ki:ttft=20%``; an empty spec gives the defaults."""
    default: dict[str, float | None] = dict(DEFAULT_TOLERANCES)
    per_length: dict[int, dict[str, float | None]] = {}
    seen: set[tuple[int | None, str]] = set()
    for raw_part in (text or "").split(","):
        part = raw_part.strip()
        if not part:
            continue
        key, equals, value_text = part.partition("=")
        if not equals:
            raise ToleranceError(part, "is not METRIC=PERCENT")
        length: int | None = None
        if ":" in key:
            length_text, _, key = key.partition(":")
            try:
                length = parse_size(length_text.strip())
            except SizeError as exc:
                raise ToleranceError(part, f"has a bad length ({exc})") from None
        name = key.strip().lower()
        if name not in METRICS:
            raise ToleranceError(part, f"names unknown metric {key.strip()!r}")
        if (length, name) in seen:
            where = f"at {format_size(length)}" if length is not None else "as a default"
            raise ToleranceError(part, f"sets {name} {where} a second time")
        seen.add((length, name))
        value = _parse_percent(part, value_text.strip())
        if length is None:
            default[name] = value
        else:
            per_length.setdefault(length, {})[name] = value
    return Tolerances(default=default, per_length=per_length)


def _parse_percent(part: str, text: str) -> float | None:
    if text.lower() == "off":
        return None
    number_text = text[:-1].strip() if text.endswith("%") else text
    try:
        value = float(number_text)
    except ValueError:
        raise ToleranceError(part, f"has a bad percentage {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ToleranceError(part, f"has a bad percentage {text!r} (must be 0 or more)")
    if not text.endswith("%") and 0 < value < 1:
        raise ToleranceError(
            part, f"has an ambiguous percentage {text!r} (a fraction or a percent?)"
        )
    return value


# --------------------------------------------------------------------------- baseline files


class BaselineError(ValueError):
    """A baseline that cannot serve as one; raised before any server starts."""


BASELINE_FORM = "a run folder, its results.jsonl, or a baseline .jsonl written from a passing run"


def load_baseline(path: Path | str, problems: list[str] | None = None) -> list[Record]:
    """The passed records of a baseline; corrupt lines among good ones go to ``problems``.

    Only passed records are returned: a failed point has no figure worth comparing against.
    """
    given = Path(path)
    file = results_path(given)
    if given.is_dir() and not file.exists():
        raise BaselineError(
            f"baseline {given}: folder holds no results.jsonl; expected {BASELINE_FORM}"
        )
    if not file.exists():
        raise BaselineError(f"baseline {file}: no such file; expected {BASELINE_FORM}")
    if not file.is_file():
        raise BaselineError(f"baseline {file}: not a regular file; expected {BASELINE_FORM}")
    try:
        result = read_records(file)
    except OSError as exc:
        raise BaselineError(f"baseline {file}: cannot be read ({exc.strerror or exc})") from None
    if not result.records and not result.problems:
        raise BaselineError(f"baseline {file}: the file is empty, it holds no records")
    if not result.records:
        raise BaselineError(
            f"baseline {file}: every line is corrupt ({len(result.problems)} lines), "
            f"first: {result.problems[0]}"
        )
    passed = [record for record in result.records if record.outcome == "passed"]
    if not passed:
        outcomes = Counter(record.outcome for record in result.records)
        tally = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
        raise BaselineError(
            f"baseline {file}: none of its {len(result.records)} records passed ({tally}); "
            "a baseline needs passed measurements"
        )
    if problems is not None:
        problems.extend(result.problems)
    return passed


def write_baseline(records: Iterable[Record], path: Path | str) -> int:
    """Store the passed records, every field, as a baseline file; returns how many.

    The file appears whole or not at all (written aside, then renamed), so an interrupted
    refresh never leaves the team a truncated baseline to commit.
    """
    target = Path(path)
    if target.is_dir():
        raise BaselineError(
            f"baseline {target}: is a folder; give a file path such as baseline.jsonl"
        )
    passed = [record for record in records if record.outcome == "passed"]
    if not passed:
        raise BaselineError(f"baseline {target}: not written, the run has no passed records")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    scratch.unlink(missing_ok=True)
    try:
        for record in passed:
            append_record(scratch, record)
        os.replace(scratch, target)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    return len(passed)


# --------------------------------------------------------------------------- fingerprints

FINGERPRINT_KEYS: tuple[str, ...] = (
    "model",
    "revision",
    "profile",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "vllm_version",
    "hardware",
)
"""Keys of ``Record.fingerprint`` that must match for two runs to be comparable.

``hardware`` is a mapping; the gate reads only :data:`HARDWARE_KEYS` from it and compares a
normalised identity (see :func:`hardware_identity`). Other values compare as text, whitespace
collapsed, so ``1`` and ``"1"`` agree. A key absent on both sides is no difference; absent on one
side it is, since the gate cannot confirm the setups match.
"""

HARDWARE_KEYS: tuple[str, ...] = ("gpu_names", "gpu_count", "cpu_model", "cpu_count")
"""Keys of ``fingerprint["hardware"]`` the gate reads.

``gpu_count`` is how many GPUs the server may use, ``gpu_names`` their model names (distinct
names or one per GPU: both read the same), ``cpu_model`` the host CPU's model string and
``cpu_count`` its cores, as :func:`pytest_longctx.hardware.describe_host` reports them.
"""

_NOT_RECORDED = "(not recorded)"


def hardware_identity(hardware: Any) -> str:
    """What sets the speed: the GPUs when there are any, else the CPU model and its cores.

    The host CPU of a GPU run is left out on purpose: CI pools mix host CPUs under the same GPUs,
    and refusing those comparisons would train teams to always force.
    """
    if not isinstance(hardware, Mapping) or not hardware:
        return _NOT_RECORDED
    names = [_normalise_text(name) for name in hardware.get("gpu_names") or []]
    count = _as_int(hardware.get("gpu_count")) or len(names)
    if count:
        return f"{count}x {' + '.join(sorted(set(names))) or 'unnamed GPU'}"
    cpu = _normalise_text(hardware.get("cpu_model") or "") or "unnamed CPU"
    cores = _as_int(hardware.get("cpu_count"))
    return f"CPU {cpu}" + (f" ({cores} cores)" if cores else "")


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _normalise_text(value: Any) -> str:
    return " ".join(str(value).split())


def _fingerprint_value(fingerprint: Mapping[str, Any], key: str) -> str:
    if key == "hardware":
        return hardware_identity(fingerprint.get("hardware"))
    value = fingerprint.get(key)
    if value is None or value == "":
        return _NOT_RECORDED
    if isinstance(value, (list, tuple)):
        return ", ".join(_normalise_text(item) for item in value)
    return _normalise_text(value)


def fingerprint_differences(
    baseline_records: Iterable[Record],
    current_records_or_fingerprint: Iterable[Record] | Mapping[str, Any],
) -> list[str]:
    """One line per :data:`FINGERPRINT_KEYS` entry that differs, e.g.
    ``vllm_version: baseline 0.32.0, now 0.33.0``; empty when the runs are comparable.

    The current side may be a fingerprint, so the check can run before any server starts.
    """
    if isinstance(current_records_or_fingerprint, Mapping):
        current = [current_records_or_fingerprint]
    else:
        current = [record.fingerprint for record in current_records_or_fingerprint]
    baseline = [record.fingerprint for record in baseline_records]
    if not baseline or not current:
        return []
    differences = []
    for key in FINGERPRINT_KEYS:
        before = sorted({_fingerprint_value(fp, key) for fp in baseline})
        after = sorted({_fingerprint_value(fp, key) for fp in current})
        if before != after:
            differences.append(f"{key}: baseline {' / '.join(before)}, now {' / '.join(after)}")
    return differences


# --------------------------------------------------------------------------- comparison

VERDICT_STATUSES = ("ok", "regressed", "improved", "insufficient")
LENGTH_STATUSES = (*VERDICT_STATUSES, "missing_in_current", "missing_in_baseline")


@dataclass(frozen=True)
class Stats:
    """Mean and sample std of one metric's repeats; ``std`` is None with a single sample."""

    n: int
    mean: float
    std: float | None

    @classmethod
    def of(cls, name: str, values: list[float]) -> Stats:
        summary = summarize_values(name, values)
        return cls(n=summary.n, mean=summary.mean, std=summary.std if summary.n > 1 else None)


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
    #: SPREAD_FACTOR standard errors in the figure's unit; None when both sides have n=1.
    spread: float | None
    message: str


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
        headline = f"regression gate ({self.tolerances.describe()}): "
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


def compare(
    baseline: Iterable[Record],
    current: Iterable[Record],
    tolerances: Tolerances | None = None,
    *,
    problems: Iterable[str] = (),
) -> GateReport:
    """Verdicts for every length either side measured.

    Only passed records count, and a point re-measured by a resumed run counts once (its latest
    record), as in every other report.
    """
    tolerances = tolerances or Tolerances()
    baseline_by_length = _passed_by_length(latest_records(baseline))
    current_list = latest_records(current)
    current_by_length = _passed_by_length(current_list)
    attempted = Counter(record.length for record in current_list)
    lengths = sorted(set(baseline_by_length) | set(current_by_length))
    verdicts = tuple(
        _judge_length(
            length,
            baseline_by_length.get(length, []),
            current_by_length.get(length, []),
            attempted[length],
            tolerances,
        )
        for length in lengths
    )
    return GateReport(lengths=verdicts, tolerances=tolerances, problems=tuple(problems))


def compare_length(
    baseline: Iterable[Record],
    current: Iterable[Record],
    length: int,
    tolerances: Tolerances | None = None,
) -> LengthVerdict:
    """The verdict at one length: what the per-length test item reports after its repeats."""
    current_here = [record for record in latest_records(current) if record.length == length]
    baseline_here = [record for record in latest_records(baseline) if record.length == length]
    return _judge_length(
        length,
        [r for r in baseline_here if r.outcome == "passed"],
        [r for r in current_here if r.outcome == "passed"],
        len(current_here),
        tolerances or Tolerances(),
    )


def _passed_by_length(records: Iterable[Record]) -> dict[int, list[Record]]:
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
        verdict = _judge_metric(metric, length, baseline, current, tolerance)
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


def _judge_metric(
    metric: Metric,
    length: int,
    baseline_records: list[Record],
    current_records: list[Record],
    tolerance: float,
) -> MetricVerdict | None:
    before_values = _figure_values(baseline_records, metric.figure)
    after_values = _figure_values(current_records, metric.figure)
    if not before_values and not after_values:
        return None  # neither side records it (e.g. a prefill-only profile): nothing to judge
    where = f"{metric.label} at {format_size(length)}"
    before = Stats.of(metric.figure, before_values) if before_values else None
    after = Stats.of(metric.figure, after_values) if after_values else None

    def insufficient(reason: str) -> MetricVerdict:
        return MetricVerdict(
            metric=metric.name,
            length=length,
            status="insufficient",
            baseline=before,
            current=after,
            change_pct=None,
            tolerance_pct=tolerance,
            spread=None,
            message=f"{where}: not compared, {reason}",
        )

    if before is None:
        return insufficient(f"the baseline has no {metric.figure} figure (now n={after.n})")
    if after is None:
        return insufficient(f"this run has no {metric.figure} figure (baseline n={before.n})")
    if before.mean <= 0:
        return insufficient(f"the baseline mean is {before.mean:g}, no base for a percentage")

    delta = after.mean - before.mean
    change_pct = 100.0 * delta / before.mean
    worse_pct = change_pct if metric.higher_is_worse else -change_pct
    spread, spread_source = _spread(before, after)
    beyond_spread = spread is None or abs(delta) > spread
    beyond_tolerance = abs(change_pct) > tolerance + _PERCENT_SLACK

    sides = f"baseline {_describe(before, metric)}, now {_describe(after, metric)}"
    change = f"{change_pct:+.1f}%"
    bad_sign = "+" if metric.higher_is_worse else "-"
    signed_tolerance = f"{bad_sign}{tolerance:g}%"
    if spread is None:
        spread_words = "one sample per side, spread unknown: judged on tolerance alone"
    else:
        spread_words = "beyond run-to-run spread" + spread_source

    if beyond_tolerance and beyond_spread and worse_pct > 0:
        status = "regressed"
        message = (
            f"{where} {metric.worse_verb}: {sides}, {change} "
            f"(tolerance {signed_tolerance}, {spread_words})"
        )
    elif beyond_tolerance and beyond_spread:
        status = "improved"
        message = (
            f"{where} {metric.better_verb}: {sides}, {change} (beyond tolerance {tolerance:g}%, "
            f"{spread_words}); refresh the baseline so later changes are measured from here"
        )
    elif beyond_tolerance:
        status = "ok"
        message = (
            f"{where} ok within noise: {sides}, {change} exceeds tolerance {signed_tolerance} "
            f"but not the run-to-run spread ({SPREAD_FACTOR:g} standard errors = "
            f"{spread:.{_decimals(before.mean, spread)}f} {metric.unit}{spread_source})"
        )
    else:
        status = "ok"
        message = f"{where} ok: {sides}, {change} (tolerance {signed_tolerance})"
    return MetricVerdict(
        metric=metric.name,
        length=length,
        status=status,
        baseline=before,
        current=after,
        change_pct=change_pct,
        tolerance_pct=tolerance,
        spread=spread,
        message=message,
    )


def _spread(before: Stats, after: Stats) -> tuple[float | None, str]:
    """SPREAD_FACTOR Welch standard errors, and a note when one side's std stood in."""
    if before.std is not None and after.std is not None:
        error = math.sqrt(before.std**2 / before.n + after.std**2 / after.n)
        return SPREAD_FACTOR * error, ""
    known = before.std if before.std is not None else after.std
    if known is None:
        return None, ""
    side = "baseline" if before.std is not None else "this run"
    error = known * math.sqrt(1 / before.n + 1 / after.n)
    return SPREAD_FACTOR * error, f", estimated from {side}'s repeats"


def _decimals(mean: float, spread: float | None = None) -> int:
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
    decimals = _decimals(stats.mean, stats.std)
    spread = f" ± {stats.std:.{decimals}f}" if stats.std is not None else ""
    return f"{stats.mean:.{decimals}f}{spread} {metric.unit} (n={stats.n})"
