"""One concurrency level: c distinct cold prompts of one length sent at once.

Each request streams through the one client (:mod:`pytest_longctx.client`), one thread and one
connection each, all released together by a barrier, and decodes the plan's decode tokens.
While they run, ``/metrics`` is read every ``poll_s``: the peaks of the scheduler's gauges
(``vllm:num_requests_waiting``, its ``_by_reason{reason="capacity"}`` form where vLLM has it,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``); reads before and after give
the preemptions (``vllm:num_preemptions_total``) and the server's counters.

The c requests *ran at once* when the server ran all c at one moment (its
``vllm:num_requests_running`` reached c), none failed and the server preempted none: then the
cache held all c prompts and their decodes together. A level over the cache's fit shows either
way: the last request waits for room (the gauge stays below c) or is admitted and pushes one
out (a preemption). Whether the streams themselves overlapped (the last first token before the
first request's last) is recorded too (``overlap``), and decides where the server has no
gauge; on a busy host a stream can arrive in one late burst, so it is not the evidence.

Each stream is judged against the server's decode request by request where the server times
each request (vLLM's per-request metrics: ``server_timing``), so one stream a busy host flushed
late is named, never averaged into a sum; a server without them is judged on the sums.

The checks that assume one request at a time are redefined for c: every request must be
cold (``usage.prompt_tokens_details.cached_tokens`` 0 where the server says it), decode its
count exactly, and the server must have counted c requests and their prompt tokens between
the reads (another client's request would add to them).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_longctx.client import (
    ClientConfig,
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    ServerTiming,
    StreamMeasurement,
)
from pytest_longctx.measure.agreement import DEFAULT_STREAM_TOLERANCE, MIN_DISAGREEMENT_S
from pytest_longctx.measure.cache_state import CacheTiers, cache_tiers
from pytest_longctx.measure.server_metrics import (
    KV_CACHE_USAGE,
    PREEMPTIONS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    MetricsSnapshot,
    delta,
)
from pytest_longctx.measure.server_timing import UNCHECKED, requests_timing, timed_request
from pytest_longctx.prompts.builder import nonce_ids

#: vLLM's waiting gauge by reason; ``capacity`` counts the requests waiting for the
#: scheduler's room (KV blocks or the step's token budget), not for a LoRA slot or a transfer.
REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
CAPACITY_REASON = {"reason": "capacity"}
#: How often the gauges are read while a level runs.
POLL_S = 0.05
#: How long the requests' threads wait for each other before they are sent together.
BARRIER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RequestFigures:
    """One request of a level, on the machine's monotonic clock (``time.perf_counter``)."""

    index: int
    sent_at: float
    ttft_s: float | None = None
    #: Arrival of its first and last token-carrying chunks (absolute).
    first_token_at: float | None = None
    last_token_at: float | None = None
    decode_throughput: float | None = None
    itl_median_s: float | None = None
    itl_p90_s: float | None = None
    itl_max_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    error: str | None = None
    #: The completion's first characters, where the probe's answer is read.
    completion_head: str | None = None
    #: The server's own timing of this request (vLLM's per-request metrics), if it sent it,
    #: and the stream's carrying chunks (absolute arrivals, tokens each) to judge against it.
    server_timing: ServerTiming | None = None
    token_times: tuple[float, ...] = field(default=(), repr=False)
    tokens_per_chunk: tuple[int, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, index: int, measured: StreamMeasurement) -> RequestFigures:
        start = measured.started_perf_s
        times = measured.token_times_s
        gaps = sorted(measured.itl_s)
        return cls(
            index=index,
            sent_at=start,
            ttft_s=measured.ttft_s,
            first_token_at=start + times[0] if times else None,
            last_token_at=start + times[-1] if times else None,
            decode_throughput=measured.decode_throughput,
            itl_median_s=statistics.median(gaps) if gaps else None,
            itl_p90_s=gaps[min(len(gaps) - 1, math.ceil(0.9 * len(gaps)) - 1)] if gaps else None,
            itl_max_s=gaps[-1] if gaps else None,
            completion_tokens=measured.completion_tokens,
            prompt_tokens=measured.prompt_tokens,
            cached_prompt_tokens=measured.cached_prompt_tokens,
            completion_head=measured.completion_head,
            server_timing=measured.server_timing,
            token_times=tuple(start + t for t in times),
            tokens_per_chunk=measured.tokens_per_chunk,
        )

    def timing(self, tolerance: float = DEFAULT_STREAM_TOLERANCE) -> dict[str, Any] | None:
        """Its server timing beside its stream (measure/server_timing.py), its ``index``
        first; None for a failed request or one the server sent no figures for."""
        if self.error is not None:
            return None
        entry = timed_request(
            self.server_timing,
            self.sent_at,
            self.token_times,
            self.tokens_per_chunk,
            self.completion_tokens,
            tolerance,
        )
        return None if entry is None else {"index": self.index, **entry}

    def to_json(self) -> dict[str, Any]:
        keys = (
            "index",
            "ttft_s",
            "decode_throughput",
            "itl_median_s",
            "itl_p90_s",
            "itl_max_s",
            "completion_tokens",
            "prompt_tokens",
            "cached_prompt_tokens",
            "error",
        )
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}


