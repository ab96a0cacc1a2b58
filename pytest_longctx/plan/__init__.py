"""The plan: options and a profile in, the points a session measures out (and their capacity,
in :mod:`pytest_longctx.capacity`)."""

from __future__ import annotations

from .points import SLOW_MARK, VERY_SLOW_MARK, PlanError, Point, SweepPlan, build_plan
from .settings import Settings

__all__ = [
    "SLOW_MARK",
    "VERY_SLOW_MARK",
    "PlanError",
    "Point",
    "Settings",
    "SweepPlan",
    "build_plan",
]
