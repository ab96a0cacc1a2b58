"""A session's points: the served model's prompts, the warm-up, and each point measured.

The session decides (budgets, nonces, which tokenizer); :mod:`pytest_longctx.measure.point`
measures.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pytest_longctx.client import (
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    StreamMeasurement,
)
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.background import BackgroundSpec
from pytest_longctx.measure.cache_state import PlannedBytes
from pytest_longctx.measure.interference import chunk_from_server_info
from pytest_longctx.measure.point import (
    PointFailure,
    PointMeasurement,
    PointSettings,
    UnverifiedPoint,
    client_for,
    measure_point,
)
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.measure.timeouts import FirstTokenBudget
from pytest_longctx.measure.under_load import LoadSettings, measure_under_load, probe_sequences
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.sweep import BACKGROUND_DECODE_TOKENS, BACKGROUND_PROMPT_TOKENS, Point
from pytest_longctx.profiles import Profile
from pytest_longctx.prompts import (
    LocalTokenSource,
    Prompt,
    PromptBuilder,
    ServerTokenSource,
    fidelity_verdict,
    judgement,
)
from pytest_longctx.prompts.probe import DEPTHS, probe_depth, probe_texts, probe_value
from pytest_longctx.serving import served_model
from pytest_longctx.session import live_progress
from pytest_longctx.session import server as session_server
from pytest_longctx.session.run import Run

WARMUP_PROMPT_TOKENS = 1024
#: Enough for the chunking to show (the first token alone, then chunks of the stream
#: interval: two of 8 and the rest at ``--stream-interval 8``), and unlike any decode length a
#: profile sets, so a server's log tells the warm-up from the points.
WARMUP_DECODE_TOKENS = 24


def prompt_builder(run: Run, server: ServerInfo) -> PromptBuilder:
    """The served model's tokenizer: a local copy when there is one, else the server's own.

    Local: the profile's (launched, or attached to the profile's model) or the server's model
    folder when it is readable here. Otherwise ``/tokenize`` encodes and ``/detokenize``
    decodes (text prompts).
    """
    if run.prompt_builder is not None:
        return run.prompt_builder
    from pytest_longctx.profiles.embedded_models import cache_root

    profile = run.plan.profile
    described_by = getattr(run.model, "described_by", served_model.BY_PROFILE)
    source: Any
    if described_by == served_model.BY_PROFILE:
        source = LocalTokenSource(
            session_server.tokenizer_location(profile, build=True),
            revision=None if profile.model.embedded_name else profile.model.revision,
            trust_remote_code=profile.model.trust_remote_code,
        )
    elif described_by == served_model.BY_FOLDER and server.model_root:
        source = LocalTokenSource(server.model_root, trust_remote_code=True)
    else:
        client = client_for(server)  # lives as long as the builder, for /tokenize
        source = ServerTokenSource(
            server.model_name,
            lambda text, special: client.tokenize(text, add_special_tokens=special),
            lambda ids: client.detokenize(server.model_name, ids),
        )
    run.prompt_builder = PromptBuilder(source, cache_root() / "prompts", seed=run.settings.seed)
    return run.prompt_builder


def build_prompt(run: Run, builder: PromptBuilder, point: Point) -> Prompt:
    """The point's own nonce first (its index in the plan), then a readable tag. A warm
    follow-up is its cold point's prompt exactly, then a suffix opening with its own nonce.
    A measured prompt carries the fidelity probe (unless ``--longctx-fidelity=off``): a
    needle at a depth that changes from one point to the next, and the question last."""
    index = run.plan.points.index(point) if point in run.plan.points else len(run.plan.points)
    nonce = builder.nonce(run.run_id, index)
    if point.warm:
        tag = (
            f"Question {point.question} on the prompt of {point.length} tokens, pass "
            f"{point.repeat}, run {run.run_id}."
        )
        return builder.extend(build_prompt(run, builder, point.cold), point.suffix, tag, nonce)
    tag = f"Run {run.run_id}, prompt of {point.length} tokens, pass {point.repeat}."
    probed = run.settings.fidelity != "off"
    return builder.build(
        point.length,
        tag,
        text=run.settings.prompt_format == "text",
        nonce=nonce,
        probe_key=f"{run.run_id}:{index}" if probed else None,
        depth=probe_depth(index),
    )


#: Where a model's config.json states the context it was made for, in order of preference.
ADVERTISED_CONTEXT_KEYS = ("max_position_embeddings", "model_max_length")


def advertised_context(run: Run) -> int | None:
    """The context the served model claims (its config's ``max_position_embeddings``, or the
    ``model_max_length`` some configs give instead), when the profile describes the served
    model; None when unknown."""
    described_by = getattr(run.model, "described_by", served_model.BY_PROFILE)
    if described_by != served_model.BY_PROFILE:
        return None
    config = capacity_check.model_config(run.plan.profile) or {}
    for key in ADVERTISED_CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def plan_lines(run: Run) -> list[str]:
    """What ``--longctx-plan`` says of the probe: its form as text (the tokenizer is not at
    hand without the model) and which lengths are checked or recorded."""
    if run.settings.fidelity == "off":
        return ["fidelity: off (--longctx-fidelity=off): no probe in the prompts"]
    if run.settings.prompt_format == "text":
        return ["fidelity: text prompts carry no probe; every verdict is not_checked"]
    kind = "tokens" if run.plan.profile.model.embedded_name else "text"
    value = probe_value(f"{run.run_id}:0", kind)
    needle, question = probe_texts(kind, value)
    advertised = advertised_context(run)
    lengths = sorted({p.length for p in run.selected_points})
    modes = {length: judgement(run.settings.fidelity, length, advertised) for length in lengths}
    checked = [format_size(n) for n in lengths if modes[n] == "check"]
    recorded = [format_size(n) for n in lengths if modes[n] == "record"]
    within = (
        f"the model's advertised context is {format_size(advertised)} tokens"
        if advertised
        else "the model's advertised context is unknown"
    )
    return [
        f"fidelity probe ({kind}): each measured prompt, still exactly its length, carries "
        f"the needle {needle.strip()!r} at a depth that changes from point to point "
        f"({', '.join(f'{d:g}' for d in DEPTHS[:5])}, ...) and ends with the question "
        f"{question.strip()!r}; expected answer for the first point: {value}",
        f"fidelity --longctx-fidelity={run.settings.fidelity} ({within}): "
        f"checked {', '.join(checked) or 'none'}; recorded only {', '.join(recorded) or 'none'}",
        "needle depths: "
        + ", ".join(
            f"{point.id} {probe_depth(run.plan.points.index(point)):g}"
            for point in run.selected_points
            if not point.warm and point in run.plan.points
        ),
    ]


def judge(run: Run, point: Point, prompt: Prompt, result: PointMeasurement) -> PointMeasurement:
    """``result`` with its probe's verdict; raises :class:`PointFailure` (``wrong_answer``)
    for a wrong answer on a point whose answers are checked."""
    how = judgement(run.settings.fidelity, point.prompt_tokens, advertised_context(run))
    why = (
        "text prompts (--longctx-prompt-format=text) carry no probe"
        if run.settings.prompt_format == "text"
        else ""
    )
    verdict = fidelity_verdict(prompt.probe, result.completion_head, how, why)
    result = dataclasses.replace(result, fidelity=verdict)
    if verdict["verdict"] == "wrong" and how == "check":
        raise WrongAnswer(
            f"wrong answer at {point.prompt_tokens} tokens: expected {verdict['expected']}, "
            f"answered {verdict['answer']} (completion {verdict['completion'][:40]!r}; needle "
            f"at depth {verdict['depth']:.3f})",
            result,
        )
    return result


class WrongAnswer(PointFailure):
    """Measured, but the probe's answer was wrong on a point whose answers are checked."""

    def __init__(self, message: str, measurement: PointMeasurement) -> None:
        super().__init__(message, "wrong_answer")
        self.measurement = measurement


