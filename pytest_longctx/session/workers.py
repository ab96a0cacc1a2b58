"""One campaign over several servers with pytest-xdist: each worker owns exactly one server.

The controller makes the run (its id and folder) and the split of the machine into servers;
every worker gets the run id and its own server slot through ``workerinput``, measures its
points against that server alone and appends their records to the run's one results file.
The controller schedules the points longest first (``scheduling.py``), keeps the records the
workers report, records a point whose worker died, and writes the reports.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from pytest_longctx.campaign.run import Run
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.run_description import Placement
from pytest_longctx.plan.servers import ServerSlot, ServerSplitError, split_servers
from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles.hardware import core_siblings

RUN_ID_KEY = "longctx_run_id"
STARTED_KEY = "longctx_started_at"
RESUMED_KEY = "longctx_resumed"
#: What an attached server said of itself to the controller, for a session that chose no
#: profile: every worker plans from the same answer (asking again, one could time out and
#: collect another range, which pytest-xdist refuses).
SERVER_SETTINGS_KEY = "longctx_server_settings"
SLOT_KEY = "longctx_server_slot"
SPLIT_ERROR_KEY = "longctx_split_error"


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def planned_workers(config: pytest.Config) -> int:
    """How many workers pytest-xdist will start (0 in a serial session or on a worker)."""
    if is_worker(config) or config.getoption("dist", "no") == "no":
        return 0
    if config.getoption("collectonly", False) or not config.getoption("tx", None):
        return 0
    from xdist.workermanage import parse_tx_spec_config

    return len(parse_tx_spec_config(config))  # "2*popen" is two workers


def server_settings_from_controller(config: pytest.Config) -> dict[str, Any] | None:
    """On a worker of a session attached without a profile: what the server said to the
    controller (:class:`~pytest_longctx.profiles.ServerSettings`' fields)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get(SERVER_SETTINGS_KEY) if workerinput else None


def run_from_controller(config: pytest.Config) -> tuple[str, bool] | None:
    """On a worker: the controller's run id, and whether that run is resumed."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or RUN_ID_KEY not in workerinput:
        return None
    return str(workerinput[RUN_ID_KEY]), bool(workerinput.get(RESUMED_KEY))


def place(config: pytest.Config, settings: Settings, plan: SweepPlan) -> Placement:
    """This session's place in its campaign: the servers, its own, its worker id."""
    servers, split_error = split(config, settings, plan)
    return Placement(
        servers=servers,
        slot=own_slot(config, servers),
        worker=worker_id(config),
        split_error=split_error,
        started_at=session_started_at(config),
    )


def split(
    config: pytest.Config, settings: Settings, plan: SweepPlan
) -> tuple[tuple[ServerSlot, ...], str | None]:
    """The campaign's servers, and why the workers cannot each have one (then none starts);
    a usage error where that is the command line's own doing."""
    split_error = None
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get(SPLIT_ERROR_KEY):
        split_error = str(workerinput[SPLIT_ERROR_KEY])
    workers = planned_workers(config)
    if not workers and settings.plan_only:
        workers = _requested_workers(config)
    if workers and config.getoption("dist", "no") == "each":
        # Every worker would measure every point: a run holds each point once.
        split_error = (
            "--dist each runs every sweep point on every worker; a run measures each point "
            "once: use -n N (--dist load)"
        )
    cores = sorted(os.sched_getaffinity(0))
    try:
        servers = split_servers(
            settings,
            plan.profile,
            workers,
            cores,
            environ=os.environ,
            siblings=core_siblings(cores),
        )
    except ServerSplitError as exc:
        on_command_line = config.getoption("longctx_url", None) or config.getoption(
            "longctx_devices_per_server", None
        )
        if on_command_line or settings.plan_only:
            raise pytest.UsageError(str(exc)) from None
        # `-n 8` over a project's other tests must not fail for a sweep it does not select:
        # the sweep's items fail with the reason once one needs a server.
        return tuple(ServerSlot(i) for i in range(max(workers, 1))), str(exc)
    return servers, split_error


def _requested_workers(config: pytest.Config) -> int:
    value = config.getoption("numprocesses", None)
    return value if isinstance(value, int) else 0


def own_slot(config: pytest.Config, servers: tuple[ServerSlot, ...]) -> ServerSlot:
    """The server this session (or this worker) measures."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput and SLOT_KEY in workerinput:
        data = dict(workerinput[SLOT_KEY])
        return ServerSlot(
            index=int(data["index"]),
            endpoint=data.get("endpoint"),
            devices=tuple(str(d) for d in data.get("devices") or ()),
            cores=tuple(data.get("cores") or ()),
            env=dict(data.get("env") or {}),
        )
    return servers[0]


def keep_plan_serial(config: pytest.Config) -> None:
    """``--longctx-plan -n N`` prints the plan (and the split) here; no workers start."""
    if planned_workers(config):
        config.option.dist = "no"
        config.option.tx = []


def wait_for_length(
    run: Run, length: int, started_at: float, poll_s: float = 0.5, limit_s: float | None = None
) -> None:
    """Under xdist, a gate item waits until every selected point of its length has a record.

    The points of a length may run on other workers; the gate reads the shared results file,
    so it must not judge before they are in it. A point whose worker died gets its record
    from the controller. Points that never run (the session stopped early, no worker left)
    end the wait after ``limit_s`` (default: the profile's first-token limit); the gate then
    names what is missing.
    """
    wanted = {p for p in run.selected_points if p.length == length and p not in run.results.resumed}
    limit_s = run.plan.profile.sweep.first_token_timeout_s if limit_s is None else limit_s
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done = {
            Point.of_record(r)
            for r in run.results.all_records()
            if r.length == length and (r.finished_at or 0) >= started_at
        }
        if wanted <= done:
            return
        time.sleep(poll_s)


def session_started_at(config: pytest.Config) -> float | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get(STARTED_KEY) if workerinput else None
