"""The gated metrics and how much change in the bad direction each may show."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.sizes import SizeError, format_size, parse_size
from pytest_longctx.workloads import REGISTERED

#: Gated metrics in report order (the registry's: each workload's, cold's first).
METRICS: Mapping[str, Metric] = {
    metric.name: metric for workload in REGISTERED for metric in workload.gate_metrics
}

DEFAULT_TOLERANCES: Mapping[str, float] = {
    name: metric.default_tolerance_pct
    for name, metric in METRICS.items()
    if metric.falls_back_to is None
}


TOLERANCE_FORM = (
    "comma-separated METRIC=PERCENT or LENGTH:METRIC=PERCENT items, "
    "e.g. 'ttft=10%,decode=5%,64Ki:ttft=20%,1Mi:itl=off'; "
    f"METRIC is one of {', '.join(METRICS)}; PERCENT is a number of percent, '%' optional "
    "(10 and 10% both mean ten percent; 0.1 is refused as ambiguous, write 0.1% or 10%), "
    "or 'off' to stop gating that metric"
)


class ToleranceError(ValueError):
    """A tolerance spec that does not parse; the caller names the option it came from."""

    def __init__(self, part: str, problem: str) -> None:
        super().__init__(f"{part!r} {problem}; expected {TOLERANCE_FORM}")
        self.part = part

    def for_option(self, option: str) -> str:
        return f"{option}: {self}"


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
        fallback = METRICS[metric].falls_back_to if metric in METRICS else None
        if metric not in self.default and fallback is not None:
            return self.for_metric(fallback, length)
        return self.default.get(metric)

    def describe(self) -> str:
        """The spec back as text (parses to an equal value), for report headers."""
        parts = [
            f"{name}={_format_tolerance(self.default.get(name))}"
            for name in METRICS
            if name in self.default
        ]
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


def parse_percent(text: str) -> float:
    """``10%`` or ``10`` as 10.0; raises ValueError saying what is wrong (``0.1`` is refused
    as ambiguous: a fraction or a percent?)."""
    number_text = text[:-1].strip() if text.endswith("%") else text
    try:
        value = float(number_text)
    except ValueError:
        raise ValueError(f"has a bad percentage {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"has a bad percentage {text!r} (must be 0 or more)")
    if not text.endswith("%") and 0 < value < 1:
        raise ValueError(f"has an ambiguous percentage {text!r} (a fraction or a percent?)")
    return value


def _parse_percent(part: str, text: str) -> float | None:
    if text.lower() == "off":
        return None
    try:
        return parse_percent(text)
    except ValueError as exc:
        raise ToleranceError(part, str(exc)) from None
