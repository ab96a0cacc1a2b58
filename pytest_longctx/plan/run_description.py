"""What a run is, fixed when the session is configured (settings, plan, id, folder and its
place in the campaign): read by the workloads and the campaign alike, written by neither."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.plan.points import SweepPlan
from pytest_longctx.plan.servers import ServerSlot
from pytest_longctx.plan.settings import Settings


@dataclass(frozen=True)
class Placement:
    """Where a session stands in its campaign, known when it is configured: the servers, the
    one it measures, its pytest-xdist worker id and the campaign's start."""

    #: See :class:`Placement` (given to :meth:`create`).
    servers: tuple[ServerSlot, ...] = (ServerSlot(0),)
    slot: ServerSlot = ServerSlot(0)
    worker: str | None = None
    split_error: str | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class RunDescription:
    """What a run is, fixed when the session is configured: its settings and plan, its id and
    folder, and where the session stands in its campaign."""

    settings: Settings
    plan: SweepPlan
    output_root: Path
    run_id: str
    run_dir: Path
    #: Where the session stands in its campaign (see :class:`Placement`).
    placement: Placement = Placement()
