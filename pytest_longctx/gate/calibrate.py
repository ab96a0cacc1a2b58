"""From K unchanged sessions: the noise between them and the tolerances it allows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pytest_longctx.core.records import (
    Record,
)
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records

from .baseline import BaselineInfo, sessions_of
from .noise import DEFAULT_LEVEL, sample_mean, sample_variance, student_t_isf
from .tolerances import DEFAULT_TOLERANCES, METRICS, Tolerances
from .verdicts import passed_by_length, session_values, shown_decimals


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
            mean = f"{row.mean:.{shown_decimals(row.mean)}f} {metric.unit}"
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
    for length, group in sorted(passed_by_length(passed).items()):
        for metric in METRICS.values():
            if metric.per_level:
                continue  # levels differ by design: it takes the decode tolerance
            state = [r for r in group if r.cache_state == metric.cache_state]
            groups = session_values(state, metric.figure)
            if len(groups) < 2:
                continue
            means = [sample_mean(values) for values in groups]
            centre = sample_mean(means)
            if min(means) <= 0:
                continue
            count = len(groups)
            between_cv = math.sqrt(sample_variance(means)) / centre
            within_df = sum(len(values) - 1 for values in groups)
            within_cv = (
                math.sqrt(
                    math.fsum(sample_variance(values) * (len(values) - 1) for values in groups)
                    / within_df
                )
                / centre
                if within_df
                else None
            )
            log_spread = math.sqrt(sample_variance([math.log(mean) for mean in means]))
            bound = student_t_isf(level, count - 1) * log_spread * math.sqrt(1 + 1 / count)
            ratio = math.expm1(bound) if metric.higher_is_worse else -math.expm1(-bound)
            proposed = max(1.0, float(math.ceil(100 * ratio - 1e-9)))
            rows.append(
                CalibrationRow(length, metric.name, count, centre, between_cv, within_cv, proposed)
            )
    return Calibration(level=level, run_ids=run_ids, rows=tuple(rows))
