"""One point's measurement: prompt in, checked figures out.

Checks that make a figure trustworthy are not warnings: the server must have read exactly the
prompt's tokens, produced exactly the requested completion, and served none of the prompt from
its prefix cache (a cached 8Ki prefill takes 0.1 s instead of 2.6 s on the CPU default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_longctx.client import (
    ClientConfig,
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    RequestRejectedError,
    StreamMeasurement,
    StreamProgress,
)
from pytest_longctx.core.records import Record
from pytest_longctx.measure import outcomes
from pytest_longctx.measure.agreement import DEFAULT_STREAM_TOLERANCE, judge_stream
from pytest_longctx.measure.cache_state import (
    CacheTiers,
    PlannedBytes,
    ServerCache,
    cache_tiers,
    caching_off_reason,
    judge_warm,
    not_cold_message,
)
from pytest_longctx.measure.server_metrics import (
    CACHE_CONFIG_INFO,
    ExpositionError,
    MetricsSnapshot,
    ServerSideView,
    delta,
)
from pytest_longctx.measure.server_timing import point_timing, stream_entry, timing_figures
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.prompts import (
    Prompt,
)


class PointFailure(AssertionError):
    """A measurement that did not happen or cannot be checked; the item fails with this.

    ``failure_class`` (``core.records.FAILURE_CLASSES``) and ``evidence`` say why, from what
    the server said and did; ``sent`` is False when the request never left (the server was
    already gone)."""

    def __init__(
        self,
        message: str,
        failure_class: str = "error",
        evidence: tuple[str, ...] = (),
        sent: bool = True,
    ) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.evidence = evidence
        self.sent = sent


class UnverifiedPoint(PointFailure):
    """Measured, but the server's counters to check it against could not be read."""

    def __init__(self, message: str, measurement: PointMeasurement) -> None:
        super().__init__(message, "error")
        self.measurement = measurement


