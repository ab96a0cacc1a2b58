"""The pytest-xdist controller's part of a campaign over several servers.

Registered when distribution is asked for, like xdist's own ``DSession``. It hands each
worker the run id and its server slot, and stays out of the way until the workers' collections
show sweep points: then the controller's sweep session starts (outputs, signals, progress),
points go out longest first (``scheduling.py``), and the records the workers report are kept.
A session without sweep points gets xdist's own scheduling and nothing else.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from pytest_longctx.campaign.lifecycle import CRASH_CLASSES
from pytest_longctx.campaign.run import Run
from pytest_longctx.core.records import Record
from pytest_longctx.session import activation
from pytest_longctx.session.items import point_of_nodeid, record_identity
from pytest_longctx.session.outputs import REPORT_ATTRIBUTE, after_record
from pytest_longctx.session.recorder import HANDED_BACK_ATTRIBUTE
from pytest_longctx.session.workers import (
    RESUMED_KEY,
    RUN_ID_KEY,
    SERVER_SETTINGS_KEY,
    SLOT_KEY,
    SPLIT_ERROR_KEY,
    STARTED_KEY,
)

#: How a handed-back point that no worker could take ends its reason.
NOT_MEASURED = "not measured (a resumed session measures it)"


class Controller:
    """The xdist controller's part: hand out the run and the slots, keep what workers report."""

    def __init__(self, config: pytest.Config, run: Run) -> None:
        self.config = config
        self.run = run
        self.slot_of: dict[str, int] = {}
        self.started_at = time.time()
        self.session: pytest.Session | None = None
        self.scheduler: Any = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Longest points first, when xdist distributes by load (``-n N``, ``--dist load``)."""
        if config.getoption("dist", "no") != "load":
            return None
        # pytest-xdist is an optional dependency: its scheduler base class only loads here.
        from pytest_longctx.session.scheduling import LongestFirstScheduling

        self.scheduler = LongestFirstScheduling(config, log, self.run)
        return self.scheduler

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the records the workers appended (they travel on their reports); a point a
        worker handed back goes to the others, or is recorded as not measured when none is
        left to take it (before the terminal and other plugins read the report). A point
        that crashed its worker's server has the scheduler wait for that worker's next."""
        if activation.active(self.config) is None:
            return
        node = getattr(report, "node", None)
        worker = getattr(report, HANDED_BACK_ATTRIBUTE, None)
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if self.scheduler is not None and node is not None:
            if worker:
                if not self.scheduler.hand_back(node, report.nodeid):
                    self.not_measured(report, worker)
                    return
            elif data and data.get("failure_class") in CRASH_CLASSES:
                self.scheduler.doubt(node)  # its server may be lost: the points it holds too
            elif report.when == "setup" and point_of_nodeid(self.run.plan, report.nodeid):
                self.scheduler.trust(node)  # it started a point: its server is there
        if not data:
            return
        record = Record.from_json(data)
        if any(
            r.nodeid == record.nodeid and r.outcome == record.outcome
            for r in self.run.results.written
        ):
            return
        self.run.results.written.append(record)
        after_record(self.run.description, self.run.results)

    def not_measured(self, report: pytest.TestReport, worker: str) -> None:
        """A point handed back when no other worker was left to take it: the worker's record
        said it was handed to the others; a newer record of the point says it was not
        measured, and why, and the report says so too. A resumed session measures it."""
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if not data:
            return
        handed = Record.from_json(data)
        # the worker's reason: the cause, then its last line saying the point was handed on
        cause = (handed.reason or "").rpartition("\n")[0] or (handed.reason or "")
        reason = (
            f"{cause}\n{worker} takes no more points, and no other worker was left to take "
            f"this one: {NOT_MEASURED}"
        )
        record = dataclasses.replace(handed, reason=reason, finished_at=time.time())
        self.run.results.append(record)
        setattr(report, REPORT_ATTRIBUTE, record.to_json())
        if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            path, lineno, _ = report.longrepr
            report.longrepr = (path, lineno, reason)
        after_record(self.run.description, self.run.results)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """A new worker (also one replacing a crashed worker) gets a free server slot."""
        taken = set(self.slot_of.values())
        index = next(i for i in range(len(self.run.servers)) if i not in taken)
        self.slot_of[node.gateway.id] = index
        node.workerinput[RUN_ID_KEY] = self.run.run_id
        node.workerinput[RESUMED_KEY] = bool(self.run.settings.resume)
        node.workerinput[STARTED_KEY] = self.started_at
        node.workerinput[SPLIT_ERROR_KEY] = self.run.split_error
        node.workerinput[SLOT_KEY] = dataclasses.asdict(self.run.servers[index])
        asked = self.run.plan.profile.from_server
        if asked is not None:  # the workers plan from the controller's answer
            node.workerinput[SERVER_SETTINGS_KEY] = dataclasses.asdict(asked)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The controller collects nothing itself: the selection is what the workers collected."""
        if self.run.selected_points:
            return
        points = [p for p in (point_of_nodeid(self.run.plan, i) for i in ids) if p is not None]
        if not points:
            return
        self.run.selected_points = points
        activation.activate(self.config, self.session)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.slot_of.pop(node.gateway.id, None)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        """The point a dead worker was measuring: recorded as an error, measured on resume."""
        point = point_of_nodeid(self.run.plan, crashitem)
        if point is None or point in self.run.results.resumed:
            return
        if any(r.nodeid == crashitem for r in self.run.results.written):
            return  # it reported before its worker died (while stopping its server)
        worker = getattr(getattr(report, "node", None), "gateway", None)
        name = getattr(worker, "id", "a worker")
        record = Record(
            run_id=self.run.run_id,
            nodeid=crashitem,
            **record_identity(point),
            outcome="error",
            reason=f"worker {name} died while measuring this point",
            finished_at=time.time(),
            failure_class="error",
        )
        self.run.results.append(record)
        setattr(report, REPORT_ATTRIBUTE, record.to_json())
