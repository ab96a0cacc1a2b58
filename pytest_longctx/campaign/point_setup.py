"""What the session decides for a point before it is measured: its budgets, its stream's
checks, and what its workload decides beyond them (:meth:`Workload.settings`).

The session decides (budgets, nonces, which tokenizer) and judges what came back;
:mod:`pytest_longctx.measure.measurement` measures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_longctx.campaign import budgets
from pytest_longctx.core.records import Record
from pytest_longctx.measure.measurement import PointSettings
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.workloads import PointSetup, workload_of


def prepare(
    run: RunDescription,
    server: ServerInfo,
    point: Point,
    *,
    selected: Sequence[Point],
    records: Sequence[Record],
    measured_ttft: Mapping[int, float],
    stream_interval: int | None,
) -> PointSetup:
    """The point's settings, with the first-token budget grown from the TTFT this process
    ``measured_ttft`` so far, or from what the run knows before (its ``records``, the
    profile: :mod:`budgets`), the point's planned slowest engine step (the least a request
    abandoned mid-step is waited for) and the server's ``stream_interval`` as the warm-ups
    showed it; its workload's own setup knows the points ``selected``."""
    workload = workload_of(point)
    budget_s, source = budgets.first_token_budget(
        run, records, measured_ttft, point.length, workload.requests(point)
    )
    settings = PointSettings(
        decode_tokens=run.plan.decode_tokens,
        first_token_budget_s=budget_s,
        budget_source=source,
        allow_unverified=run.settings.allow_unverified,
        stream_interval=stream_interval,
        planned_step_s=budgets.planned_step_s(run, records, point.length, workload.server),
    )
    return PointSetup(
        workload.settings(run, server, point, settings),
        run.run_id,
        run.plan.background_streams,
        run.settings.stream_tolerance,
        not run.settings.strict_stream,
        run.settings.allow_unconfirmed,
        run.settings.tcp_keepalive_s,
        workload.own_setup(run, selected),
    )
