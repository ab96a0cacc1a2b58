"""The session's side of a point: prompts, warm-up, per-point setup, judging the answer.

The session decides (budgets, nonces, which tokenizer) and judges what came back;
:mod:`pytest_longctx.measure.measurement` measures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_longctx.campaign import budgets, concurrency
from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.campaign.run import Run
from pytest_longctx.client import (
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    RequestRejectedError,
    StreamMeasurement,
)
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.background import BackgroundSpec
from pytest_longctx.measure.cache_state import PlannedBytes
from pytest_longctx.measure.interference import chunk_from_server_info
from pytest_longctx.measure.measurement import (
    PointFailure,
    PointMeasurement,
    PointSettings,
    UnverifiedPoint,
    client_for,
    measure_point,
)
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.measure.under_load import LoadSettings, measure_under_load, probe_sequences
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import BACKGROUND_DECODE_TOKENS, BACKGROUND_PROMPT_TOKENS, Point
from pytest_longctx.profiles import Profile
from pytest_longctx.prompts import (
    LocalTokenSource,
    ProbeLesson,
    Prompt,
    PromptBuilder,
    ServerTokenSource,
    fidelity_verdict,
    judgement,
    learn,
    requests_verdict,
)
from pytest_longctx.prompts.needle import NEEDLE_KEYS
from pytest_longctx.prompts.probe import (
    DEPTHS,
    after_reasoning,
    probe_depth,
    probe_texts,
    probe_value,
)
from pytest_longctx.serving import model_description

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
    described_by = getattr(run.findings.model, "described_by", model_description.BY_PROFILE)
    source: Any
    if described_by == model_description.BY_PROFILE:
        source = LocalTokenSource(
            campaign_server.tokenizer_location(profile, build=True),
            revision=None if profile.model.embedded_name else profile.model.revision,
            trust_remote_code=profile.model.trust_remote_code,
        )
    elif described_by == model_description.BY_FOLDER and server.model_root:
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
    needle at a depth that changes from one point to the next, and the question last. With
    warm follow-ups planned the cold prompt holds a needle for each of them too, under keys
    of their own at other depths, and follow-up Q asks the needle of key Q."""
    index = run.plan.points.index(point) if point in run.plan.points else len(run.plan.points)
    nonce = builder.nonce(run.run_id, index)
    if point.warm:
        tag = (
            f"Question {point.question} on the prompt of {point.length} tokens, pass "
            f"{point.repeat}, run {run.run_id}."
        )
        cold = build_prompt(run, builder, point.cold)
        return builder.extend(cold, point.suffix, tag, nonce, ask=point.question)
    tag = f"Run {run.run_id}, prompt of {point.length} tokens, pass {point.repeat}."
    probed = run.settings.fidelity != "off"
    return builder.build(
        point.length,
        tag,
        text=run.settings.prompt_format == "text",
        nonce=nonce,
        probe_key=f"{run.run_id}:{index}" if probed else None,
        depth=probe_depth(index),
        needles=needles_per_prompt(run),
    )


def needles_per_prompt(run: Run) -> int:
    """One needle for the cold question and one for each warm follow-up, up to the keys
    there are (follow-ups beyond ask the needles again, in turn)."""
    return min(1 + run.plan.warm_questions, len(NEEDLE_KEYS))


#: Where a model's config.json states the context it was made for, in order of preference.
ADVERTISED_CONTEXT_KEYS = ("max_position_embeddings", "model_max_length")


def advertised_context(run: Run) -> int | None:
    """The context the served model claims (its config's ``max_position_embeddings``, or the
    ``model_max_length`` some configs give instead), when the profile describes the served
    model; None when unknown."""
    described_by = getattr(run.findings.model, "described_by", model_description.BY_PROFILE)
    if described_by != model_description.BY_PROFILE:
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
    others = needles_per_prompt(run) - 1
    return [
        f"fidelity probe ({kind}): each measured prompt, still exactly its length, carries "
        f"the needle {needle.strip()!r} at a depth that changes from point to point "
        f"({', '.join(f'{d:g}' for d in DEPTHS[:5])}, ...) and ends with the question "
        f"{question.strip()!r}; expected answer for the first point: {value}"
        + (
            f"; a cold prompt holds {others} more needle(s) under other keys "
            f"({', '.join(NEEDLE_KEYS[1 : 1 + others])}) at other depths, each asked by a "
            "warm follow-up"
            if others
            else ""
        ),
        f"fidelity --longctx-fidelity={run.settings.fidelity} ({within}): "
        f"checked {', '.join(checked) or 'none'}; recorded only {', '.join(recorded) or 'none'}",
        *learning_lines(run),
        "needle depths: "
        + ", ".join(
            f"{point.id} {probe_depth(run.plan.points.index(point)):g}"
            for point in run.selected_points
            if not point.warm and point in run.plan.points
        ),
    ]