def warm_up(run: Run, server: ServerInfo) -> None:
    """Three short prompts before the first measured point, as the reference study did.

    They are cold prompts of the smallest selected length (at most 1Ki), so the first measured
    point does not pay for the server's first allocations at that size.
    """
    length = min([p.length for p in run.selected_points] or [WARMUP_PROMPT_TOKENS])
    length = min(length, WARMUP_PROMPT_TOKENS)
    with client_for(server) as client:
        builder = prompt_builder(run, server)
        stream: StreamMeasurement | None = None
        for index in range(run.plan.profile.sweep.warmup_prompts):
            # Nonces after the plan's points: a warm-up shares no first token with a point.
            nonce = builder.nonce(run.run_id, len(run.plan.points) + 1 + index)
            prompt = builder.build(length, f"Warm-up {index + 1} of run {run.run_id}.", nonce=nonce)
            request = CompletionRequest(
                model=server.model_name, prompt=prompt.ids, decode_tokens=WARMUP_DECODE_TOKENS
            )
            try:
                stream = client.measure(
                    request, first_token_budget_s=600.0, budget_source="warm-up", check_count=False
                )
            except MeasurementError as exc:
                raise ServerError(f"warm-up request {index + 1} failed: {exc}") from exc
    run.fingerprint["stream"] = stream_fingerprint(run, stream)


