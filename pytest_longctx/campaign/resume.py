"""What a resumed run measures again: a warm follow-up needs its prefix in the server's cache.

A passed cold point is normally reported from its record. Its follow-ups reuse the prefix the
cold point left in the cache of the server that measured it, which a new session's server
does not hold: so when any of them is still to be measured, the cold point is measured again
first (its new record is the answer for it, as any re-measured point's is).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_longctx.campaign.run import RecordLog
from pytest_longctx.plan.points import Point
from pytest_longctx.workloads import workload_of


def redo_cold_points(results: RecordLog, selected: Sequence[Point]) -> list[Point]:
    """Measure again each resumed cold point with a selected follow-up left to measure;
    returns them."""
    redo = []
    for point in selected:
        cold = workload_of(point).reuses(point)
        if (
            cold is not None
            and point not in results.resumed
            and cold in results.resumed
            and cold in selected
        ):
            results.measure_again(cold)
            redo.append(cold)
    return redo
