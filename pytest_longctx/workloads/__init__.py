"""The workloads a sweep measures, each in one home behind :class:`Workload`: cold, warm,
interference and concurrency. The session, the campaign and its server ask a point's
workload (:func:`workload_of`) instead of testing what kind of point it is.

Adding a workload is one folder (its home a :class:`Workload` subclass; ``cold/`` is the
smallest) and one line in :data:`REGISTERED`, or, from another distribution, one entry point
(:data:`ENTRY_POINT_GROUP`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points

from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.workloads.cold import ColdWorkload
from pytest_longctx.workloads.concurrency import ConcurrencyWorkload
from pytest_longctx.workloads.interference import InterferenceWorkload
from pytest_longctx.workloads.warm import WarmWorkload
from pytest_longctx.workloads.workload import (
    STUDY_SERVER,
    PointSetup,
    PointStep,
    ReportSection,
    ServerMemory,
    ServerNeeds,
    Workload,
)

#: The entry-point group another distribution registers a workload under: each entry names a
#: :class:`Workload` subclass (``kv_offload = "my_package.kv_offload:KvOffloadWorkload"``),
#: whose module imports the seam from ``pytest_longctx.workloads.workload``.
ENTRY_POINT_GROUP = "pytest_longctx.workloads"


def installed() -> tuple[Workload, ...]:
    """The workloads other distributions register (:data:`ENTRY_POINT_GROUP`), by name."""
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda entry: entry.name)
    return tuple(entry.load()() for entry in found)


#: Every workload, in the order their servers start (the study's first), then those other
#: distributions register.
REGISTERED: tuple[Workload, ...] = (
    ColdWorkload(),
    WarmWorkload(),
    InterferenceWorkload(),
    ConcurrencyWorkload(),
    *installed(),
)
BY_NAME: dict[str, Workload] = {workload.name: workload for workload in REGISTERED}


def report_sections() -> tuple[ReportSection, ...]:
    """Each registered workload's part of every report, in the registry's order: the
    report shell iterates them and names none."""
    return tuple(workload.report for workload in REGISTERED if workload.report is not None)


def named(name: str) -> Workload:
    """The workload of that ``--longctx-workload`` word (or a record's ``cache_state``)."""
    return BY_NAME[name]


def workload_of(point: Point) -> Workload:
    """The workload ``point`` belongs to."""
    return BY_NAME[point.cache_state]


def planned(plan: SweepPlan) -> tuple[Workload, ...]:
    """The workloads ``plan`` measures."""
    return tuple(workload for workload in REGISTERED if workload.planned(plan))


def points_of(plan: SweepPlan) -> tuple[Point, ...]:
    """The plan's points in run order: by server (the study's first, then each workload's
    own: :attr:`Workload.schedule_rank`), within it by pass (``--longctx-order``), a pass's
    follow-ups right after its cold point (while its prefix is cached), its levels rising."""
    passes = plan.passes
    index = {point: position for position, point in enumerate(passes)}

    def order(point: Point) -> tuple[int, int, int, int]:
        rank = workload_of(point).schedule_rank
        return (rank, index[Point(point.length, point.repeat)], point.question, point.concurrency)

    chosen = [point for workload in planned(plan) for point in workload.points(plan, passes)]
    return tuple(sorted(chosen, key=order))


def fitted(plan: SweepPlan) -> SweepPlan:
    """``plan`` with what the capacity plan decides for each planned workload."""
    for workload in planned(plan):
        plan = workload.fitted(plan)
    return plan


def sized_for(plan: SweepPlan, selected: Sequence[Point]) -> SweepPlan:
    """What the server must hold for the ``selected`` points (none selected: the whole
    plan): with no follow-up among them (``-k "not warm"``) a cold run's
    ``--max-model-len``, flags and capacity plan. For sizing only: its points are not the
    selection's."""
    for workload in planned(plan):
        plan = workload.sized_for(plan, selected)
    return plan


def capacity_table(plan: SweepPlan, lengths: Sequence[int]) -> str:
    """The capacity plan for ``lengths``: the study's table, then each planned workload's."""
    own = [line for workload in planned(plan) for line in workload.capacity_lines(plan, lengths)]
    return capacity_check.render_table(plan, lengths, own)


def launch_refusal(plan: SweepPlan) -> str | None:
    """Why a planned workload cannot be measured on the server the profile launches."""
    return next(filter(None, (workload.launch_refusal(plan) for workload in planned(plan))), None)


def served_by(server: str, plan: SweepPlan) -> tuple[Workload, ...]:
    """The workloads of ``plan`` whose points run on ``server`` (the study's: ``cold``)."""
    return tuple(w for w in REGISTERED if w.server == server and w.planned(plan))


def server_for(points: Iterable[Point]) -> str:
    """The one server all ``points`` run on, else (none, or several) the study's."""
    servers = {workload_of(point).server for point in points}
    return servers.pop() if len(servers) == 1 else STUDY_SERVER


__all__ = [
    "BY_NAME",
    "ENTRY_POINT_GROUP",
    "REGISTERED",
    "STUDY_SERVER",
    "PointSetup",
    "PointStep",
    "ReportSection",
    "ServerMemory",
    "ServerNeeds",
    "Workload",
    "named",
    "report_sections",
    "planned",
    "points_of",
    "capacity_table",
    "fitted",
    "installed",
    "launch_refusal",
    "served_by",
    "sized_for",
    "server_for",
    "workload_of",
]