def learning_lines(run: Run) -> list[str]:
    """What ``--longctx-plan`` says of how ``auto`` learns whether the model answers."""
    if run.settings.fidelity != "auto":
        return []
    if not run.plan.warmup_prompts:
        return [
            "fidelity auto: no warm-up (--longctx-warmup-prompts=0) asks the probe, so whether "
            "the served model answers it is not known: every answer is recorded, not checked"
        ]
    return [
        f"fidelity auto: the {run.plan.warmup_prompts} warm-up(s) at "
        f"{format_size(warm_up_length(run))} tokens carry the probe; a served model that does "
        "not answer it there has every point's answer recorded as not_checked, its figures "
        "kept; one that does has each point checked as above"
    ]


def unjudged_reason(run: Run) -> str:
    """Why ``auto`` records the points' answers without judging them: the served model did not
    answer the probe in the warm-ups ('' when it did, or under another mode)."""
    lesson = run.findings.probe
    if run.settings.fidelity != "auto" or lesson is None:
        return ""
    return lesson.reason


def judge(run: Run, point: Point, prompt: Prompt, result: PointMeasurement) -> PointMeasurement:
    """``result`` with its probe's verdict; raises :class:`PointFailure` (``wrong_answer``)
    for a wrong answer on a point whose answers are checked."""
    how = judgement(run.settings.fidelity, point.prompt_tokens, advertised_context(run))
    unjudged = unjudged_reason(run)
    if result.request_heads:  # a concurrency level: every request's answer
        verdict = requests_verdict(prompt.probe, result.request_heads, how, unjudged=unjudged)
    else:
        verdict = fidelity_verdict(prompt.probe, result.completion_head, how, unjudged=unjudged)
    result = dataclasses.replace(result, fidelity=verdict)
    if verdict["verdict"] == "wrong" and how == "check":
        which = (
            f" ({len(verdict['wrong_requests'])} of {verdict['requests']} requests sent at "
            f"once; the first, request {verdict['wrong_requests'][0]}, shown)"
            if "wrong_requests" in verdict
            else ""
        )
        raise WrongAnswer(
            f"wrong answer at {point.prompt_tokens} tokens{which}: expected "
            f"{verdict['expected']}, answered {verdict['answer']} (completion "
            f"{verdict['completion'][:40]!r}; needle at depth {verdict['depth']:.3f})",
            result,
        )
    return result


class WrongAnswer(PointFailure):
    """Measured, but the probe's answer was wrong on a point whose answers are checked."""

    def __init__(self, message: str, measurement: PointMeasurement) -> None:
        super().__init__(message, "wrong_answer")
        self.measurement = measurement


def warm_up_length(run: Run) -> int:
    """The warm-ups' prompt length: the smallest selected, at most 1Ki."""
    length = min([p.length for p in run.selected_points] or [WARMUP_PROMPT_TOKENS])
    return min(length, WARMUP_PROMPT_TOKENS)


def warm_up(run: Run, server: ServerInfo) -> tuple[dict[str, Any], ProbeLesson | None]:
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
    length = warm_up_length(run)
    probed = run.settings.fidelity != "off"
    with client_for(server) as client:
        builder = prompt_builder(run, server)
        stream: StreamMeasurement | None = None
        asked: list[tuple[Prompt, str]] = []
        for index in range(run.plan.warmup_prompts):
            # Nonces after the plan's points: a warm-up shares no first token with a point.
            nonce = builder.nonce(run.run_id, len(run.plan.points) + 1 + index)
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
        lesson = learn_probe(run, server, client, asked, length) if probed else None
    return stream_fingerprint(run, stream), lesson