def stream_fingerprint(run: Run, warm_up: StreamMeasurement | None) -> dict[str, Any]:
    """How the server streams, as the last warm-up showed it (an attached server does not
    export its ``--stream-interval``), and how each point's stream is checked against the
    server's decode. Only what stays put from one warm-up to the next: a chunk the server
    coalesced changes the tokens per chunk, never the interval, and the workers of one run
    must not differ in fingerprint over it."""
    chunking = warm_up.chunking() if warm_up is not None else {}
    return {
        "stream_interval": chunking.get("stream_interval"),
        "token_count_source": chunking.get("token_count_source"),
        "tolerance": run.settings.stream_tolerance,
        # kept with the server's decode figure (the default), or failed (--longctx-strict-stream)
        "bursts_allowed": not run.settings.strict_stream,
    }


def measure(
    run: Run, server: ServerInfo, client: CompletionClient, point: Point, prompt: Prompt
) -> PointMeasurement:
    """One point, with the first-token budget grown from the points measured so far."""
    budget = FirstTokenBudget(
        default_s=run.plan.profile.sweep.first_token_timeout_s,
        override_s=run.settings.ttft_timeout_s,
    )
    budget_s, source = budget.for_length(point.length, run.measured_ttft)
    if run.settings.ttft_timeout_s is not None:
        source += " (--longctx-ttft-timeout)"
    if point.interference:
        return measure_interference(run, server, client, point, prompt, budget_s, source)
    primed = False
    if point.warm and point.cold not in run.prefix_sent:
        send_prefix(server, client, point, prompt, run.plan.decode_tokens, budget_s, source)
        run.prefix_sent[point.cold] = time.monotonic()
        primed = True
    sent = run.prefix_sent.get(point.cold) if point.warm else None
    settings = PointSettings(
        decode_tokens=run.plan.decode_tokens,
        first_token_budget_s=budget_s,
        budget_source=source,
        allow_unverified=run.settings.allow_unverified,
        stream_tolerance=run.settings.stream_tolerance,
        strict_stream=run.settings.strict_stream,
        prefix_tokens=point.length if point.warm else 0,
        prefix_sent_s_ago=None if sent is None else time.monotonic() - sent,
        # a launched server serves the profile's layout; an attached one, its own
        planned_bytes=(
            planned_bytes(run.plan.profile) if point.warm and server.mode == "launched" else None
        ),
    )
    try:
        result = measure_point(
            client,
            server,
            point,
            prompt,
            settings,
            **_hooks(run, server, point),
        )
    except UnverifiedPoint:
        if not point.warm:
            run.prefix_sent[point] = time.monotonic()
        raise
    if not point.warm:
        run.prefix_sent[point] = time.monotonic()
    elif primed:  # its cold point was not measured by this server: the follow-up sent it
        result = dataclasses.replace(result, cache={**result.cache, "prefix_sent_by": "follow-up"})
    return result


