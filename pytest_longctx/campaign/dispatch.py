"""One point measured on its server, each workload its own way: a cold or warm point alone
(a follow-up first sending the prefix its server lacks), an interference point beside its
background streams, a concurrency level's prompts at once; and a point's whole path
(:func:`measure_judged`): set up, measured, counted against its server, judged.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from pytest_longctx.campaign import concurrency, fidelity, point_setup
from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.campaign.lifecycle import ServerLifecycle
from pytest_longctx.campaign.point_setup import PointSetup, ServerMemory
from pytest_longctx.client import (
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    RequestRejectedError,
)
from pytest_longctx.measure.background import BackgroundSpec
from pytest_longctx.measure.interference import chunk_from_server_info
from pytest_longctx.measure.measurement import (
    PointFailure,
    PointMeasurement,
    UnverifiedPoint,
    measure_point,
)
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.measure.under_load import LoadSettings, measure_under_load, probe_sequences
from pytest_longctx.plan.points import BACKGROUND_DECODE_TOKENS, BACKGROUND_PROMPT_TOKENS, Point
from pytest_longctx.prompts import Prompt, PromptBuilder


def measure_judged(
    lifecycle: ServerLifecycle,
    levels: concurrency.LevelsMeasured,
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

    def refusal(exc: RequestRejectedError) -> str:
        return str(campaign_server.refused(run.description, server.base_url, exc))

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
    levels: concurrency.LevelsMeasured | None = None,
) -> PointMeasurement:
    """One point on ``server``: its ``setup``, the ``builder`` of the background prompts,
    what the server holds of this session's prompts (``memory``), the ``watch`` of its
    progress, the server's liveness check and 401/403 wording, and for a concurrency level
    the session's ``levels`` measured so far."""
    hooks = {"check_alive": check_alive, "refusal": refusal, "watch": watch}
    if point.interference:
        return measure_interference(client, server, point, prompt, setup, builder, memory, hooks)
    if point.concurrent:
        if setup.level is None or levels is None:
            raise ValueError(f"{point.id}: a concurrency level needs its setup and levels")
        return measure_level(client, server, point, prompt, setup, builder, memory, levels)
    settings = setup.settings
    primed = False
    if point.warm and point.cold not in memory.prefix_sent:
        send_prefix(
            server,
            client,
            point,
            prompt,
            settings.decode_tokens,
            settings.first_token_budget_s,
            settings.budget_source,
        )
        memory.note_sent(point.cold)
        primed = True
    sent = memory.prefix_sent.get(point.cold) if point.warm else None
    settings = dataclasses.replace(
        settings, prefix_sent_s_ago=None if sent is None else time.monotonic() - sent
    )
    try:
        result = measure_point(client, server, point, prompt, settings, **hooks)
    except UnverifiedPoint:
        if not point.warm:
            memory.note_sent(point)
        raise
    if not point.warm:
        memory.note_sent(point)
    elif primed:  # its cold point was not measured by this server: the follow-up sent it
        result = dataclasses.replace(result, cache={**result.cache, "prefix_sent_by": "follow-up"})
    return result


def background_spec(
    setup: PointSetup, builder: PromptBuilder, server: ServerInfo, point: Point, streams: int
) -> BackgroundSpec:
    """The background streams of ``point``: short prompts of the served model's text, each
    request opening with a nonce of its own (drawn under a key of this run and point, so no
    background prompt shares a first block with a measured one)."""
    run_id = setup.run_id
    base = builder.build(
        BACKGROUND_PROMPT_TOKENS,
        f"Background request beside {point.id} of run {run_id}.",
        nonce=builder.nonce(f"{run_id}:background", 0),
    )
    return BackgroundSpec(
        base_url=server.base_url,
        model=server.model_name,
        streams=streams,
        prompt_ids=tuple(base.ids),
        nonce_pool=builder.nonce_pool(),
        nonce_key=f"{run_id}:background:{point.id}",
        decode_tokens=BACKGROUND_DECODE_TOKENS,
        api_key=server.api_key,
        tcp_keepalive_s=setup.tcp_keepalive_s,
    )


def measure_interference(
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    setup: PointSetup,
    builder: PromptBuilder,
    memory: ServerMemory,
    hooks: dict[str, Any],
) -> PointMeasurement:
    """An interference point: the long prompt beside K background streams. What the server
    shows them (whether it runs K + 1 requests at once, probed, and its effective chunk,
    ``/server_info``) is found once per server start."""

    def find() -> dict[str, Any]:
        streams = setup.background_streams + 1
        return {
            "sequence_limit": probe_sequences(
                client, server, background_spec(setup, builder, server, point, streams)
            ),
            "server_config": chunk_from_server_info(client.server_info()),
        }

    known = memory.interference_server(find)
    load = LoadSettings(
        background=background_spec(setup, builder, server, point, point.background),
        tolerance=setup.stream_tolerance,
        keep_disagreeing=setup.keep_disagreeing,
        keep_unconfirmed=setup.keep_unconfirmed,
        server_config=known["server_config"],
        sequence_limit=known["sequence_limit"],
    )
    return measure_under_load(client, server, point, prompt, setup.settings, load, **hooks)


def measure_level(
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    setup: PointSetup,
    builder: PromptBuilder,
    memory: ServerMemory,
    levels: concurrency.LevelsMeasured,
) -> PointMeasurement:
    """A concurrency level: c prompts of the point's length at once. What the server shows
    them (its cache's blocks and, attached, whether it runs the highest level at once) is
    found once per server start."""
    level = setup.level
    assert level is not None

    def probe_spec(streams: int) -> BackgroundSpec:
        return background_spec(setup, builder, server, point, streams)

    known = memory.concurrency_server(
        lambda: concurrency.server_state(client, server, level, probe_spec)
    )
    settings = setup.settings
    return concurrency.measure(
        server,
        point,
        prompt,
        level,
        settings.first_token_budget_s,
        settings.budget_source,
        builder.nonce_pool(),
        known,
        levels,
    )


def send_prefix(
    server: ServerInfo,
    client: CompletionClient,
    point: Point,
    prompt: Prompt,
    decode_tokens: int,
    budget_s: float,
    source: str,
) -> None:
    """A follow-up whose cold point this server did not measure (resumed elsewhere, or not
    selected: ``-k warm``) first sends that prompt itself, unmeasured, as its cold point would
    have: the cache then holds what it would hold after the cold point."""
    request = CompletionRequest(
        model=server.model_name, prompt=prompt.ids[: point.length], decode_tokens=decode_tokens
    )
    try:
        client.measure(
            request, first_token_budget_s=budget_s, budget_source=source, check_count=False
        )
    except MeasurementError as exc:
        raise PointFailure(
            f"the {point.cold.id} prompt this follow-up reuses could not be sent first: "
            f"{type(exc).__name__}: {exc}"
        ) from None
