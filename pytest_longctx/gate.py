"""The regression gate: does this run serve long contexts slower than the committed baseline?

The gate reads records only (:mod:`pytest_longctx.records`); it never talks to a server.

The rule
--------
At every length, for every gated metric, the gate compares the mean of this run's passed repeats
with the baseline's. A point **regresses** only when the change in the bad direction (TTFT or
inter-token latency up, decode throughput down) is beyond BOTH

1. the tolerance: ``|mean_now - mean_base| > tolerance% * mean_base``, the change the team has
   declared it cares about, and
2. the noise: a one-sided t-test at the gate's level (``--longctx-gate-level``, default
   :data:`DEFAULT_LEVEL`) says the change is unlikely to be noise, ``p < level``.

The noise model depends on what the baseline holds:

* **Several sessions** (records of two or more run ids, see ``python -m pytest_longctx
  baseline --append``): the current run is one more session, judged against the distribution of
  the baseline's per-session means. With K session means of sample variance ``S_m**2`` (K - 1
  degrees of freedom), ``SE**2 = S_m**2 * (1 + 1/K)``: the noise of the baseline's mean plus that
  of a new session's mean, the spread *between* sessions (server start, machine state) included.
  When this run has fewer repeats than the baseline's sessions, its mean is noisier by
  ``s_w**2 * (1/n_now - 1/n_base)`` (``s_w`` the pooled spread *within* sessions); that term is
  added and the degrees of freedom come from Welch-Satterthwaite over the two terms.
* **One session**: Welch's t-test between the baseline's repeats and this run's, with
  Welch-Satterthwaite degrees of freedom. Repeats of one session share a server start, so this
  noise estimate is within-session only and understates the difference between two sessions;
  every message says so. With a single repeat on either side there is no spread to test: the
  tolerance alone decides, and the message says that too.

The t distribution is computed here (regularized incomplete beta), so the gate needs no SciPy.

An **improvement** beyond the tolerance and significant at the same level in the good direction
is reported (``improved``) so the team refreshes the baseline; it never fails. A change beyond the
tolerance but not significant is ``ok`` with a message saying it is noise-sized. Lengths measured
on one side only are reported (``missing_in_current`` / ``missing_in_baseline``), never silently
dropped.

Baseline files
--------------
A baseline file is JSON lines: passed records (each carries its session's ``run_id``), optionally
preceded by one header object ``{"longctx_baseline": 1, ...}`` holding the tolerances a
calibration proposed (``tolerance``), the cap on sessions kept (``max_sessions``) and the
calibration's table (``calibration``). Tolerances are taken from ``--longctx-tolerance`` when
given, else from the baseline's header, else from the profile's ``[gate] tolerance``, else the
built-in defaults.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import BASELINE_HEADER_KEY, FIGURE_UNITS, Record, append_record, results_path
from .sizes import SizeError, format_size, parse_size
from .stats import latest_records, summarize_values

TOLERANCE_OPTION = "--longctx-tolerance"

LEVEL_OPTION = "--longctx-gate-level"

#: One-sided false-alarm level of the noise test when ``--longctx-gate-level`` is not given.
DEFAULT_LEVEL = 0.01

LEVEL_FORM = "a probability between 0 and 0.5, e.g. 0.01 (a 1% one-sided false-alarm level)"

#: Sessions a baseline history keeps by default; older ones drop out as new ones are appended.
DEFAULT_MAX_SESSIONS = 10

#: Changes this close to the tolerance (in percentage points) count as within it, so that
#: ``1.0 s -> 1.1 s`` passes a 10% tolerance despite binary floating point.
_PERCENT_SLACK = 1e-9


# --------------------------------------------------------------------------- statistics


class LevelError(ValueError):
    """A ``--longctx-gate-level`` value that does not parse."""


def parse_level(text: object) -> float:
    """``0.01`` or ``1%`` -> 0.01; anything outside (0, 0.5) is refused with the accepted form."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value < 0.5):
        raise LevelError(f"{LEVEL_OPTION}={text}: expected {LEVEL_FORM}")
    return value


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((a - 1.0 + m2) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            step = c * d
            result *= step
        if abs(step - 1.0) < 1e-15:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` (any real > 0) degrees of freedom."""
    if math.isnan(t) or not df > 0:
        raise ValueError(f"student_t_sf needs a number and df > 0, got t={t}, df={df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if math.isinf(df) or df > 1e7:
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def student_t_isf(p: float, df: float) -> float:
    """The t with ``P(T > t) = p``: the one-sided critical value at level ``p``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_isf needs 0 < p < 1, got {p}")
    if p > 0.5:
        return -student_t_isf(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_sf(high, df) > p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if student_t_sf(middle, df) > p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class NoiseTest:
    """A one-sided t-test of a change against the noise the baseline shows."""

    model: str  # "between-session" or "within-session"
    #: Change divided by its standard error, signed so that positive is the bad direction.
    t: float
    df: float
    se: float  # standard error of the change, in the figure's unit
    #: One-sided p-values: of a change at least this bad, and at least this good, from noise.
    p_worse: float
    p_better: float
    sessions: int  # baseline sessions behind the test


def welch_test(before: Sequence[float], after: Sequence[float], worse_sign: float) -> NoiseTest:
    """Welch's t-test (Welch-Satterthwaite df) of ``mean(after) - mean(before)``; n >= 2 a side.

    ``worse_sign`` is +1 when higher is worse, -1 when lower is.
    """
    n_before, n_after = len(before), len(after)
    if n_before < 2 or n_after < 2:
        raise ValueError("Welch's test needs two or more values on each side")
    var_before = _variance(before) / n_before
    var_after = _variance(after) / n_after
    se2 = var_before + var_after
    terms = [(var_before, n_before - 1), (var_after, n_after - 1)]
    delta = _mean(after) - _mean(before)
    return _noise_test("within-session", worse_sign * delta, se2, terms, sessions=1)


def session_test(
    sessions: Sequence[Sequence[float]], after: Sequence[float], worse_sign: float
) -> NoiseTest:
    """This run as one more session, against the baseline's K >= 2 per-session means.

    ``SE**2 = S_m**2 (1 + 1/K) [+ s_w**2 (1/n_now - 1/n_base) when this run has fewer repeats]``
    with Welch-Satterthwaite degrees of freedom over the terms (see the module's docstring).
    """
    groups = [list(values) for values in sessions if values]
    count = len(groups)
    if count < 2 or not after:
        raise ValueError("the between-session test needs two or more baseline sessions")
    means = [_mean(values) for values in groups]
    between = _variance(means) * (1.0 + 1.0 / count)
    terms = [(between, count - 1)]
    within_df = sum(len(values) - 1 for values in (*groups, after))
    n_base = count / sum(1.0 / len(values) for values in groups)  # harmonic mean of repeats
    n_now = len(after)
    if within_df > 0 and n_now < n_base:
        pooled = (
            math.fsum(_variance(values) * (len(values) - 1) for values in (*groups, after))
            / within_df
        )
        terms.append((pooled * (1.0 / n_now - 1.0 / n_base), within_df))
    se2 = math.fsum(term for term, _ in terms)
    delta = _mean(after) - _mean(means)
    return _noise_test("between-session", worse_sign * delta, se2, terms, sessions=count)


def _noise_test(
    model: str, worse_delta: float, se2: float, terms: list[tuple[float, int]], sessions: int
) -> NoiseTest:
    se = math.sqrt(max(se2, 0.0))
    denominator = math.fsum(term * term / df for term, df in terms if df > 0 and term > 0)
    df = se2 * se2 / denominator if denominator > 0 else float(max(df for _, df in terms))
    df = max(df, 1e-9)
    # With no spread at all, any change is beyond noise and no change is not.
    no_spread = math.copysign(math.inf, worse_delta) if worse_delta else 0.0
    t = worse_delta / se if se > 0 else no_spread
    return NoiseTest(
        model=model,
        t=t,
        df=df,
        se=se,
        p_worse=student_t_sf(t, df),
        p_better=student_t_sf(-t, df),
        sessions=sessions,
    )


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _variance(values: Sequence[float]) -> float:
    """Sample variance (divisor n - 1); 0.0 for a single value."""
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1)


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


#: The key that marks a baseline file's header line.
HEADER_KEY = BASELINE_HEADER_KEY
HEADER_VERSION = 1


@dataclass(frozen=True)
class BaselineInfo:
    """A baseline file's header: what a calibration stored next to the records."""

    #: Tolerance spec proposed by a calibration; used unless --longctx-tolerance is given.
    tolerance: str | None = None
    #: Cap on sessions kept when runs are appended.
    max_sessions: int | None = None
    #: The calibration's level, session count and per length/metric table.
    calibration: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {HEADER_KEY: HEADER_VERSION}
        if self.tolerance is not None:
            data["tolerance"] = self.tolerance
        if self.max_sessions is not None:
            data["max_sessions"] = self.max_sessions
        if self.calibration is not None:
            data["calibration"] = dict(self.calibration)
        return data

    @property
    def empty(self) -> bool:
        return self.tolerance is None and self.max_sessions is None and self.calibration is None


@dataclass(frozen=True)
class Baseline:
    """A baseline's passed records (of one or more sessions) and its header."""

    records: list[Record]
    info: BaselineInfo = field(default_factory=BaselineInfo)
    path: Path | None = None

    @property
    def sessions(self) -> int:
        return session_count(self.records)

    def tolerances(self) -> Tolerances | None:
        """The stored tolerances, or None when the file stores none."""
        return parse_tolerances(self.info.tolerance) if self.info.tolerance else None


def load_baseline(path: Path | str, problems: list[str] | None = None) -> list[Record]:
    """The passed records of a baseline; corrupt lines among good ones go to ``problems``.

    Only passed records are returned: a failed point has no figure worth comparing against.
    """
    return load_baseline_file(path, problems).records


def load_baseline_file(path: Path | str, problems: list[str] | None = None) -> Baseline:
    """A baseline's passed records and its header (see :class:`BaselineInfo`)."""
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
        records, info, found = _read_baseline_lines(file)
    except OSError as exc:
        raise BaselineError(f"baseline {file}: cannot be read ({exc.strerror or exc})") from None
    if not records and not found:
        raise BaselineError(f"baseline {file}: the file is empty, it holds no records")
    if not records:
        raise BaselineError(
            f"baseline {file}: every line is corrupt ({len(found)} lines), first: {found[0]}"
        )
    passed = [record for record in records if record.outcome == "passed"]
    if not passed:
        outcomes = Counter(record.outcome for record in records)
        tally = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
        raise BaselineError(
            f"baseline {file}: none of its {len(records)} records passed ({tally}); "
            "a baseline needs passed measurements"
        )
    if problems is not None:
        problems.extend(found)
    return Baseline(passed, info, file)


def _read_baseline_lines(file: Path) -> tuple[list[Record], BaselineInfo, list[str]]:
    records: list[Record] = []
    problems: list[str] = []
    info = BaselineInfo()
    with open(file, encoding="utf-8", errors="replace") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not (isinstance(data, dict) and HEADER_KEY in data):
                    records.append(Record.from_json(data))
                    continue
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{file}:{lineno}: skipped a corrupt record ({exc})")
                continue
            info = _header_from_json(file, lineno, data)  # a bad header is fatal, not skipped
    return records, info, problems


def _header_from_json(file: Path, lineno: int, data: Mapping[str, Any]) -> BaselineInfo:
    """The header, checked: a bad stored tolerance is the file's fault and names the line."""
    where = f"baseline {file}:{lineno}: header"
    if data.get(HEADER_KEY) != HEADER_VERSION:
        raise BaselineError(
            f"{where} has version {data.get(HEADER_KEY)!r}; this reader knows {HEADER_VERSION}"
        )
    tolerance = data.get("tolerance")
    if tolerance is not None:
        try:
            parse_tolerances(str(tolerance))
        except ToleranceError as exc:
            raise BaselineError(f"{where} stores a bad tolerance: {exc}") from None
    cap = data.get("max_sessions")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise BaselineError(f"{where} has max_sessions {cap!r}; expected a whole number >= 1")
    calibration = data.get("calibration")
    return BaselineInfo(
        tolerance=None if tolerance is None else str(tolerance),
        max_sessions=cap,
        calibration=dict(calibration) if isinstance(calibration, Mapping) else None,
    )


def write_baseline(
    records: Iterable[Record], path: Path | str, info: BaselineInfo | None = None
) -> int:
    """Store the passed records, every field, as a baseline file; returns how many.

    A header line comes first when ``info`` holds anything. The file appears whole or not at
    all (written aside, then renamed), so an interrupted refresh never leaves the team a
    truncated baseline to commit.
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
        if info is not None and not info.empty:
            with open(scratch, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(info.to_json(), sort_keys=True) + "\n")
        for record in passed:
            append_record(scratch, record)
        os.replace(scratch, target)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    return len(passed)


def sessions_of(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records by session (run id), in the order sessions first appear."""
    grouped: dict[str, list[Record]] = {}
    for record in records:
        grouped.setdefault(record.run_id, []).append(record)
    return grouped


def keep_newest_sessions(records: Iterable[Record], cap: int) -> list[Record]:
    """The records of the ``cap`` most recent sessions (by their last finish time)."""
    grouped = sessions_of(records)

    def finished(item: tuple[int, tuple[str, list[Record]]]) -> tuple[float, int]:
        position, (_, group) = item
        times = [r.finished_at or r.started_at or 0.0 for r in group]
        return (max(times), position)

    ordered = sorted(enumerate(grouped.items()), key=finished)
    kept = {run_id for _, (run_id, _) in ordered[-cap:]} if cap > 0 else set()
    return [record for run_id, group in grouped.items() if run_id in kept for record in group]


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

WITHIN_ONLY = "one-session baseline: within-session noise only"


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
        means = [_mean(values) for values in groups]
        return cls(
            n=sum(len(values) for values in groups),
            mean=_mean(means),
            std=math.sqrt(_variance(means)),
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


def session_count(records: Iterable[Record]) -> int:
    """Distinct sessions (run ids) among passed records."""
    return len({record.run_id for record in records if record.outcome == "passed"})


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
    baseline_by_length = _passed_by_length(baseline_list)
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
    return _judge_length(
        length,
        [r for r in baseline_here if r.outcome == "passed"],
        [r for r in current_here if r.outcome == "passed"],
        len(current_here),
        tolerances or Tolerances(),
        level,
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


def _session_values(records: list[Record], figure: str) -> list[list[float]]:
    """The figure's values grouped by session (run id), in the order sessions first appear."""
    by_session: dict[str, list[Record]] = {}
    for record in records:
        by_session.setdefault(record.run_id, []).append(record)
    groups = [_figure_values(group, figure) for group in by_session.values()]
    return [values for values in groups if values]


def _judge_metric(
    metric: Metric,
    length: int,
    baseline_records: list[Record],
    current_records: list[Record],
    tolerance: float,
    level: float = DEFAULT_LEVEL,
) -> MetricVerdict | None:
    before_groups = _session_values(baseline_records, metric.figure)
    after_values = _figure_values(current_records, metric.figure)
    if not before_groups and not after_values:
        return None  # neither side records it (e.g. a prefill-only profile): nothing to judge
    where = f"{metric.label} at {format_size(length)}"
    before = Stats.of_sessions(before_groups) if before_groups else None
    after = Stats.of(metric.figure, after_values) if after_values else None

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
        )

    if before is None:
        return verdict(
            "insufficient",
            f"{where}: not compared, the baseline has no {metric.figure} figure (now n={after.n})",
        )
    if after is None:
        return verdict(
            "insufficient",
            f"{where}: not compared, this run has no {metric.figure} figure "
            f"(baseline n={before.n})",
        )
    if before.mean <= 0:
        return verdict(
            "insufficient",
            f"{where}: not compared, the baseline mean is {before.mean:g}, "
            "no base for a percentage",
        )

    worse_sign = 1.0 if metric.higher_is_worse else -1.0
    if before.sessions >= 2:
        test: NoiseTest | None = session_test(before_groups, after_values, worse_sign)
    elif before.n >= 2 and after.n >= 2:
        test = welch_test(before_groups[0], after_values, worse_sign)
    else:
        test = None
    change_pct = 100.0 * (after.mean - before.mean) / before.mean
    worse_pct = worse_sign * change_pct
    beyond_tolerance = abs(change_pct) > tolerance + _PERCENT_SLACK
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
        status = "regressed"
        message = (
            f"{where} {metric.worse_verb}: {sides}, {change} "
            f"(tolerance {signed_tolerance}, {noise})"
        )
    elif beyond_tolerance and worse_pct < 0 and significant_better:
        status = "improved"
        message = (
            f"{where} {metric.better_verb}: {sides}, {change} (beyond tolerance {tolerance:g}%, "
            f"{noise}); refresh the baseline so later changes are measured from here"
        )
    elif beyond_tolerance:
        status = "ok"
        message = (
            f"{where} ok within noise: {sides}, {change} exceeds tolerance {signed_tolerance} "
            f"but is not significant ({noise})"
        )
    else:
        status = "ok"
        label = noise if test is None else _model_words(test)
        message = f"{where} ok: {sides}, {change} (tolerance {signed_tolerance}; {label})"
    return verdict(status, message, change_pct=change_pct, test=test)


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
    """``0.120 ± 0.001 s (n=3)``; a history: ``0.120 ± 0.004 s between 4 sessions (n=12)``."""
    decimals = _decimals(stats.mean, stats.std)
    spread = f" ± {stats.std:.{decimals}f}" if stats.std is not None else ""
    between = f" between {stats.sessions} sessions" if stats.sessions > 1 else ""
    return f"{stats.mean:.{decimals}f}{spread} {metric.unit}{between} (n={stats.n})"


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class CalibrationRow:
    """One length and metric over K unchanged sessions."""

    length: int
    metric: str
    sessions: int
    mean: float  # of the per-session means
    #: Spread of the per-session means over their mean: the noise a gated rerun meets.
    between_cv: float
    #: Pooled spread of repeats inside a session over the mean; None with one repeat each.
    within_cv: float | None
    #: The smallest whole-percent tolerance an unchanged new session exceeds in the bad direction
    #: with probability below the level. Session-to-session noise is taken as multiplicative:
    #: with ``sd`` the spread of the log session means and
    #: ``b = t(1 - level, K - 1) * sd * sqrt(1 + 1/K)``, it is ``exp(b) - 1`` where higher is
    #: worse and ``1 - exp(-b)`` where lower is (a throughput tolerance stays below 100%);
    #: at least 1%.
    proposed_pct: float

    def to_json(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "metric": self.metric,
            "sessions": self.sessions,
            "mean": self.mean,
            "between_cv": self.between_cv,
            "within_cv": self.within_cv,
            "proposed_pct": self.proposed_pct,
        }


@dataclass(frozen=True)
class Calibration:
    level: float
    run_ids: tuple[str, ...]
    rows: tuple[CalibrationRow, ...]

    def tolerances(self) -> Tolerances:
        """Per length and metric the proposed tolerance; as defaults, each metric's largest."""
        default: dict[str, float | None] = dict(DEFAULT_TOLERANCES)
        per_length: dict[int, dict[str, float | None]] = {}
        for name in METRICS:
            proposed = [row.proposed_pct for row in self.rows if row.metric == name]
            if proposed:
                default[name] = max(proposed)
        for row in self.rows:
            if row.proposed_pct != default[row.metric]:
                per_length.setdefault(row.length, {})[row.metric] = row.proposed_pct
        return Tolerances(default=default, per_length=per_length)

    def info(self, max_sessions: int | None = None) -> BaselineInfo:
        """The header a calibrated baseline file stores."""
        return BaselineInfo(
            tolerance=self.tolerances().describe(),
            max_sessions=max_sessions,
            calibration={
                "level": self.level,
                "sessions": len(self.run_ids),
                "run_ids": list(self.run_ids),
                "rows": [row.to_json() for row in self.rows],
            },
        )

    def table_lines(self) -> list[str]:
        lines = [
            f"{'length':>8}  {'metric':<7} {'mean':>12}  {'between CV':>10}  "
            f"{'within CV':>9}  {'tolerance':>9}"
        ]
        for row in self.rows:
            metric = METRICS[row.metric]
            within = f"{row.within_cv:.1%}" if row.within_cv is not None else "-"
            mean = f"{row.mean:.{_decimals(row.mean)}f} {metric.unit}"
            lines.append(
                f"{format_size(row.length):>8}  {row.metric:<7} {mean:>12}  "
                f"{row.between_cv:>10.1%}  {within:>9}  {row.proposed_pct:>8g}%"
            )
        return lines


def calibrate(records: Iterable[Record], level: float = DEFAULT_LEVEL) -> Calibration:
    """Between- and within-session noise per length and metric, over the sessions (run ids) of
    ``records``, and the tolerances that keep the false-alarm rate of an unchanged rerun judged
    on tolerance alone below ``level``."""
    passed = [record for record in latest_records(records) if record.outcome == "passed"]
    run_ids = tuple(sessions_of(passed))
    if len(run_ids) < 2:
        raise ValueError(
            f"calibration needs two or more sessions with passed points, got {len(run_ids)}"
        )
    rows = []
    for length, group in sorted(_passed_by_length(passed).items()):
        for metric in METRICS.values():
            groups = _session_values(group, metric.figure)
            if len(groups) < 2:
                continue
            means = [_mean(values) for values in groups]
            centre = _mean(means)
            if min(means) <= 0:
                continue
            count = len(groups)
            between_cv = math.sqrt(_variance(means)) / centre
            within_df = sum(len(values) - 1 for values in groups)
            within_cv = (
                math.sqrt(
                    math.fsum(_variance(values) * (len(values) - 1) for values in groups)
                    / within_df
                )
                / centre
                if within_df
                else None
            )
            log_spread = math.sqrt(_variance([math.log(mean) for mean in means]))
            bound = student_t_isf(level, count - 1) * log_spread * math.sqrt(1 + 1 / count)
            ratio = math.expm1(bound) if metric.higher_is_worse else -math.expm1(-bound)
            proposed = max(1.0, float(math.ceil(100 * ratio - 1e-9)))
            rows.append(
                CalibrationRow(length, metric.name, count, centre, between_cv, within_cv, proposed)
            )
    return Calibration(level=level, run_ids=run_ids, rows=tuple(rows))