@dataclass(frozen=True)
class PointMeasurement:
    """One point's figures and the counts its contract is checked against (test_sweep.py)."""

    length: int
    requested_tokens: int
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    stream_figures: dict[str, float] = field(default_factory=dict)
    server_view: dict[str, float] = field(default_factory=dict)
    prompt_build_s: float | None = None
    #: Prompt tokens the server did not compute: the largest of ``usage``'s
    #: ``prompt_tokens_details.cached_tokens`` and /metrics' cached and prefix-hit counters;
    #: None when neither was readable (only with --longctx-allow-unverified).
    cached_prompt_tokens: int | None = None
    #: Requests the server counted between the /metrics reads around this one (1: alone).
    server_requests: int | None = None
    finish_reason: str | None = None
    #: What a watcher of the point adds: the predicted TTFT, the energy (progress/).
    watch_figures: dict[str, float] = field(default_factory=dict)
    #: The devices the energy covers and the energy figures not measured, with why (the
    #: record's ``energy``).
    energy: dict[str, Any] = field(default_factory=dict)
    #: How the stream was chunked and whether it agreed with the server's decode (the
    #: record's ``stream``): see :meth:`StreamMeasurement.chunking` and agreement.py.
    stream: dict[str, Any] = field(default_factory=dict)
    #: Why the stream's decode figures are not the server's decode (a burst, or a rate off
    #: the server's own), under --longctx-strict-stream; None when they agree, cannot be
    #: checked, or the point was kept (the default: with the server's decode figure, or with
    #: none where the server has no figure of this request's own; ``stream`` says which).
    stream_problem: str | None = None
    #: What the prefix cache served (the record's ``cache``): for a warm point the prefix, the
    #: tokens required and each source's figure (cache_state.py).
    cache: dict[str, Any] = field(default_factory=dict)
    #: Why a warm point is not warm ("not warm: the cache served 12,288 of 16,384 prefix
    #: tokens ..."); None for a cold point, a warm one that is, or one that cannot be checked.
    cache_problem: str | None = None
    #: An interference point's load, windows and checks (the record's ``interference``), and
    #: the background streams' figures (``bg_*``).
    interference: dict[str, Any] = field(default_factory=dict)
    background_figures: dict[str, float] = field(default_factory=dict)
    #: Why an interference point's figures are not what K streams beside it saw (a
    #: preemption, a background request that failed, a disagreement with the server's
    #: inter-token histogram); None when none.
    interference_problem: str | None = None
    #: The completion's first characters, where the probe's answer is read.
    completion_head: str | None = None
    #: Each of a concurrency level's requests' first characters, in order (None where a
    #: request failed): every request carries the probe, and each answer is judged.
    request_heads: tuple[str | None, ...] = ()
    #: A concurrency point's level, its requests and the length's fit (the record's
    #: ``concurrency``: workloads/concurrency/concurrent.py).
    concurrency: dict[str, Any] = field(default_factory=dict)
    #: Why a concurrency level is not a measurement of its c cold requests alone (a request
    #: failed or was served from the cache, another client's request ran beside them); None
    #: when none. A level that did not run at once is a finding, not a problem.
    concurrency_problem: str | None = None
    #: The probe's verdict (the record's ``fidelity``): prompts/probe.py.
    fidelity: dict[str, Any] = field(default_factory=dict)
    #: The server's own timing of each request beside the client's (the record's
    #: ``server_timing``): measure/server_timing.py.
    server_timing: dict[str, Any] = field(default_factory=dict)

    def completion_problem(self) -> str:
        """Why the completion count is off, in the words a user can act on."""
        asked, got = self.requested_tokens, self.completion_tokens
        if got > asked:
            return f"asked for {asked} completion tokens, got {got}: the server ignored max_tokens"
        if self.finish_reason == "stop":
            return (
                f"asked for {asked} completion tokens, got {got}: the model stopped at an end "
                "token, so the server ignored ignore_eos/min_tokens"
            )
        return (
            f"asked for {asked} completion tokens, got {got}: the server clamped the request, "
            f"likely prompt + max_tokens > max_model_len ({self.prompt_tokens} + {asked}); serve "
            "with a --max-model-len of at least the prompt plus the decode length"
        )

    def not_cold_problem(self) -> str:
        """Why a cold point is not cold, naming the cache tier that served its prompt."""
        return not_cold_message(
            self.cached_prompt_tokens or 0, self.length, CacheTiers.from_record(self.cache)
        )

    def figures(self) -> dict[str, float]:
        figures = {**self.stream_figures, **self.watch_figures, **self.background_figures}
        if self.prompt_build_s is not None:
            figures["prompt_build"] = self.prompt_build_s
        for name in ("server_ttft", "server_prefill", "server_queue", "server_decode"):
            if self.server_view.get(name) is not None:
                figures[name] = self.server_view[name]
        decode_s = self.server_view.get("server_decode")
        if decode_s and self.completion_tokens > 1:
            figures["server_decode_throughput"] = (self.completion_tokens - 1) / decode_s
        figures.update(timing_figures(self.server_timing))
        return figures

    def server_metrics(self) -> dict[str, float]:
        return dict(self.server_view)

    @property
    def decode_throughput(self) -> float | None:
        return self.stream_figures.get("decode_throughput")

    @classmethod
    def from_record(cls, record: Record) -> PointMeasurement:
        """A resumed point, reported from what an earlier session measured."""
        return cls(
            length=record.length,
            requested_tokens=record.completion_tokens or 0,
            prompt_tokens=record.prompt_tokens or 0,
            completion_tokens=record.completion_tokens or 0,
            ttft_s=record.figures.get("ttft", 0.0),
            stream_figures=dict(record.figures),
            server_view=dict(record.server_metrics),
            cached_prompt_tokens=_cached_tokens(dict(record.server_metrics)),
            server_requests=_whole(record.server_metrics.get("requests")),
            stream=dict(record.stream),
            cache=dict(record.cache),
            interference=dict(record.interference),
            energy=dict(record.energy),
            fidelity=dict(record.fidelity),
            server_timing=dict(record.server_timing),
        )


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def client_for(server: ServerInfo, tcp_keepalive_s: float = 15.0) -> CompletionClient:
    """The measuring client; its connections probe with TCP keepalive every ``tcp_keepalive_s``."""
    return CompletionClient(
        ClientConfig(
            base_url=server.base_url, api_key=server.api_key, tcp_keepalive_s=tcp_keepalive_s
        )
    )