@dataclass
class GaugePeaks:
    """The highest value each scheduler gauge showed while a level ran."""

    waiting: float | None = None
    waiting_capacity: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    reads: int = 0
    failed_reads: int = 0

    def add(self, snapshot: MetricsSnapshot) -> None:
        self.reads += 1
        for name, metric, where in (
            ("waiting", REQUESTS_WAITING, None),
            ("waiting_capacity", REQUESTS_WAITING_BY_REASON, CAPACITY_REASON),
            ("running", REQUESTS_RUNNING, None),
            ("kv_usage", KV_CACHE_USAGE, None),
        ):
            value = snapshot.total(metric, where)
            if value is not None:
                old = getattr(self, name)
                setattr(self, name, value if old is None else max(old, value))

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting_peak": self.waiting,
            "waiting_capacity_peak": self.waiting_capacity,
            "running_peak": self.running,
            "kv_usage_peak": self.kv_usage,
            "gauge_reads": self.reads,
        }


@dataclass(frozen=True)
class LevelResult:
    """What one level measured: its requests, the gauges' peaks and the server's counts."""

    length: int
    level: int
    decode_tokens: int
    requests: tuple[RequestFigures, ...]
    peaks: GaugePeaks = field(default_factory=GaugePeaks)
    #: Preemptions between the reads around the level; None: the server does not count them.
    preemptions: int | None = None
    #: The server's count of requests and prompt tokens between the reads (None: not known).
    server_requests: float | None = None
    server_prompt_tokens: float | None = None
    #: The server's decode time summed over the level's requests (its histogram's sum).
    server_decode_s: float | None = None
    #: Which cache tiers served the level's cached prompt tokens (None: not known).
    tiers: CacheTiers | None = None

    @property
    def errors(self) -> list[str]:
        return [f"request {r.index}: {r.error}" for r in self.requests if r.error]

    @property
    def last_start(self) -> float | None:
        """When the last request had its first token."""
        starts = [r.first_token_at for r in self.requests]
        return None if None in starts or not starts else max(starts)  # type: ignore[type-var]

    @property
    def first_finish(self) -> float | None:
        ends = [r.last_token_at for r in self.requests]
        return None if None in ends or not ends else min(ends)  # type: ignore[type-var]

    @property
    def overlap(self) -> bool:
        """Whether every request was decoding at one moment (the last first token came
        before the first request's last one)."""
        start, end = self.last_start, self.first_finish
        return start is not None and end is not None and start < end

    @property
    def held_together(self) -> bool:
        """Whether the server ran all c requests at one moment: its count of running requests
        (read every poll) reached c. A server without that gauge: the streams' overlap. The
        gauge is the evidence where it exists: the streams' own times depend on how soon a
        busy host delivers them, and on how long each decodes against the others' prefills."""
        if self.peaks.running is not None:
            return self.peaks.running >= self.level
        return self.overlap

    @property
    def ran_at_once(self) -> bool:
        """All c requests held the cache together: none failed, the server ran all c at
        once, and it preempted none (a server that does not count preemptions: the rest)."""
        return not self.errors and self.held_together and not self.preemptions

    @property
    def aggregate_decode_throughput(self) -> float | None:
        """Tokens decoded after each request's first, over the span from the earliest
        first token to the latest last one: what the server gave the c requests together."""
        starts = [r.first_token_at for r in self.requests if r.first_token_at is not None]
        ends = [r.last_token_at for r in self.requests if r.last_token_at is not None]
        tokens = sum(max(0, r.completion_tokens - 1) for r in self.requests if not r.error)
        if self.errors or not starts or not ends or max(ends) <= min(starts) or not tokens:
            return None
        return tokens / (max(ends) - min(starts))

    @property
    def last_request_ttft_s(self) -> float | None:
        """The TTFT of the request that started last: the queueing shows in it."""
        timed = [r for r in self.requests if r.first_token_at is not None and r.ttft_s]
        if not timed:
            return None
        return max(timed, key=lambda r: r.first_token_at or 0.0).ttft_s

    def server_timing(self, tolerance: float = DEFAULT_STREAM_TOLERANCE) -> dict[str, Any]:
        """The record's ``server_timing``: each request's own figures beside its stream."""
        return requests_timing([request.timing(tolerance) for request in self.requests])

    def stream_agreement(self, tolerance: float = DEFAULT_STREAM_TOLERANCE) -> dict[str, Any]:
        """The streams against the server's decode, for c requests: request by request, each
        stream against that request's own decode time, where the server timed every one
        (its per-request metrics: ``by`` ``request``); else their decode spans (first to
        last token, each request's) summed, against vLLM's decode time summed over the same
        requests (``by`` ``sum``). A stream held back and flushed at once has a span near
        zero. Empty when the server does not time decodes or a request failed."""
        if self.errors:
            return {}
        entries = [request.timing(tolerance) for request in self.requests]
        if entries and all(entry and entry.get("decode_s") is not None for entry in entries):
            return _judged_by_request(entries, tolerance)  # type: ignore[arg-type]
        spans = [
            r.last_token_at - r.first_token_at
            for r in self.requests
            if r.last_token_at is not None and r.first_token_at is not None
        ]
        if not self.server_decode_s or self.errors or len(spans) != self.level:
            return {}
        client = math.fsum(spans)
        off = client / self.server_decode_s - 1
        agrees = abs(off) <= tolerance or abs(client - self.server_decode_s) <= MIN_DISAGREEMENT_S
        found = {
            "by": "sum",
            "client_decode_s": client,
            "server_decode_s": self.server_decode_s,
            "tolerance": tolerance,
            "agrees": agrees,
        }
        if not agrees:
            found["problem"] = (
                f"the streams' decode spans add up to {client:.3f} s, {off:+.0%} off the "
                f"server's decode time for these {self.level} requests, "
                f"{self.server_decode_s:.3f} s (tolerance {tolerance:.0%}): the streams do "
                "not show the server's decode"
            )
        return found

    def contract_problems(self) -> list[str]:
        """What makes the level not a measurement of c cold requests of its length alone."""
        problems = list(self.errors)
        for r in self.requests:
            if r.error:
                continue
            if r.prompt_tokens is not None and r.prompt_tokens != self.length:
                problems.append(
                    f"request {r.index}: the server counted {r.prompt_tokens} prompt tokens, "
                    f"expected {self.length}"
                )
            if r.cached_prompt_tokens:
                problems.append(
                    f"request {r.index}: {r.cached_prompt_tokens} prompt tokens came from the "
                    "prefix cache (not cold)"
                )
        if (
            self.tiers is not None
            and self.tiers.served_by
            and any(r.cached_prompt_tokens for r in self.requests if not r.error)
        ):
            problems.append(
                f"the level's cached tokens were served from {self.tiers.words()}, by "
                f"{self.tiers.counted_by}"
            )
        if self.server_requests is not None and self.server_requests != self.level:
            problems.append(
                f"the server counted {self.server_requests:g} requests during the level, "
                f"expected {self.level} (another client's requests ran beside it)"
            )
        wanted = self.level * self.length
        if (
            self.server_prompt_tokens is not None
            and not self.preemptions
            and self.server_prompt_tokens != wanted
        ):
            problems.append(
                f"the server counted {self.server_prompt_tokens:g} prompt tokens during the "
                f"level, expected {wanted:,} ({self.level} x {self.length:,})"
            )
        return problems

    def figures(self) -> dict[str, float]:
        """The record's figures: ``ttft`` is the last request's to start."""
        rates = [r.decode_throughput for r in self.requests if r.decode_throughput]
        values = {
            "ttft": self.last_request_ttft_s,
            "aggregate_decode_throughput": self.aggregate_decode_throughput,
            "decode_throughput": statistics.median(rates) if rates else None,
            "min_request_decode_throughput": min(rates) if rates else None,
        }
        itls = [r.itl_median_s for r in self.requests if r.itl_median_s is not None]
        if itls:
            values["itl_median"] = statistics.median(itls)
        return {k: v for k, v in values.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        """The record's ``concurrency`` mapping (the length's fit is added beside it)."""
        return {
            "level": self.level,
            "decode_tokens": self.decode_tokens,
            "aggregate_decode_throughput": self.aggregate_decode_throughput,
            "last_request_ttft_s": self.last_request_ttft_s,
            "ran_at_once": self.ran_at_once,
            "overlap": self.overlap,
            "preemptions": self.preemptions,
            **self.peaks.to_json(),
            "requests": [r.to_json() for r in self.requests],
        }


def _judged_by_request(entries: Sequence[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """:meth:`LevelResult.stream_agreement` request by request: each entry's ``decode``
    verdict (measure/server_timing.py), and the level's where one disagrees."""
    disagreeing = [e for e in entries if e["decode"] != "agrees" and e["decode"] != UNCHECKED]
    found: dict[str, Any] = {
        "by": "request",
        "client_decode_s": math.fsum(e.get("client_decode_s", 0.0) for e in entries),
        "server_decode_s": math.fsum(e["decode_s"] for e in entries),
        "tolerance": tolerance,
        "agrees": not disagreeing,
        "requests": [
            {
                "index": e["index"],
                "client_decode_s": e.get("client_decode_s"),
                "server_decode_s": e["decode_s"],
                "agrees": None if e["decode"] == UNCHECKED else e["decode"] == "agrees",
            }
            for e in entries
        ],
    }
    if disagreeing:
        found["problem"] = f"{len(disagreeing)} of {len(entries)} requests: " + "; ".join(
            f"request {e['index']}: {e['decode']}" for e in disagreeing
        )
    return found


def level_prompts(
    base: Sequence[int], pool: Sequence[int], key: str, level: int
) -> list[list[int]]:
    """``level`` prompts of ``len(base)`` tokens, each opening with its own nonce (drawn
    from ``pool`` under ``key``): no two share a first block, so none is served from the
    prefix cache of another (or of an earlier level, with a key of its own)."""
    prompts = []
    for index in range(level):
        nonce = nonce_ids(pool, key, index)
        prompts.append([*nonce, *base[len(nonce) :]])
    return prompts


def _send(
    config: ClientConfig,
    request: CompletionRequest,
    index: int,
    budget_s: float,
    budget_source: str,
    barrier: threading.Barrier,
    results: list[RequestFigures | None],
) -> None:
    with CompletionClient(config) as client:
        try:  # bounded: a thread that never reaches it must not hold the others forever
            barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            results[index] = RequestFigures(index, time.perf_counter(), error="not sent")
            return
        sent = time.perf_counter()
        try:
            measured = client.measure(request, budget_s, budget_source)
        except MeasurementError as exc:
            partial = getattr(exc, "measurement", None)
            figures = RequestFigures.of(index, partial) if partial is not None else None
            results[index] = RequestFigures(
                index,
                figures.sent_at if figures else sent,
                error=f"{type(exc).__name__}: {exc}",
            )
        else:
            results[index] = RequestFigures.of(index, measured)


def measure_level(
    config: ClientConfig,
    model: str,
    prompts: Sequence[Sequence[int]],
    decode_tokens: int,
    first_token_budget_s: float,
    budget_source: str = "the caller's limit",
    poll_s: float = POLL_S,
    metrics: Callable[[], str] | None = None,
) -> LevelResult:
    """Send ``prompts`` at once, each decoding ``decode_tokens``; read the gauges while they
    run. ``metrics`` reads ``/metrics`` (default: a client of its own on ``config``)."""
    if not prompts:
        raise ValueError("a level needs at least one prompt")
    lengths = {len(p) for p in prompts}
    if len(lengths) != 1:
        raise ValueError(f"a level's prompts must have one length, got {sorted(lengths)}")
    level = len(prompts)
    watcher = CompletionClient(config)
    read = metrics or watcher.metrics_text

    def snapshot() -> MetricsSnapshot | None:
        try:
            return MetricsSnapshot.from_text(read())
        except Exception:  # noqa: BLE001 - a server without /metrics: no server-side view
            return None

    try:
        before = snapshot()
        results: list[RequestFigures | None] = [None] * level
        barrier = threading.Barrier(level)
        threads = [
            threading.Thread(
                target=_send,
                args=(
                    config,
                    CompletionRequest(model=model, prompt=prompt, decode_tokens=decode_tokens),
                    index,
                    first_token_budget_s,
                    budget_source,
                    barrier,
                    results,
                ),
                daemon=True,
            )
            for index, prompt in enumerate(prompts)
        ]
        for thread in threads:
            thread.start()
        peaks = GaugePeaks()
        while any(thread.is_alive() for thread in threads):
            now = snapshot()
            if now is None:
                peaks.failed_reads += 1
            else:
                peaks.add(now)
            time.sleep(poll_s)
        for thread in threads:
            thread.join()
        after = snapshot()
    finally:
        watcher.close()
    done = tuple(
        r if r is not None else RequestFigures(i, 0.0, error="no result")
        for i, r in enumerate(results)
    )
    preempted = server_requests = server_prompt = server_decode = tiers = None
    if before is not None and after is not None:
        old, new = before.total(PREEMPTIONS), after.total(PREEMPTIONS)
        preempted = None if new is None else int(new - (old or 0.0))
        view = delta(before, after)
        server_requests, server_prompt = view.requests, view.prompt_tokens
        server_decode = view.server_decode_s
        tiers = cache_tiers(view.counters())
    return LevelResult(
        length=lengths.pop(),
        level=level,
        decode_tokens=decode_tokens,
        requests=done,
        peaks=peaks,
        preemptions=preempted,
        server_requests=server_requests,
        server_prompt_tokens=server_prompt,
        server_decode_s=server_decode,
        tiers=tiers,
    )
