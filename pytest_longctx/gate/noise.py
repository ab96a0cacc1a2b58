"""Is a change more than noise: one-sided t-tests, Student's t without SciPy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: One-sided false-alarm level of the noise test when no level is given.
DEFAULT_LEVEL = 0.01

LEVEL_FORM = "a probability between 0 and 0.5, e.g. 0.01 (a 1% one-sided false-alarm level)"

#: Sessions a baseline history keeps by default; older ones drop out as new ones are appended.
DEFAULT_MAX_SESSIONS = 10

#: Changes this close to the tolerance (in percentage points) count as within it, so that
#: ``1.0 s -> 1.1 s`` passes a 10% tolerance despite binary floating point.
PERCENT_SLACK = 1e-9


class LevelError(ValueError):
    """A level that does not parse; the caller names the option it came from."""

    def __init__(self, text: object) -> None:
        super().__init__(f"expected {LEVEL_FORM}")
        self.text = text

    def for_option(self, option: str) -> str:
        """The message under the name the user gave the level by."""
        return f"{option}={self.text}: {self}"


def parse_level(text: object) -> float:
    """``0.01`` or ``1%`` -> 0.01; anything outside (0, 0.5) is refused with the accepted form."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value < 0.5):
        raise LevelError(text)
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
    var_before = sample_variance(before) / n_before
    var_after = sample_variance(after) / n_after
    se2 = var_before + var_after
    terms = [(var_before, n_before - 1), (var_after, n_after - 1)]
    delta = sample_mean(after) - sample_mean(before)
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
    means = [sample_mean(values) for values in groups]
    between = sample_variance(means) * (1.0 + 1.0 / count)
    terms = [(between, count - 1)]
    within_df = sum(len(values) - 1 for values in (*groups, after))
    n_base = count / sum(1.0 / len(values) for values in groups)  # harmonic mean of repeats
    n_now = len(after)
    if within_df > 0 and n_now < n_base:
        pooled = (
            math.fsum(sample_variance(values) * (len(values) - 1) for values in (*groups, after))
            / within_df
        )
        terms.append((pooled * (1.0 / n_now - 1.0 / n_base), within_df))
    se2 = math.fsum(term for term, _ in terms)
    delta = sample_mean(after) - sample_mean(means)
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


def sample_mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def sample_variance(values: Sequence[float]) -> float:
    """Sample variance (divisor n - 1); 0.0 for a single value."""
    if len(values) < 2:
        return 0.0
    mean = sample_mean(values)
    return math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1)