def learn_probe(
    run: Run,
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
        if thinking and run.plan.decode_tokens > WARMUP_DECODE_TOKENS:
            verdict = fidelity_verdict(prompt.probe, think(client, server, prompt, run), "check")
        verdicts.append(verdict)
    return learn(verdicts, length, server.model_name)


def think(client: CompletionClient, server: ServerInfo, prompt: Prompt, run: Run) -> str:
    """The completion of a warm-up's ``prompt`` given the points' decode length to think in
    (``min_tokens`` 0, ending at the model's end of text)."""
    request = CompletionRequest(
        model=server.model_name,
        prompt=prompt.ids,
        decode_tokens=run.plan.decode_tokens,
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


@dataclass
class ServerMemory:
    """What the server measured now holds of this session's prompts, and what it showed the
    session: kept by :class:`lifecycle.ServerLifecycle`, a new one for each server start (a
    server started again, or an attached one that stopped answering, holds none of it)."""

    #: When this server last computed each cold point's prompt (monotonic clock): the
    #: prefix its warm follow-ups find cached.
    prefix_sent: dict[Point, float] = field(default_factory=dict)
    #: What this server showed the interference points, found once: its sequence limit as
    #: probed and its effective chunk (``/server_info``).
    interference: dict[str, Any] | None = None
    #: What this server showed the concurrency points, found once: its cache's blocks
    #: (``vllm:cache_config_info``) and, attached, its sequence limit as probed.
    concurrency: dict[str, Any] | None = None

    def note_sent(self, point: Point) -> None:
        """This server has just computed ``point``'s prompt."""
        self.prefix_sent[point] = time.monotonic()

    def interference_server(self, find: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What this server shows the interference points: ``find()`` the first time."""
        if self.interference is None:
            self.interference = find()
        return self.interference

    def concurrency_server(self, find: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What this server shows the concurrency points: ``find()`` the first time."""
        if self.concurrency is None:
            self.concurrency = find()
        return self.concurrency


@dataclass(frozen=True)
class PointSetup:
    """What the session decides for one point before it is measured (:func:`point_setup`):
    the measurement's settings, and the run's words an interference point's background
    needs (its nonces' key, its streams, how its stream is judged)."""

    settings: PointSettings
    run_id: str
    background_streams: int
    stream_tolerance: float
    keep_disagreeing: bool
    tcp_keepalive_s: float | None
    #: A concurrency level's own setup (None for the other points).
    level: concurrency.LevelSetup | None = None


def prepare(run: Run, server: ServerInfo, point: Point) -> PointSetup:
    """The point's settings, with the first-token budget grown from the points measured so
    far, or from what the run knows before (:mod:`budgets`), and the point's planned slowest
    engine step (the least a request abandoned mid-step is waited for)."""
    requests = point.concurrency if point.concurrent else 1
    budget_s, source = budgets.first_token_budget(run, point.length, requests)
    settings = PointSettings(
        decode_tokens=run.plan.decode_tokens,
        first_token_budget_s=budget_s,
        budget_source=source,
        allow_unverified=run.settings.allow_unverified,
        stream_interval=(run.findings.fingerprint.get("stream") or {}).get("stream_interval"),
        planned_step_s=budgets.planned_step_s(
            run, point.length, campaign_server.workload_of(point)
        ),
    )
    if not point.interference:
        settings = dataclasses.replace(
            settings,
            stream_tolerance=run.settings.stream_tolerance,
            strict_stream=run.settings.strict_stream,
            prefix_tokens=point.length if point.warm else 0,
            # a launched server serves the profile's layout; an attached one, its own
            planned_bytes=(
                planned_bytes(run.plan.profile)
                if point.warm and server.mode == "launched"
                else None
            ),
        )
    return PointSetup(
        settings,
        run.run_id,
        run.plan.background_streams,
        run.settings.stream_tolerance,
        not run.settings.strict_stream,
        run.settings.tcp_keepalive_s,
        concurrency.level_setup(run) if point.concurrent else None,
    )


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
