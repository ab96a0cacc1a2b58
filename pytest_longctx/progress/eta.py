"""What the remaining points will cost: a TTFT model fitted to the points measured so far.

TTFT(L) = a + b·L + c·L², with a, b, c >= 0: a fixed cost, the linear part of prefill
(weights, MLPs) and the quadratic part (attention over the context). It is fitted to the mean
TTFT of each measured length by least squares on *relative* residuals, ``(model - y) / y``, so
a 1Ki point counts as much as a 1Mi point; the coefficients are kept non-negative by trying
every subset of terms (an exact non-negative least squares for three terms) and keeping the
best subset whose solution is non-negative. With exactly as many lengths as terms several
subsets fit exactly; the order of :data:`_SUBSETS` decides (no fixed cost first, since long
points dominate what an ETA is for). Before two lengths are measured there is no model.

Decode time is ``(N - 1)`` tokens at a per-token time fitted the same way, ``d + e·L``, to
``1 / decode_throughput``. A point's cost is its TTFT plus its decode time; the sweep's ETA is
the sum over the points left, so the long points weigh what they take.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size

#: Subsets of (fixed, linear, quadratic) in order of preference when residuals tie.
_SUBSETS: tuple[tuple[int, ...], ...] = (
    (0, 1, 2),
    (1, 2),
    (0, 2),
    (0, 1),
    (2,),
    (1,),
    (0,),
)
_TIE = 1e-9


def fit_nonnegative(
    lengths: Sequence[float], values: Sequence[float], degree: int = 2
) -> tuple[float, ...] | None:
    """Coefficients ``(c0, c1, ..., c_degree) >= 0`` of a polynomial in L minimising the sum of
    squared relative residuals; None with fewer than two distinct lengths or non-positive
    values."""
    points = sorted(
        {float(length): float(value) for length, value in zip(lengths, values, strict=True)}.items()
    )
    if len(points) < 2 or any(value <= 0 or not math.isfinite(value) for _, value in points):
        return None
    xs = np.array([length for length, _ in points])
    ys = np.array([value for _, value in points])
    scale = float(xs.max())
    # Columns L^k / y, scaled by scale^k so they are of comparable size; target 1.
    columns = np.stack([(xs / scale) ** k / ys for k in range(degree + 1)], axis=1)
    target = np.ones_like(ys)
    best: tuple[float, tuple[float, ...]] | None = None
    for subset in _SUBSETS:
        if max(subset) > degree or len(subset) > len(points):
            continue
        solution, *_ = np.linalg.lstsq(columns[:, subset], target, rcond=None)
        if np.any(solution < 0) or not np.all(np.isfinite(solution)):
            continue
        residual = float(np.sum((columns[:, subset] @ solution - target) ** 2))
        if best is None or residual < best[0] - _TIE:
            full = [0.0] * (degree + 1)
            for k, value in zip(subset, solution, strict=True):
                full[k] = float(value) / scale**k
            best = (residual, tuple(full))
    return best[1] if best else None


def _evaluate(coefficients: Sequence[float], length: float) -> float:
    return math.fsum(c * length**k for k, c in enumerate(coefficients))


@dataclass(frozen=True)
class TtftModel:
    """TTFT(L) = a + b·L + c·L², fitted to ``lengths``."""

    a: float
    b: float
    c: float
    lengths: tuple[int, ...]

    def __call__(self, length: float) -> float:
        return _evaluate((self.a, self.b, self.c), length)

    def describe(self) -> str:
        terms = [
            f"{self.a:.3g}" if self.a else "",
            f"{self.b:.3g}·L" if self.b else "",
            f"{self.c:.3g}·L²" if self.c else "",
        ]
        formula = " + ".join(term for term in terms if term) or "0"
        span = f"{format_size(self.lengths[0])}..{format_size(self.lengths[-1])}"
        return f"TTFT ≈ {formula} s, fitted to {len(self.lengths)} lengths ({span})"


def passed_means(records: Iterable[Record], figure: str) -> dict[int, float]:
    """Mean of ``figure`` per length over the passed cold records that carry it (a warm
    follow-up's TTFT is its suffix's, not its length's; an interference point's is under
    load)."""
    sums: dict[int, list[float]] = {}
    for record in records:
        value = record.figures.get(figure)
        cold = record.outcome == "passed" and record.cache_state == "cold"
        if cold and value is not None and value > 0:
            sums.setdefault(record.length, []).append(value)
    return {length: math.fsum(values) / len(values) for length, values in sorted(sums.items())}


def fit_ttft(records: Iterable[Record]) -> TtftModel | None:
    """The model from the passed records' client TTFT; None before two lengths."""
    means = passed_means(records, "ttft")
    coefficients = fit_nonnegative(list(means), list(means.values()))
    if coefficients is None:
        return None
    a, b, c = coefficients
    return TtftModel(a, b, c, tuple(means))


@dataclass(frozen=True)
class CostModel:
    """A point's predicted wall time: TTFT plus decode."""

    ttft: TtftModel | None
    #: Seconds per decoded token as a function of L: ``(d, e)`` of ``d + e·L``.
    token_time: tuple[float, float] | None
    decode_tokens: int

    @classmethod
    def fit(cls, records: Iterable[Record], decode_tokens: int) -> CostModel:
        records = list(records)
        rates = passed_means(records, "decode_throughput")
        token_time = None
        if len(rates) >= 2:
            fitted = fit_nonnegative(list(rates), [1 / rate for rate in rates.values()], 1)
            token_time = (fitted[0], fitted[1]) if fitted else None
        elif len(rates) == 1:
            token_time = (1 / next(iter(rates.values())), 0.0)
        return cls(fit_ttft(records), token_time, decode_tokens)

    def predicted_ttft(self, length: int) -> float | None:
        return self.ttft(length) if self.ttft is not None else None

    def decode_time(self, length: int, tokens: int | None = None) -> float | None:
        """Seconds to decode ``tokens`` (default: all but the first) after the first token."""
        if self.token_time is None:
            return None
        count = self.decode_tokens - 1 if tokens is None else tokens
        return max(0, count) * (self.token_time[0] + self.token_time[1] * length)

    def point_cost(self, length: int) -> float | None:
        """Predicted seconds for a whole point; None when either part is unknown."""
        ttft, decode = self.predicted_ttft(length), self.decode_time(length)
        return None if ttft is None or decode is None else ttft + decode

    def sweep_cost(self, lengths: Iterable[int]) -> float | None:
        """Predicted seconds for these points; None when any of them cannot be predicted."""
        total = 0.0
        for length in lengths:
            cost = self.point_cost(length)
            if cost is None:
                return None
            total += cost
        return total


def first_token_eta(
    model: TtftModel | None,
    length: int,
    elapsed_s: float,
    prefilled: int | None,
    rate: float | None,
) -> float | None:
    """Seconds to the first token of a point ``elapsed_s`` in, ``prefilled`` tokens done.

    With a model and some progress: the model's remaining time, scaled by how fast this point
    went so far against the model (``elapsed / model(prefilled)``). Without a model: the
    remaining tokens at the current rate. Without progress: the model's TTFT less the time
    spent. None when nothing says.
    """
    if prefilled is not None and prefilled >= length:
        return 0.0
    if model is not None and prefilled and model(prefilled) > 0:
        scale = elapsed_s / model(prefilled)
        return max(0.0, scale * (model(length) - model(prefilled)))
    if prefilled is not None and rate:
        return max(0.0, (length - prefilled) / rate)
    if model is not None:
        return max(0.0, model(length) - elapsed_s)
    return None


def format_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 20 s``, ``2 h 05 min``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"