def snapshot(client: CompletionClient) -> tuple[MetricsSnapshot | None, str | None]:
    """A /metrics read, or None and why it failed."""
    try:
        return MetricsSnapshot.from_text(client.metrics_text()), None
    except (MeasurementError, ExpositionError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


UNVERIFIED_HINT = (
    "the cold-prefill and one-request checks need the server's /metrics; set "
    "--longctx-allow-unverified to keep points without them"
)


class PointWatcher(Protocol):
    """Watches a point from another thread (progress.sampler.PointWatch): started before the
    request, stopped after it, fed by the counter the client updates."""

    stream: StreamProgress

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def figures(
        self, prompt_tokens: int | None, completion_tokens: int | None
    ) -> dict[str, float]: ...

    def energy(
        self, prompt_tokens: int | None, completion_tokens: int | None
    ) -> dict[str, Any]: ...

    def slowest_step_s(self) -> float | None: ...


@dataclass(frozen=True)
class PointSettings:
    """What a point's measurement is asked to do, decided by the session."""

    decode_tokens: int
    first_token_budget_s: float
    budget_source: str
    allow_unverified: bool = False
    #: How far the stream's decode may stray from the server's (agreement.py).
    stream_tolerance: float = DEFAULT_STREAM_TOLERANCE
    #: Fail a point whose stream disagrees (--longctx-strict-stream) instead of keeping it
    #: with the server's decode figure.
    strict_stream: bool = False
    #: A warm follow-up's prefix: its cold point's length (0: a cold point).
    prefix_tokens: int = 0
    #: Seconds since this server last computed that prefix; None when it never did.
    prefix_sent_s_ago: float | None = None
    #: The capacity plan's bytes for a request, for the resident KV of a server that does not
    #: say its cache's size (a launched server's; None: not known).
    planned_bytes: PlannedBytes | None = None
    #: The server's stream interval as its warm-ups showed it (None: not known): the point's
    #: stream is read as one of that interval even where the server merged its chunks.
    stream_interval: int | None = None
    #: The TTFT model's time for the point's slowest engine step (its last prefill chunk;
    #: None: no model): a request abandoned mid-step is waited for at least that long.
    planned_step_s: float | None = None


def point_request(
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    settings: PointSettings,
    check_alive: Callable[[float], None],
) -> CompletionRequest:
    """The point's request, once the server is alive and its ``max_model_len`` holds it."""
    try:
        check_alive(0.0)
    except ServerError as exc:
        raise PointFailure(str(exc), exc.failure_class, exc.evidence, sent=False) from None
    decode_tokens = settings.decode_tokens
    needed = point.prompt_tokens + decode_tokens
    if server.max_model_len is not None and needed > server.max_model_len:
        suffix = f" + {point.suffix} suffix" if point.suffix else ""
        raise PointFailure(
            f"the server at {server.base_url} serves at most {server.max_model_len} tokens "
            f"(max_model_len); this point needs {point.length}{suffix} + {decode_tokens} decode",
            "refused",
            sent=False,
        )
    return CompletionRequest(
        model=server.model_name,
        prompt=prompt.text if prompt.text is not None else prompt.ids,
        decode_tokens=decode_tokens,
    )


def slowest_step(watch: PointWatcher | None) -> float | None:
    """The slowest engine step the watch saw, which sets how long an abandoned request may
    take to be dropped; None without a watch."""
    return watch.slowest_step_s() if watch is not None else None


def send_measured(
    client: CompletionClient,
    server: ServerInfo,
    request: CompletionRequest,
    settings: PointSettings,
    check_alive: Callable[[float], None],
    refusal: Callable[[RequestRejectedError], str],
    watch: PointWatcher | None,
    others: int = 0,
) -> StreamMeasurement:
    """Stream the point's request, watched; a failure is a :class:`PointFailure` with its
    class (``others``: requests of other clients the server runs meanwhile)."""
    if watch is not None:
        watch.start()
    try:
        return client.measure(
            request,
            first_token_budget_s=settings.first_token_budget_s,
            budget_source=settings.budget_source,
            check_count=False,
            progress=watch.stream if watch is not None else None,
            stream_interval=settings.stream_interval,
        )
    except RequestRejectedError as exc:
        if exc.status_code in (401, 403):
            raise PointFailure(refusal(exc), "refused") from None
        if exc.status_code is not None and exc.status_code < 500:
            raise PointFailure(f"{type(exc).__name__}: {exc}", "refused") from None
        raise PointFailure(
            *outcomes.failed_request(
                exc, server, check_alive, others, slowest_step(watch), settings.planned_step_s
            )
        ) from None
    except MeasurementError as exc:
        raise PointFailure(
            *outcomes.failed_request(
                exc, server, check_alive, others, slowest_step(watch), settings.planned_step_s
            )
        ) from None
    finally:
        if watch is not None:
            watch.stop()


def measure_point(
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    settings: PointSettings,
    check_alive: Callable[[float], None] = lambda grace_s: None,
    refusal: Callable[[RequestRejectedError], str] = str,
    watch: PointWatcher | None = None,
) -> PointMeasurement:
    """Time one request between two /metrics reads; raise :class:`PointFailure` when the
    measurement itself did not happen or cannot be checked. The contract (exact, cold, alone)
    is the sweep test's to assert.

    ``check_alive(grace_s)`` raises :class:`ServerError` when the server is gone (after
    ``grace_s`` for a dying process to finish dying); ``refusal`` words a 401/403. ``watch``
    samples the point's progress meanwhile; its figures join the measurement's.
    """
    request = point_request(server, point, prompt, settings, check_alive)
    decode_tokens = settings.decode_tokens
    before, why_not = snapshot(client)
    server_cache = ServerCache.from_labels(
        before.labels_of(CACHE_CONFIG_INFO) if before is not None else None
    )
    if settings.prefix_tokens:
        refused = caching_off_reason(server_cache)
        if refused is not None:
            raise PointFailure(refused)
    stream = send_measured(client, server, request, settings, check_alive, refusal, watch)
    after, why_not_after = snapshot(client) if before is not None else (None, None)
    view: ServerSideView | None = delta(before, after) if before and after else None
    server_view = {**view.figures(), **view.counters()} if view is not None else {}
    if stream.cached_prompt_tokens is not None:
        server_view["usage_cached_prompt_tokens"] = float(stream.cached_prompt_tokens)
    cached = _cached_tokens(server_view)
    requests = _whole(view.requests) if view is not None else None
    stream_figures, stream_info, stream_problem = stream_check(
        stream, server_view, settings, alone=requests == 1
    )
    cache_problem = None
    cache_entries: dict[str, Any] = {"served": cached}
    tiers = cache_tiers(server_view) if view is not None else None
    if cached and tiers is not None:
        cache_entries.update(tiers.record())
    if settings.prefix_tokens:
        verdict = judge_warm(
            settings.prefix_tokens, server_view, server_cache, settings.prefix_sent_s_ago
        )
        cache_entries = verdict.record(server_cache, settings.planned_bytes)
        cache_problem = verdict.problem
    result = PointMeasurement(
        length=point.length,
        requested_tokens=decode_tokens,
        prompt_tokens=stream.prompt_tokens if stream.prompt_tokens is not None else -1,
        completion_tokens=stream.completion_tokens,
        ttft_s=stream.ttft_s,
        stream_figures=stream_figures,
        server_view=server_view,
        prompt_build_s=prompt.build_s,
        completion_head=stream.completion_head,
        cached_prompt_tokens=cached,
        server_requests=requests,
        finish_reason=stream.finish_reason,
        watch_figures=(
            watch.figures(stream.prompt_tokens, stream.completion_tokens) if watch else {}
        ),
        energy=watch.energy(stream.prompt_tokens, stream.completion_tokens) if watch else {},
        stream=stream_info,
        stream_problem=stream_problem,
        cache=cache_entries,
        cache_problem=cache_problem,
        server_timing=point_timing(stream_entry(stream, settings.stream_tolerance)),
    )
    if not settings.allow_unverified:
        problem = why_not or why_not_after
        if problem is None and (view is None or requests is None or cached is None):
            problem = "the server's /metrics lacks vLLM's request and prefix-cache counters"
        elif problem is None and view is not None and view.server_decode_s is None:
            problem = "the server's /metrics lacks vLLM's decode time, to check the stream by"
        if problem is not None:
            raise UnverifiedPoint(
                f"this point cannot be verified: /metrics could not be read ({problem}); "
                + UNVERIFIED_HINT,
                result,
            )
    return result


#: The stream's gap figures; a point kept with the server's decode keeps them as ``stream_*``.
STREAM_GAP_FIGURES = (
    "itl_median",
    "itl_p90",
    "itl_max",
    "chunk_gap_median",
    "chunk_gap_p90",
    "chunk_gap_max",
    "derived_itl_median",
    "derived_itl_p90",
)


#: ``stream.decode_source``: whose figure ``decode_throughput`` is. ``none``: the stream's
#: disagreed with the server and the server had no figure of this request's own.
DECODE_SOURCES = ("stream", "server", "none")


def set_aside_stream_figures(
    figures: dict[str, float], stream_decode_throughput: float | None
) -> dict[str, float]:
    """The figures with the stream's decode figures under ``stream_*`` names: measured and
    kept, but not the point's (its stream did not show the server's decode)."""
    kept = {
        (f"stream_{name}" if name in STREAM_GAP_FIGURES else name): value
        for name, value in figures.items()
        if name != "decode_throughput"
    }
    if stream_decode_throughput is not None:
        kept["stream_decode_throughput"] = stream_decode_throughput
    return kept


#: ``stream.server_decode_from``: whose decode time the stream was judged against.
PER_REQUEST_DECODE = "this request's own (the server's per-request metrics)"
METRICS_DECODE = "/metrics (vllm:request_decode_time_seconds between two reads)"


def stream_check(
    stream: StreamMeasurement,
    server_view: dict[str, float],
    settings: PointSettings,
    alone: bool,
) -> tuple[dict[str, float], dict[str, Any], str | None]:
    """The stream's figures, its chunking and its agreement with the server's decode: this
    request's own, /metrics' sum where the server ran it ``alone`` (the same stamps) and its
    per-request figure where it ran others too, else the sum over them all. A disagreeing
    point fails under ``strict_stream``; otherwise its stream's own figures are kept under
    ``stream_*`` names and its decode figure is the server's, when that is this request's
    own, or absent (``decode_source`` ``none``, ``decode_problem`` why)."""
    figures = stream.figures()
    info: dict[str, Any] = stream.chunking()
    summed = server_view.get("server_decode")
    own = stream.server_timing.decode_s if stream.server_timing is not None else None
    per_request = own is not None and not (alone and summed)
    agreement = judge_stream(
        stream.token_times_s,
        stream.chunk_token_counts(),
        stream.completion_tokens,
        stream.decode_throughput,
        own if per_request else summed,
        settings.stream_tolerance,
    )
    info["decode_source"] = "stream"
    if agreement is None:
        info["agreement"] = "unchecked: the server's decode time is unknown"
        return figures, info, None
    info["server_decode_throughput"] = agreement.server_rate
    info["server_decode_from"] = PER_REQUEST_DECODE if per_request else METRICS_DECODE
    if agreement.burst is not None:
        info["largest_burst"] = dataclasses.asdict(agreement.burst)
    if agreement.problem is None:
        info["agreement"] = "agrees"
        return figures, info, None
    info["agreement"] = agreement.problem
    if settings.strict_stream:
        return figures, info, agreement.problem
    kept = set_aside_stream_figures(figures, stream.decode_throughput)
    if alone or per_request:
        assert agreement.server_rate is not None  # a stream judged has the server's rate
        info["decode_source"] = "server"
        kept["decode_throughput"] = agreement.server_rate
    else:
        info["decode_source"] = "none"
        info["decode_problem"] = (
            "the stream does not show the server's decode, and the server's decode time "
            "counts other requests too: this point has no decode figure"
        )
    return kept, info, None


def _cached_tokens(view: dict[str, float]) -> int | None:
    names = ("usage_cached_prompt_tokens", "cached_prompt_tokens", "prefix_cache_hits")
    known = [view[name] for name in names if view.get(name) is not None]
    if view.get("external_prefix_cache_hits"):  # a KV connector's, counted apart from the device's
        known.append((view.get("prefix_cache_hits") or 0.0) + view["external_prefix_cache_hits"])
    return int(max(known)) if known else None
