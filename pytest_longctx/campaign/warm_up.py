"""The warm-up prompts before the first measured point, and what they show: how the server
streams (for the run's fingerprint) and whether the served model answers the fidelity probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_longctx.client import (
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    StreamMeasurement,
)
from pytest_longctx.measure.measurement import client_for
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.plan.settings import Settings
from pytest_longctx.prompts import ProbeLesson, Prompt, PromptBuilder, fidelity_verdict, learn
from pytest_longctx.prompts.probe import after_reasoning, probe_depth
from pytest_longctx.workloads import points_of

WARMUP_PROMPT_TOKENS = 1024


#: Enough for the chunking to show (the first token alone, then chunks of the stream
#: interval: two of 8 and the rest at ``--stream-interval 8``), and unlike any decode length a
#: profile sets, so a server's log tells the warm-up from the points.
WARMUP_DECODE_TOKENS = 24


def warm_up_length(selected: Sequence[Point]) -> int:
    """The warm-ups' prompt length: the smallest selected, at most 1Ki."""
    length = min([p.length for p in selected] or [WARMUP_PROMPT_TOKENS])
    return min(length, WARMUP_PROMPT_TOKENS)


def warm_up(
    run: RunDescription, selected: Sequence[Point], server: ServerInfo, builder: PromptBuilder
) -> tuple[dict[str, Any], ProbeLesson | None]:
    """Short prompts before the first measured point (three by default, as the reference study
    sent; ``--longctx-warmup-prompts`` sets how many); how the last one streamed
    (:func:`stream_fingerprint`), for the run's fingerprint, and what they showed of the model
    and the probe (:func:`learn_probe`; None where they carried none).

    They are cold prompts of the smallest selected length (at most 1Ki), so the first measured
    point does not pay for the server's first allocations at that size. Each carries the
    fidelity probe (unless ``--longctx-fidelity=off``): whether the served model answers it is
    learned here (:func:`learn_probe`), before any point, so it does not depend on which point
    runs first (pytest-xdist sends the longest first).
    """
    length = warm_up_length(selected)
    probed = run.settings.fidelity != "off"
    with client_for(server) as client:
        stream: StreamMeasurement | None = None
        asked: list[tuple[Prompt, str]] = []
        for index in range(run.plan.warmup_prompts):
            # Nonces after the plan's points: a warm-up shares no first token with a point.
            nonce = builder.nonce(run.run_id, len(points_of(run.plan)) + 1 + index)
            prompt = builder.build(
                length,
                f"Warm-up {index + 1} of run {run.run_id}.",
                nonce=nonce,
                probe_key=f"{run.run_id}:warm-up:{index}" if probed else None,
                depth=probe_depth(index + 1),  # the middle first: neither end alone
            )
            request = CompletionRequest(
                model=server.model_name, prompt=prompt.ids, decode_tokens=WARMUP_DECODE_TOKENS
            )
            try:
                # each warm-up reads the interval with the ones before it: a stream whose
                # chunks the server merged does not hide the interval the others showed
                stream = client.measure(
                    request,
                    first_token_budget_s=600.0,
                    budget_source="warm-up",
                    check_count=False,
                    stream_interval=stream.stream_interval if stream is not None else None,
                )
            except MeasurementError as exc:
                raise ServerError(f"warm-up request {index + 1} failed: {exc}") from exc
            asked.append((prompt, stream.completion_head))
        lesson = learn_probe(run.plan, server, client, asked, length) if probed else None
    return stream_fingerprint(run.settings, stream), lesson


def learn_probe(
    plan: SweepPlan,
    server: ServerInfo,
    client: CompletionClient,
    asked: list[tuple[Prompt, str]],
    length: int,
) -> ProbeLesson:
    """Whether the served model answers the probe, from the warm-ups' answers (``asked``).

    A warm-up's few tokens are no budget for thinking: one whose completion ended inside a
    reasoning block is asked again, unmeasured, with the points' decode length as its budget
    (stopping at the model's end of text), and judged by that answer. A model that answers
    within it answers a point within it too."""
    verdicts = []
    for prompt, head in asked:
        verdict = fidelity_verdict(prompt.probe, head, "check")
        thinking = after_reasoning(head)[0] is None
        if thinking and plan.decode_tokens > WARMUP_DECODE_TOKENS:
            answer = think(client, server, prompt, plan.decode_tokens)
            verdict = fidelity_verdict(prompt.probe, answer, "check")
        verdicts.append(verdict)
    return learn(verdicts, length, server.model_name)


def think(client: CompletionClient, server: ServerInfo, prompt: Prompt, decode_tokens: int) -> str:
    """The completion of a warm-up's ``prompt`` given the points' decode length to think in
    (``min_tokens`` 0, ending at the model's end of text)."""
    request = CompletionRequest(
        model=server.model_name,
        prompt=prompt.ids,
        decode_tokens=decode_tokens,
        ignore_eos=False,
        extra_body={"min_tokens": 0},
    )
    try:
        stream = client.measure(
            request, first_token_budget_s=600.0, budget_source="warm-up", check_count=False
        )
    except MeasurementError as exc:
        raise ServerError(f"the warm-up's probe, asked again to think, failed: {exc}") from exc
    return stream.completion_head


def stream_fingerprint(settings: Settings, warm_up: StreamMeasurement | None) -> dict[str, Any]:
    """How the server streams, as the last warm-up showed it (an attached server does not
    export its ``--stream-interval``), and how each point's stream is checked against the
    server's decode. Only what stays put from one warm-up to the next: a chunk the server
    coalesced changes the tokens per chunk, never the interval, and the workers of one run
    must not differ in fingerprint over it."""
    chunking = warm_up.chunking() if warm_up is not None else {}
    return {
        "stream_interval": chunking.get("stream_interval"),
        "token_count_source": chunking.get("token_count_source"),
        "tolerance": settings.stream_tolerance,
        # kept with the server's decode figure (the default), or failed (--longctx-strict-stream)
        "bursts_allowed": not settings.strict_stream,
    }