def planned_bytes(profile: Profile) -> PlannedBytes | None:
    """The capacity plan's bytes one request of N tokens holds (growing and state, on the
    fullest rank) at a block size: the resident KV of a warm point's prefix, where vLLM does
    not export its cache's size. None without the model's config."""
    try:
        layout = capacity_check.layout_for(profile)
    except ValueError:
        return None
    if layout is None or layout.allocation is None:
        return None

    def request_bytes(tokens: int, block_size: int | None) -> float:
        served = layout.with_changes(block_size=block_size) if block_size else layout
        return float(sum(served.request_bytes(tokens)))

    return request_bytes


def background_spec(run: Run, server: ServerInfo, point: Point, streams: int) -> BackgroundSpec:
    """The background streams of ``point``: short prompts of the served model's text, each
    request opening with a nonce of its own (drawn under a key of this run and point, so no
    background prompt shares a first block with a measured one)."""
    builder = prompt_builder(run, server)
    base = builder.build(
        BACKGROUND_PROMPT_TOKENS,
        f"Background request beside {point.id} of run {run.run_id}.",
        nonce=builder.nonce(f"{run.run_id}:background", 0),
    )
    return BackgroundSpec(
        base_url=server.base_url,
        model=server.model_name,
        streams=streams,
        prompt_ids=tuple(base.ids),
        nonce_pool=builder.nonce_pool(),
        nonce_key=f"{run.run_id}:background:{point.id}",
        decode_tokens=BACKGROUND_DECODE_TOKENS,
        api_key=server.api_key,
        tcp_keepalive_s=run.settings.tcp_keepalive_s,
    )


def interference_server(
    run: Run, server: ServerInfo, client: CompletionClient, point: Point
) -> dict[str, Any]:
    """What this server start shows the interference points, found once per start: whether
    it runs K + 1 requests at once (probed), and its effective chunk (``/server_info``)."""
    start = len(run.starts) - 1
    known = run.interference_servers.get(start)
    if known is None:
        streams = run.plan.background_streams + 1
        known = {
            "sequence_limit": probe_sequences(
                client, server, background_spec(run, server, point, streams)
            ),
            "server_config": chunk_from_server_info(client.server_info()),
        }
        run.interference_servers[start] = known
    return known


def measure_interference(
    run: Run,
    server: ServerInfo,
    client: CompletionClient,
    point: Point,
    prompt: Prompt,
    budget_s: float,
    source: str,
) -> PointMeasurement:
    """An interference point: the long prompt beside K background streams."""
    known = interference_server(run, server, client, point)
    settings = PointSettings(
        decode_tokens=run.plan.decode_tokens,
        first_token_budget_s=budget_s,
        budget_source=source,
        allow_unverified=run.settings.allow_unverified,
    )
    load = LoadSettings(
        background=background_spec(run, server, point, point.background),
        tolerance=run.settings.stream_tolerance,
        keep_disagreeing=not run.settings.strict_stream,
        server_config=known["server_config"],
        sequence_limit=known["sequence_limit"],
    )
    return measure_under_load(
        client,
        server,
        point,
        prompt,
        settings,
        load,
        **_hooks(run, server, point),
    )


def _hooks(run: Run, server: ServerInfo, point: Point) -> dict[str, Any]:
    """What a point's measurement calls back into the session: is the server alive, how a
    401/403 reads, and the watch of its progress."""
    return {
        "check_alive": lambda grace_s: session_server.check_alive(run, grace_s=grace_s),
        "refusal": lambda exc: str(session_server.refused(run, server.base_url, exc)),
        "watch": live_progress.watch(run, server, point),
    }


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
