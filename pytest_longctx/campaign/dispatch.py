"""A point's whole path (:func:`measure_judged`): set up, measured by its workload
(:mod:`workloads`), counted against its server, judged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_longctx.campaign import fidelity, point_setup
from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.campaign.lifecycle import ServerLifecycle
from pytest_longctx.client import CompletionClient, RequestRejectedError
from pytest_longctx.measure.measurement import PointFailure, PointMeasurement, UnverifiedPoint
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.prompts import Prompt, PromptBuilder
from pytest_longctx.workloads import PointSetup, PointStep, ServerMemory, workload_of
from pytest_longctx.workloads.concurrency import LevelsMeasured


def measure_judged(
    lifecycle: ServerLifecycle,
    levels: LevelsMeasured,
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    watch: Callable[[], Any],
) -> PointMeasurement:
    """``point`` on the ``lifecycle``'s ``server``, once :meth:`ServerLifecycle.before_point`
    made it measurable: set up from what the run knows now, measured by its workload (a new
    progress ``watch()`` each try), its answer judged. A failure that took the server down
    counts against its length; a point never sent because the server died just before it is
    measured again once the server is back. Raises :class:`PointFailure` (an unverified
    point's and a wrong answer's carry what was measured) or :class:`lifecycle.PointSkipped`."""
    run = lifecycle.run

    while True:
        setup = point_setup.prepare(
            run.description,
            server,
            point,
            selected=run.selected_points,
            records=run.results.all_records(),
            measured_ttft=run.sweep.measured_ttft,
            stream_interval=lifecycle.stream_interval(),
        )
        try:
            result = measure(
                client,
                server,
                point,
                prompt,
                setup,
                lifecycle.prompt_builder(server),
                lifecycle.memory,
                watch(),
                check_alive=lambda grace_s: lifecycle.check_alive(grace_s=grace_s),
                refusal=lambda exc: str(
                    campaign_server.refused(run.description, server.base_url, exc)
                ),
                levels=levels,
            )
        except UnverifiedPoint:
            raise
        except PointFailure as exc:
            if exc.sent or not lifecycle.server_down():
                lifecycle.after_failure(point, exc)
                raise
            # Never sent: the server died just before it. Measured after the relaunch.
            lifecycle.before_point(point)
            continue
        return fidelity.judge(run.description, run.findings, point, prompt, result)


def measure(
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    setup: PointSetup,
    builder: PromptBuilder,
    memory: ServerMemory,
    watch: Any,
    check_alive: Callable[[float], None],
    refusal: Callable[[RequestRejectedError], str],
    levels: LevelsMeasured | None = None,
) -> PointMeasurement:
    """One point on ``server``, measured by its workload: its ``setup``, the ``builder`` of
    its background or level prompts, what the server holds of this session's prompts
    (``memory``), the ``watch`` of its progress, the server's liveness check and 401/403
    wording, and the session's concurrency ``levels`` measured so far."""
    step = PointStep(
        client, server, point, prompt, setup, builder, memory, watch, check_alive, refusal, levels
    )
    return workload_of(point).measure(step)
