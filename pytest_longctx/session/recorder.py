"""Turns each finished sweep item into a record, appended before the next item starts."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from pytest_longctx.campaign.run import Run
from pytest_longctx.core.records import Record
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import Point
from pytest_longctx.session import outputs
from pytest_longctx.session.items import point_of, record_identity
from pytest_longctx.session.outputs import REPORT_ATTRIBUTE
from pytest_longctx.session.stash import MEASUREMENT_KEY
from pytest_longctx.workloads import workload_of

#: On a worker's report of a point it hands back, for the controller (controller.py).
HANDED_BACK_ATTRIBUTE = "longctx_handed_back"


def _reason(call: pytest.CallInfo[None], report: pytest.TestReport) -> str | None:
    if report.passed:
        return None
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    if call.excinfo is not None:
        return call.excinfo.exconly().strip()
    return report.longreprtext.strip().splitlines()[-1] if report.longreprtext else None


#: Record fields a JUnit XML file (``--junitxml``) carries as each point's properties.
PROPERTY_FIGURES = (("ttft", "longctx_ttft_s"), ("decode_throughput", "longctx_decode_tok_s"))


def record_properties(item: pytest.Item, record: Record) -> None:
    """The point's figures as the item's ``user_properties`` (what ``record_property`` sets),
    so JUnit XML and any report reading them gets the numbers, not only a name and duration;
    a point that did not pass also carries its failure class and reason."""
    properties: list[tuple[str, object]] = [
        ("longctx_run_id", record.run_id),
        ("longctx_length", record.length),
        ("longctx_repeat", record.repeat),
        ("longctx_outcome", record.outcome),
    ]
    if record.outcome != "passed":
        if record.failure_class is not None:
            properties.append(("longctx_failure_class", record.failure_class))
        if record.reason:
            properties.append(("longctx_reason", record.reason))
    properties += [
        (name, record.figures[figure])
        for figure, name in PROPERTY_FIGURES
        if figure in record.figures
    ]
    if record.fidelity.get("verdict"):
        properties.append(("longctx_fidelity", record.fidelity["verdict"]))
    if record.prompt_tokens is not None:
        properties.append(("longctx_prompt_tokens", record.prompt_tokens))
    if record.completion_tokens is not None:
        properties.append(("longctx_completion_tokens", record.completion_tokens))
    known = {name for name, _ in item.user_properties}
    item.user_properties.extend(p for p in properties if p[0] not in known)


def _classify(
    call: pytest.CallInfo[None], report: pytest.TestReport, outcome: str
) -> tuple[str | None, tuple[str, ...]]:
    """The record's failure class and its evidence, from what the item raised.

    The measurement and the server lifecycle raise with a class attached; an assertion of the
    sweep test's own (exact, cold, alone) is a ``contract`` failure; a skip carries a class
    only when a failure caused it (a length vLLM refused, one that crashed too often, a point
    a worker whose server was lost handed back).
    """
    if outcome == "passed":
        return None, ()
    value = call.excinfo.value if call.excinfo is not None else None
    failure_class = getattr(value, "failure_class", None)
    if failure_class is not None:
        return failure_class, tuple(getattr(value, "evidence", ()) or ())
    if outcome == "skipped":
        return None, ()
    if report.when == "call" and isinstance(value, AssertionError):
        return "contract", ()
    return "error", ()


def _server_start(starts: Sequence[dict]) -> dict:
    """The server start that measured the record's point: the session's last so far."""
    return dict(starts[-1]) if starts else {}


def on_item_start(run: Run, item: pytest.Item) -> None:
    point = point_of(item)
    if point is None or run.settings.plan_only or point in run.results.resumed:
        return
    run.sweep.in_flight = (item.nodeid, point, time.time())


def _past_positions(run: Run, point: Point) -> int | None:
    """The model's trained positions where the point runs past them (a launched server's
    model is the profile's; an attached one's is its own, not known here)."""
    if run.settings.url:
        return None
    tokens = point.prompt_tokens + run.plan.decode_tokens
    return capacity_check.past_positions(run.plan.profile, tokens)


def on_item_end(run: Run) -> None:
    run.sweep.in_flight = None


def record_interrupted(config: pytest.Config, run: Run, starts: Sequence[dict]) -> None:
    """The point a stopped session was measuring: kept as interrupted, measured on resume;
    ``starts``: the session's server starts (:class:`lifecycle.ServerLifecycle`)."""
    if run.sweep.in_flight is None:
        return
    nodeid, point, started = run.sweep.in_flight
    run.sweep.in_flight = None
    if any(r.nodeid == nodeid for r in run.results.written):
        return  # it reported before the interrupt reached it
    received = run.sweep.signals.received if run.sweep.signals is not None else None
    record = Record(
        run_id=run.run_id,
        nodeid=nodeid,
        **record_identity(point),
        outcome="interrupted",
        reason="the session was stopped during this point" + (f" ({received})" if received else ""),
        fingerprint=run.findings.fingerprint,
        started_at=started,
        finished_at=time.time(),
        failure_class="interrupted",
        server_start=_server_start(starts),
        past_positions=_past_positions(run, point),
    )
    run.results.append(record)
    config.hook.pytest_longctx_record(config=config, record=record)


def on_report(
    run: Run,
    item: pytest.Item,
    call: pytest.CallInfo[None],
    report: pytest.TestReport,
    starts: Sequence[dict],
) -> None:
    config = item.config
    point = point_of(item)
    if point is None or run.settings.plan_only:
        return
    if point in run.results.resumed:
        if report.when == "call":
            setattr(report, REPORT_ATTRIBUTE, run.results.resumed[point].to_json())
            record_properties(item, run.results.resumed[point])
        return
    outcome: str
    if report.when == "call":
        outcome = report.outcome
    elif report.when == "setup" and not report.passed:
        outcome = "skipped" if report.skipped else "error"
    else:
        return
    measurement = item.stash.get(MEASUREMENT_KEY, None)
    identity = record_identity(point)
    workload = workload_of(point)
    if measurement is not None:
        identity = workload.measured_identity(identity, measurement)
    failure_class, evidence = _classify(call, report, outcome)
    record = Record(
        run_id=run.run_id,
        nodeid=item.nodeid,
        **identity,
        outcome=outcome,
        reason=_reason(call, report),
        figures=measurement.figures() if measurement else {},
        prompt_tokens=measurement.prompt_tokens if measurement else None,
        completion_tokens=measurement.completion_tokens if measurement else None,
        server_metrics=measurement.server_metrics() if measurement else {},
        fingerprint=run.findings.fingerprint,
        stream=measurement.stream if measurement else {},
        energy=measurement.energy if measurement else {},
        fidelity=measurement.fidelity if measurement else {},
        server_timing=measurement.server_timing if measurement else {},
        started_at=call.start,
        finished_at=time.time(),
        failure_class=failure_class,
        evidence=evidence,
        server_start=_server_start(starts),
        past_positions=_past_positions(run, point),
    )
    run.results.append(record)
    setattr(report, REPORT_ATTRIBUTE, record.to_json())
    record_properties(item, record)
    if call.excinfo is not None and getattr(call.excinfo.value, "handed_back", False):
        setattr(report, HANDED_BACK_ATTRIBUTE, run.worker)
    if outcome == "passed" and measurement is not None and workload.grows_ttft_budget:
        slowest = max(measurement.ttft_s, run.sweep.measured_ttft.get(point.length, 0.0))
        run.sweep.measured_ttft[point.length] = slowest
    config.hook.pytest_longctx_record(config=config, record=record)
    outputs.after_record(run.description, run.results)
