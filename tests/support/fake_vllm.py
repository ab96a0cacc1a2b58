"""A stand-in for vLLM's OpenAI server with exactly known timing and injectable faults.

Stdlib only (``http.server`` in a thread). It answers ``/health``, ``/v1/models``,
``/tokenize`` (whitespace words), ``/metrics`` (counters that move per request) and a
streaming ``/v1/completions`` that frames its chunks the way vLLM 0.32 does. Token ``i``
(0-based) leaves at ``t_body + first_token_delay_s + i * token_delay_s`` on an absolute
schedule, ``t_body`` being the moment the request body was fully read, so sleep overshoot does
not accumulate. A chunk never leaves sooner than half its own time after the one before
(:data:`MIN_STEP_SHARE`): when the host pauses this process, the schedule catches up at twice
its pace, as an engine whose step started late would, not in one burst the stream check would
rightly call a flush.

Use it as ``with FakeVLLM(Behaviour(...)) as server: server.url`` or through the
``fake_vllm`` fixture below (import it into a test module or a conftest.py), and change what
it does between requests with ``server.configure(field=value)``.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import queue
import re
import select
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_longctx.profiles.embedded_models import EMBEDDED_MODELS
from pytest_longctx.prompts.needle import (
    NEEDLE_VALUES,
    RESERVED_TOKENS,
    needle_token,
)

#: Faults the server can inject; ``fault_after_tokens`` says when the mid-stream ones strike.
FAULTS = (
    "http_500",  # HTTP 500 with vLLM's error body instead of a stream
    "error_frame",  # data: {"error": ...} inside the 200 stream, then [DONE]
    "truncate",  # close the socket mid-stream, no [DONE], no final chunk
    # end the response cleanly (its last chunk sent) after fault_after_tokens tokens, without
    # [DONE]: what a proxy that drops the sentinel, or a front end that gave up, sends
    "end_without_done",
    "malformed_chunk",  # a data: line that is not JSON
    "no_usage",  # never send the usage chunk
    "stall",  # stop sending after fault_after_tokens tokens, until the client goes away
    "hang_before_headers",  # read the request, never answer
    "hang_after_headers",  # answer 200 headers, never send a chunk, until the client goes away
    "reset",  # read the request, then reset the connection (RST)
    "reject_echoing_auth",  # HTTP 401 whose message repeats the Authorization header
    "freeze",  # read the request, never answer; /health and /metrics stop answering too
    # a stuck engine behind a live front: the request is taken and never answered, and stays
    # running (num_requests_running) after its client went away; /health keeps answering 200
    "stuck_engine",
    # vLLM's dead engine: after fault_after_tokens tokens the EngineDeadError frame, then
    # /health answers 503 and completions 500 (and the server stops after stop_after_death_s)
    "engine_death",
)

#: vLLM 0.32's words: ``GenerationError`` in a stream, and ``EngineDeadError`` (the same for
#: every engine death) in a stream or a 500 body.
GENERATION_ERROR_MESSAGE = "Internal server error"
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."

TOO_LONG_MESSAGE = (
    "This model's maximum context length is {limit} tokens. However, your prompt contains "
    "{count} input tokens, which exceeds this limit even without any output tokens. "
    "Please reduce the length of the input prompt."
)
VOCAB_SIZE = 50_000
_HANG_LIMIT_S = 3600.0
#: The least share of a chunk's own decode time that separates it from the chunk before.
MIN_STEP_SHARE = 0.5
#: What a long prompt's prefill does to the other requests (``Behaviour.prefill_interference``).
PREFILL_INTERFERENCE = ("none", "stall", "slow")
#: vLLM 0.32's bucket bounds of ``vllm:inter_token_latency_seconds``.
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
ITL_BUCKETS += (7.5, 10.0, 20.0, 40.0, 80.0)


#: vLLM 0.32's cache tiers (``vllm.v1.metrics.cache_hit_source.CacheHitSource``), device first.
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


@dataclass(frozen=True)
class Behaviour:
    """What the next requests see; every delay is exact up to scheduler jitter."""

    model: str = "fake-model"
    max_model_len: int = 32_768
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    #: Tokens generated; None: ``max_tokens``, clamped to ``max_model_len - prompt`` as vLLM does.
    tokens: int | None = None
    tokens_per_chunk: int = 1
    #: Tokens of each chunk in turn, the rest ``tokens_per_chunk`` each: ``(1, 20, 11)`` is a
    #: 32-token stream that fell behind after its first token, vLLM's API server merging the
    #: next 20 into one chunk and the last 11 into another, each sent once its last token is
    #: decoded.
    chunk_tokens: tuple[int, ...] = ()
    #: Chunks whose choice has no ``text`` (and empty token_ids): keep-alives, sent at once
    #: before the first token; they carry no token.
    empty_chunks_first: int = 0
    #: Tokens (0-based; negative counts from the end) streamed with ``"text": ""``, as vLLM
    #: sends a token that is an incomplete UTF-8 piece; they are tokens all the same.
    empty_text_tokens: tuple[int, ...] = ()
    fault: str | None = None
    fault_after_tokens: int = 0
    #: The fault strikes only the id prompts that open with this token id (one request
    #: among several sent at once, told apart by its nonce); None: every request.
    fault_prompt_head: int | None = None
    api_key: str | None = None
    #: False: discard the body unparsed (upload sink for huge prompts); the prompt must be
    #: the body's last field and max_tokens must appear in its first kilobyte.
    read_prompt: bool = True
    cached_prompt_tokens: int = 0  # reported per request in usage (and /metrics, see below)
    #: A KV connector on the server, and the tier it serves from as vLLM 0.32 names it
    #: (``host``: vLLM's CPU offloading; ``disk``; ``p2p``; ``external_unspecified``: LMCache);
    #: None: no connector.
    kv_connector: str | None = None
    #: Prompt tokens the connector serves per request, after the device's
    #: ``cached_prompt_tokens``: in usage, ``prompt_tokens_cached`` and
    #: ``external_prefix_cache_hits``, never in the device's ``prefix_cache_hits``.
    external_cached_prompt_tokens: int = 0
    #: False: /metrics has no ``vllm:prompt_tokens_cached_by_source``, as vLLM before 0.32.
    cached_by_source: bool = True
    #: True: usage always carries ``prompt_tokens_details`` (``cached_tokens`` 0 included), as
    #: vLLM started with --enable-prompt-tokens-details; False: only when some were cached.
    prompt_tokens_details: bool = False
    #: False: the hit shows in ``usage`` only, as from a server whose counters lag or lack it.
    cached_tokens_in_metrics: bool = True
    #: Status of ``/metrics``: 404 is a server that does not expose it.
    metrics_status: int = 200
    #: Requests another client completes during each completion (counted in /metrics).
    other_requests: int = 0
    #: False: ``/detokenize`` answers 404, as a server without it.
    detokenize: bool = True
    token_text: str = " tok"
    #: How the first token answers a prompt that ends with the needle question: "retrieve"
    #: (the planted needle's token, as the embedded tiny-llama does), "random" (no needle,
    #: as a random-weight model), or "retrieve" except at the prompt lengths in
    #: ``wrong_at_lengths`` (another needle's token there).
    answers: str = "retrieve"
    wrong_at_lengths: tuple[int, ...] = ()
    #: Tokens of reasoning before the answer, as a reasoning model writes them: ``<think>``,
    #: words, ``</think>`` (0: the answer is the first token).
    thinking_tokens: int = 0
    block_size: int = 128
    num_gpu_blocks: int = 16_384
    #: ``enable_prefix_caching`` in ``vllm:cache_config_info``.
    prefix_caching: bool = True
    #: ``cache_hit_alignment_tokens`` in ``vllm:cache_config_info`` (None: the label absent).
    cache_hit_alignment_tokens: int | None = None
    #: Serve id prompts from a prefix cache as vLLM does: the longest prefix shared with an
    #: earlier prompt, in whole blocks, short of the last token (``cached_prompt_tokens``
    #: then comes from it).
    prefix_cache: bool = False
    #: Prompt tokens prefilled per step: during ``first_token_delay_s`` the KV usage gauge
    #: rises chunk by chunk, as vLLM's does with chunked prefill.
    prefill_chunk_tokens: int = 2048
    #: False: ignore ``stream_options.continuous_usage_stats`` (no running usage per chunk),
    #: as a server that does not implement it.
    continuous_usage: bool = True
    #: Decode on schedule (``/metrics`` counts that decode time) but write every chunk at once
    #: after the last token, as an API server starved of CPU flushes a stream late.
    deliver_at_once: bool = False
    #: The last this many tokens decoded on schedule but held back and written at once after
    #: the last, as a stream that stalls mid-way and then flushes (``deliver_at_once``: all).
    flush_last_tokens: int = 0
    #: ``deliver_at_once`` and ``flush_last_tokens`` strike only the id prompts that open with
    #: this token id (one stream among several sent at once); None: every request.
    flush_prompt_head: int | None = None
    #: The first this many completion requests served are each delivered at once, as an API
    #: server starved while background streams start (the later ones stream on schedule).
    flush_first_requests: int = 0
    #: False: /metrics has no decode-time histogram, as an engine that does not time decodes.
    decode_metric: bool = True
    #: Fault ``engine_death``: seconds after the death frame until the server stops, as
    #: vLLM's API server exits once its engine is dead; None: it keeps answering 503.
    stop_after_death_s: float | None = None
    #: The error frame's message and type (fault ``error_frame``).
    error_message: str = GENERATION_ERROR_MESSAGE
    error_type: str = "InternalServerError"
    #: Seconds between SSE keep-alive comments while the stream is idle, as vLLM's
    #: ``--sse-keep-alive-interval`` sends them; 0: none.
    keep_alive_s: float = 0.0
    #: Seconds a connection may wait for its next request before the server closes it, as
    #: vLLM's API server does (uvicorn's ``timeout_keep_alive``: ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``,
    #: 5 s); None: never.
    idle_close_s: float | None = None
    #: Requests served at once (vLLM's --max-num-seqs); the others wait, as the running and
    #: waiting gauges show. None: any number.
    max_num_seqs: int | None = None
    #: Prompts at least this long are long: their first token waits ``first_token_delay_s``,
    #: a shorter one's ``short_first_token_delay_s``. None: every prompt is long.
    long_prompt_from: int | None = None
    short_first_token_delay_s: float = 0.0
    #: What a long prompt's prefill (its first-token delay) does to the other requests'
    #: tokens: "none"; "stall" (none until it ends, as one unchunked prefill step); "slow"
    #: (one every ``interference_token_delay_s``, as the steps of a chunked prefill).
    prefill_interference: str = "none"
    interference_token_delay_s: float = 0.05
    #: Preemptions ``/metrics`` counts for each long request.
    preemptions_per_long_request: int = 0
    #: ``/server_info``'s ``vllm_config.scheduler_config``; None: 404, as a server without
    #: VLLM_SERVER_DEV_MODE.
    scheduler_config: Mapping[str, Any] | None = None
    #: The final usage chunk carries the request's own ``metrics`` (vLLM's
    #: ``--enable-per-request-metrics``), from the stand-in's engine clock: scheduled (a
    #: slot under ``max_num_seqs``) to first token, queued (body read) to scheduled, first to
    #: last token.
    per_request_metrics: bool = False

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r}: expected one of {', '.join(FAULTS)}")
        if self.tokens_per_chunk < 1 or any(count < 1 for count in self.chunk_tokens):
            raise ValueError("tokens_per_chunk and chunk_tokens must be >= 1")
        if self.prefill_interference not in PREFILL_INTERFERENCE:
            raise ValueError(f"prefill_interference must be one of {PREFILL_INTERFERENCE}")
        if self.kv_connector not in (None, *CACHE_HIT_SOURCES[1:]):
            raise ValueError(f"kv_connector must be None or one of {CACHE_HIT_SOURCES[1:]}")
        if self.external_cached_prompt_tokens and self.kv_connector is None:
            raise ValueError("external_cached_prompt_tokens needs a kv_connector")

    def is_long(self, prompt_tokens: int) -> bool:
        return self.long_prompt_from is None or prompt_tokens >= self.long_prompt_from


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body_bytes: int
    payload: Any = field(default=None, repr=False)  # parsed JSON, None when not read


@dataclass(frozen=True)
class StreamTimes:
    """When the fake did what for one streamed request, on ``time.perf_counter``'s clock.

    That is the client's clock (:mod:`pytest_longctx.client`): CLOCK_MONOTONIC on Linux, shared
    by every process of the machine, so the stamps compare with a client's in another process.
    Each chunk is stamped just before it is handed to the socket, so a client cannot see it
    before its stamp.
    """

    request_at: float  # the request line was read (the fake's intake starts)
    body_read_at: float  # the whole body was read: the schedule's origin
    chunks_written_at: tuple[float, ...]  # each token-carrying chunk, just before its write
    tokens_per_chunk: tuple[int, ...]
    tokens: int
    #: The first ids of an id prompt (its nonce), to tell requests apart.
    prompt_head: tuple[int, ...] = ()
    #: The decode as the engine's clock had it (first token to last), what /metrics counts.
    decode_s: float = 0.0
    #: The per-request ``metrics`` the final usage chunk carried (``per_request_metrics``).
    metrics: Mapping[str, float] | None = None

    @property
    def first_token_at(self) -> float | None:
        return self.chunks_written_at[0] if self.chunks_written_at else None

    @property
    def last_token_at(self) -> float | None:
        return self.chunks_written_at[-1] if self.chunks_written_at else None


@dataclass
class _Totals:
    """Monotonic counters behind /metrics."""

    requests: int = 0
    ttft: float = 0.0
    prefill: float = 0.0
    queue: float = 0.0
    decode: float = 0.0
    inter_token: float = 0.0
    inter_token_count: int = 0
    e2e: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0  # the device's prefix cache
    external_cached_tokens: int = 0  # the KV connector's
    external_queries: int = 0
    preemptions: int = 0
    #: Connections accepted, and those the idle limit closed (``Behaviour.idle_close_s``).
    connections_opened: int = 0
    connections_closed_idle: int = 0
    #: Observations per bucket (not cumulative) of the inter-token histogram.
    itl_buckets: list[int] = field(default_factory=lambda: [0] * (len(ITL_BUCKETS) + 1))
    created: float = field(default_factory=time.time)


class FakeVLLM:
    """The server; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or Behaviour()
        self.port = port
        self.requests: list[ReceivedRequest] = []
        self.streams: list[StreamTimes] = []
        #: Id prompts seen, for ``Behaviour.prefix_cache``.
        self.cached_prompts: list[list[int]] = []
        self.totals = _Totals()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: The request in flight: [t_body, prompt tokens, tokens sent], for the KV gauge, and
        #: the behaviour it is served with (its prefill's pace).
        self._active: list[float] | None = None
        self._active_behaviour: Behaviour | None = None
        #: Requests streaming now, and those waiting for a slot (``max_num_seqs``).
        self.running = 0
        self.waiting = 0
        self._slots = threading.Condition(self._lock)
        #: Long prompts' prefills: (start, end) on perf_counter's clock.
        self.prefills: list[tuple[float, float]] = []
        #: Set by fault ``engine_death``: /health answers 503, completions 500.
        self.engine_dead = False
        #: Completion requests begun, for ``Behaviour.flush_first_requests``.
        self.completions_begun = 0

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeVLLM is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def configure(self, **changes: Any) -> FakeVLLM:
        self.behaviour = replace(self.behaviour, **changes)
        return self

    def pause(self, seconds: float) -> None:
        """Hold the streams for ``seconds`` from now (each stops at its next chunk), as a host
        that stops scheduling this process would."""

        def hold() -> None:
            with self._lock:
                time.sleep(seconds)

        threading.Thread(target=hold, name="fake-vllm-pause", daemon=True).start()

    def start(self) -> FakeVLLM:
        server = _PrestartedServer(("127.0.0.1", self.port), _Handler)
        server.fake = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- used by the handler -----------------------------------------------------------------

    def record(self, request: ReceivedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def prefix_hit(self, prompt: list[int], block: int) -> int:
        """Tokens of ``prompt`` an earlier prompt's whole blocks cover; then remember it."""
        with self._lock:
            best = 0
            for earlier in self.cached_prompts:
                shared = 0
                for a, b in zip(earlier, prompt, strict=False):
                    if a != b:
                        break
                    shared += 1
                best = max(best, shared)
            self.cached_prompts.append(list(prompt))
        return min(best, len(prompt) - 1) // block * block

    def record_stream(self, times: StreamTimes) -> None:
        with self._lock:
            self.streams.append(times)

    def account(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self.totals, name, getattr(self.totals, name) + amount)

    def admit(self) -> float:
        """Wait for a slot under ``max_num_seqs``; when the request got one."""
        with self._slots:
            self.waiting += 1
            limit = self.behaviour.max_num_seqs
            while limit is not None and self.running >= limit and not self._stopping.is_set():
                self._slots.wait(0.05)
            self.waiting -= 1
            self.running += 1
        return time.perf_counter()

    def release(self) -> None:
        with self._slots:
            self.running -= 1
            self._slots.notify_all()

    def begin_completion(self) -> int:
        """Count a completion request begun; how many came before it."""
        with self._lock:
            self.completions_begun += 1
            return self.completions_begun - 1

    def add_prefill(self, start: float, end: float) -> None:
        with self._lock:
            self.prefills.append((start, end))

    def next_token_at(self, previous: float, target: float, tokens: int) -> float:
        """When a short request's token leaves, given the long prefills around it."""
        behaviour = self.behaviour
        with self._lock:
            windows = list(self.prefills)
        if behaviour.prefill_interference == "stall":
            moved = True
            while moved:
                moved = False
                for start, end in windows:
                    if start <= target < end:
                        target, moved = end, True
        elif behaviour.prefill_interference == "slow":
            for start, end in windows:
                if start <= previous < end:
                    return previous + tokens * behaviour.interference_token_delay_s
        return target

    def count_gaps(self, gaps: list[float]) -> None:
        """Observe inter-token gaps in their histogram."""
        with self._lock:
            for gap in gaps:
                index = next((i for i, b in enumerate(ITL_BUCKETS) if gap <= b), len(ITL_BUCKETS))
                self.totals.itl_buckets[index] += 1

    def hang(self) -> None:
        self._stopping.wait(_HANG_LIMIT_S)

    def die(self) -> None:
        """The engine died: vLLM's /health answers 503 from now on; its API server exits
        ``stop_after_death_s`` later."""
        self.engine_dead = True
        delay = self.behaviour.stop_after_death_s
        if delay is not None:
            threading.Timer(delay, self.stop).start()

    def metrics_text(self) -> str:
        with self._lock:
            totals = replace(self.totals)
            active = list(self._active) if self._active else None
            behaviour = self._active_behaviour or self.behaviour
        return _exposition(
            self.behaviour, totals, self._kv_usage(active, behaviour), (self.running, self.waiting)
        )

    def track(self, active: list[float] | None, behaviour: Behaviour | None = None) -> None:
        """The request in flight (``[t_body, prompt tokens, tokens sent]``) and the behaviour
        it is served with, or None."""
        with self._lock:
            self._active = active
            self._active_behaviour = behaviour

    def _kv_usage(self, active: list[float] | None, behaviour: Behaviour) -> float:
        """vLLM's gauge: blocks of the tokens computed so far over all blocks but the null one.

        Before the first token the prompt is computed a chunk per ``first_token_delay_s *
        chunk / prompt`` seconds; after it, the prompt plus the tokens sent are held."""
        if active is None:
            return 0.0
        started, prompt, sent = active
        if sent:
            tokens = prompt + sent
        else:
            delay = behaviour.first_token_delay_s
            done = (time.perf_counter() - started) / delay if delay > 0 else 1.0
            chunk = behaviour.prefill_chunk_tokens
            tokens = min(prompt, math.floor(done * prompt / chunk) * chunk)
        blocks = math.ceil(tokens / behaviour.block_size)
        return blocks / (behaviour.num_gpu_blocks - 1)


class _PrestartedServer(ThreadingHTTPServer):
    """Hands each accepted connection to a worker thread started in advance.

    Starting a thread per connection (ThreadingHTTPServer) puts a thread start inside every
    request a client times; here a spare worker is always waiting, and a new spare is started
    only when the last one is taken (by a test that keeps connections hanging).
    """

    daemon_threads = True
    spare_workers = 4

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._connections: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle_lock = threading.Lock()
        self._idle = 0
        self._workers = 0
        for _ in range(self.spare_workers):
            self._add_worker()

    def _add_worker(self) -> None:
        with self._idle_lock:
            self._idle += 1
            self._workers += 1
        threading.Thread(target=self._work, name="fake-vllm-worker", daemon=True).start()

    def _work(self) -> None:
        while (connection := self._connections.get()) is not None:
            self.process_request_thread(*connection)  # handles, then closes the socket
            with self._idle_lock:
                self._idle += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._idle_lock:
            self._idle -= 1
            spare = self._idle
        self._connections.put((request, client_address))
        if spare < 1:
            self._add_worker()

    def server_close(self) -> None:
        super().server_close()
        with self._idle_lock:
            workers = self._workers
        for _ in range(workers):
            self._connections.put(None)  # busy workers stop after their connection


def _sleep_until(target: float) -> None:
    while (remaining := target - time.perf_counter()) > 0:
        time.sleep(remaining)


#: The needle vocabulary (pytest_longctx/prompts/needle.py) takes the ids after VOCAB_SIZE,
#: one each, as in the embedded models' tokenizers: no corpus word shares its id.
RESERVED_IDS = {token: VOCAB_SIZE + index for index, token in enumerate(RESERVED_TOKENS)}
RESERVED_WORDS = {index: token for token, index in RESERVED_IDS.items()}


#: A reserved token wherever it stands (as a real tokenizer splits an added token out of the
#: text around it), else a run of other non-space characters.
_WORD = re.compile(r"<\|[a-z0-9-]+\|>|(?:(?!<\|)\S)+")


def per_request_metrics(
    queued_at: float, scheduled_at: float, first_at: float, last_at: float, tokens: int
) -> dict[str, float]:
    """vLLM's ``metrics`` for one request, as ``build_per_request_timing_metrics`` builds
    them from its stamps (0.25.1 to 0.34: milliseconds, the rate over scheduled to last)."""
    metrics = {
        "time_to_first_token_ms": (first_at - scheduled_at) * 1000,
        "generation_time_ms": (last_at - first_at) * 1000,
        "queue_time_ms": (scheduled_at - queued_at) * 1000,
    }
    if tokens > 1:
        metrics["mean_itl_ms"] = (last_at - first_at) / (tokens - 1) * 1000
    if last_at > scheduled_at:
        metrics["tokens_per_second"] = tokens / (last_at - scheduled_at)
    return metrics


def word_ids(text: str) -> list[int]:
    """The fake tokenizer: one id per whitespace-separated word or reserved token, stable
    across runs."""
    words = _WORD.findall(text)
    return [RESERVED_IDS.get(word, zlib.crc32(word.encode()) % VOCAB_SIZE) for word in words]


#: The same vocabulary where the embedded models' tokenizers put it (their last ids): a session
#: that launches the fake with the profile's tokenizer (launch_fake_conftest) sends these.
EMBEDDED_RESERVED_IDS = {
    token: EMBEDDED_MODELS["tiny-llama"].vocab_size - len(RESERVED_TOKENS) + index
    for index, token in enumerate(RESERVED_TOKENS)
}


def _needle_parts(token: str) -> tuple[str | None, int] | None:
    """``(key initial or None, value)`` of a needle token, None for anything else."""
    match = re.fullmatch(r"<\|needle-(?:([a-z])-)?(\d+)\|>", token)
    return None if match is None else (match.group(1), int(match.group(2)))


def answer_text(prompt: object, behaviour: Behaviour, prompt_tokens: int) -> str | None:
    """The first token's text for a prompt that ends with a needle question: the needle under
    the key it names (the first needle, when it names none), or a wrong one where the
    behaviour says so."""
    if isinstance(prompt, str):  # a text prompt, read as the fake's /tokenize reads it
        prompt = word_ids(prompt)
    if behaviour.answers != "retrieve" or not isinstance(prompt, list) or not prompt:
        return None
    for scheme in (RESERVED_IDS, EMBEDDED_RESERVED_IDS):
        words = {index: token for token, index in scheme.items()}
        asked = words.get(prompt[-1], "")
        if asked.startswith("<|question"):
            break
    else:
        return None
    key = asked.removeprefix("<|question").removesuffix("|>").removeprefix("-") or None
    for token in prompt:
        parts = _needle_parts(words.get(token, ""))
        if parts is not None and (key is None or parts[0] == key):
            value = parts[1]
            if prompt_tokens in behaviour.wrong_at_lengths:
                value = (value + 1) % NEEDLE_VALUES
            return needle_token(value)
    return None


def token_text(index: int, answer: str | None, behaviour: Behaviour, empty: set[int]) -> str:
    """The text of the completion's token ``index``: the reasoning a thinking model writes
    first, then the answer, then the filler (empty where the behaviour says so)."""
    thinking = behaviour.thinking_tokens
    if index < thinking:
        return "<think>" if index == 0 else ("</think>" if index == thinking - 1 else " hmm")
    if index == thinking and answer is not None:
        return answer
    return "" if index in empty else behaviour.token_text


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a chunk must leave when written, not 40 ms later

    @property
    def fake(self) -> FakeVLLM:
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def setup(self) -> None:
        super().setup()
        self.fake.account(connections_opened=1)
        if self.fake.behaviour.idle_close_s is not None:
            self.connection.settimeout(self.fake.behaviour.idle_close_s)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if format == "Request timed out: %r":  # the idle limit closed the connection
            self.fake.account(connections_closed_idle=1)

    def parse_request(self) -> bool:
        self._request_at = time.perf_counter()  # the request line was just read
        return super().parse_request()

    # -- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.fake.record(ReceivedRequest("GET", self.path, dict(self.headers), 0))
        if self.fake.behaviour.fault == "freeze":
            self.fake.hang()
            return
        if not self._authorized():
            return
        if self.path == "/health":
            self._send(503 if self.fake.engine_dead else 200, b"", "application/json")
        elif self.path == "/v1/models":
            behaviour = self.fake.behaviour
            model = {
                "id": behaviour.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": behaviour.model,
                "parent": None,
                "max_model_len": behaviour.max_model_len,
            }
            self._send_json(200, {"object": "list", "data": [model]})
        elif self.path.split("?")[0] == "/server_info":
            config = self.fake.behaviour.scheduler_config
            if config is None:
                self._error(404, "NotFoundError", f"Not Found: {self.path}")
            else:
                info = {"vllm_config": {"scheduler_config": dict(config)}, "vllm_env": {}}
                self._send_json(200, info)
        elif self.path == "/metrics" and self.fake.behaviour.metrics_status != 200:
            self._send(self.fake.behaviour.metrics_status, b"Not Found", "text/plain")
        elif self.path == "/metrics":
            self._send(200, self.fake.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._error(404, "NotFoundError", f"Not Found: {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        behaviour = self.fake.behaviour
        streaming_sink = self.path == "/v1/completions" and not behaviour.read_prompt
        try:
            body, commas, head = self._read_body(keep=not streaming_sink)
        except ConnectionError:
            return
        t_body = time.perf_counter()
        payload = None
        if not streaming_sink:
            try:
                payload = json.loads(body)
            except ValueError:
                self.fake.record(ReceivedRequest("POST", self.path, dict(self.headers), 0))
                self._error(400, "BadRequestError", "JSON decode error", code_name="json_invalid")
                return
        size = int(self.headers.get("Content-Length", "0"))
        self.fake.record(ReceivedRequest("POST", self.path, dict(self.headers), size, payload))
        if not self._authorized():
            return
        if self.path == "/tokenize":
            self._tokenize(payload)
        elif self.path == "/detokenize" and behaviour.detokenize:
            self._detokenize(payload)
        elif self.path == "/v1/completions":
            if payload is None:
                payload = _sink_payload(head, commas)
            self._complete(payload, behaviour, t_body)
        else:
            self._error(404, "NotFoundError", f"Not Found: {self.path}")

    # -- endpoints ---------------------------------------------------------------------------

    def _detokenize(self, payload: Any) -> None:
        """One word per id, so the text tokenizes back to as many tokens as it had ids."""
        tokens = payload.get("tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, list):
            self._error(400, "BadRequestError", "tokens must be a list", param="tokens")
            return
        words = (RESERVED_WORDS.get(token, f"w{token}") for token in tokens)
        self._send_json(200, {"prompt": " ".join(words)})

    def _tokenize(self, payload: Any) -> None:
        prompt = payload.get("prompt") if isinstance(payload, dict) else None
        if not isinstance(prompt, str):
            self._error(400, "BadRequestError", "prompt must be a string", param="prompt")
            return
        ids = word_ids(prompt)
        self._send_json(
            200,
            {
                "count": len(ids),
                "max_model_len": self.fake.behaviour.max_model_len,
                "tokens": ids,
                "token_strs": None,
            },
        )

    def _complete(self, payload: dict[str, Any], behaviour: Behaviour, t_body: float) -> None:
        prompt = payload.get("prompt")
        head = prompt[0] if isinstance(prompt, list) and prompt else None
        if behaviour.fault_prompt_head is not None and head != behaviour.fault_prompt_head:
            behaviour = replace(behaviour, fault=None)
        if behaviour.flush_prompt_head is not None and head != behaviour.flush_prompt_head:
            behaviour = replace(behaviour, deliver_at_once=False, flush_last_tokens=0)
        if self.fake.begin_completion() < behaviour.flush_first_requests:
            behaviour = replace(behaviour, deliver_at_once=True)
        fault = behaviour.fault
        if "_count" in payload:
            prompt_tokens = payload["_count"]
        elif isinstance(prompt, str):
            prompt_tokens = len(word_ids(prompt))
        elif isinstance(prompt, list):
            prompt_tokens = len(prompt)
        else:
            prompt_tokens = 0
        max_tokens = payload.get("max_tokens", 16)
        if payload.get("model") not in (None, behaviour.model):
            self._error(
                404,
                "NotFoundError",
                f"The model `{payload.get('model')}` does not exist.",
                param="model",
            )
            return
        if prompt_tokens == 0:
            self._error(400, "BadRequestError", "Prompt cannot be empty", param="prompt")
            return
        if not isinstance(max_tokens, int) or max_tokens < 1:
            self._error(400, "BadRequestError", "max_tokens must be at least 1", param="max_tokens")
            return
        if prompt_tokens > behaviour.max_model_len:
            message = TOO_LONG_MESSAGE.format(limit=behaviour.max_model_len, count=prompt_tokens)
            self._error(400, "BadRequestError", message, param="input_tokens")
            return
        if fault == "http_500" or self.fake.engine_dead:
            self._error(
                500,
                "InternalServerError",
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            )
            return
        if fault in ("hang_before_headers", "freeze"):
            self.fake.hang()
            self.close_connection = True
            return
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if behaviour.prefix_cache and isinstance(prompt, list):
            hit = self.fake.prefix_hit(prompt, behaviour.block_size)
            behaviour = replace(behaviour, cached_prompt_tokens=hit)
        total = behaviour.tokens
        if total is None:
            total = max(0, min(max_tokens, behaviour.max_model_len - prompt_tokens))
        stream_options = payload.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage")) and fault != "no_usage"
        running = (
            include_usage
            and behaviour.continuous_usage
            and bool(stream_options.get("continuous_usage_stats"))
        )
        with_ids = bool(payload.get("return_token_ids"))
        queued_at = t_body
        t_body = max(t_body, self.fake.admit())
        try:
            if fault == "stuck_engine":
                self.fake.hang()  # the client's going away changes nothing
                self.close_connection = True
                return
            self._stream(
                behaviour,
                (queued_at, t_body),
                total,
                prompt_tokens,
                (include_usage, running),
                with_ids,
                payload,
            )
        finally:
            self.fake.release()

    def _stream(
        self,
        behaviour: Behaviour,
        admitted: tuple[float, float],
        total: int,
        prompt_tokens: int,
        usage_options: tuple[bool, bool],
        with_ids: bool,
        payload: dict[str, Any],
    ) -> None:
        include_usage, running_usage = usage_options
        queued_at, t_body = admitted  # the body read; a slot under max_num_seqs (scheduled)
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        fault = behaviour.fault
        created = int(time.time())
        request_id = f"cmpl-{created}"

        def chunk(
            choices: list[dict[str, Any]],
            usage: dict[str, Any] | None = None,
            metrics: dict[str, float] | None = None,
        ) -> bytes:
            body: dict[str, Any] = {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": behaviour.model,
                "choices": choices,
            }
            if usage is not None:
                body["usage"] = usage
            if metrics is not None:
                body["metrics"] = metrics
            return b"data: " + json.dumps(body).encode() + b"\n\n"

        active = [t_body, prompt_tokens, 0]
        self.fake.track(active, behaviour)
        long = behaviour.is_long(prompt_tokens)
        first_delay = behaviour.first_token_delay_s if long else behaviour.short_first_token_delay_s
        if long and behaviour.prefill_interference != "none":
            self.fake.add_prefill(t_body, t_body + first_delay)
        try:
            if fault == "hang_after_headers":
                self._idle_until(behaviour, time.perf_counter() + _HANG_LIMIT_S)
                self._hold()
                return
            for _ in range(behaviour.empty_chunks_first):
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if with_ids:
                    choice["token_ids"] = []
                self._write(chunk([choice]))
            empty = {index % total for index in behaviour.empty_text_tokens} if total else set()
            answer = answer_text(payload.get("prompt"), behaviour, prompt_tokens)
            sent = 0
            written: list[float] = []
            decoded: list[float] = []  # when each chunk's last token was ready
            held: list[bytes] = []  # chunks not yet written (deliver_at_once, flush_last_tokens)
            counts: list[int] = []
            due = t_body  # when the last token left; the schedule's origin before the first
            while sent < total:
                faults = (
                    "error_frame",
                    "truncate",
                    "end_without_done",
                    "malformed_chunk",
                    "stall",
                    "engine_death",
                )
                if fault in faults and (sent >= behaviour.fault_after_tokens):
                    self._inject(fault)
                    return
                planned = behaviour.chunk_tokens
                count = planned[len(counts)] if len(counts) < len(planned) else None
                count = min(count or behaviour.tokens_per_chunk, total - sent)
                last_index = sent + count - 1
                # late (the host paused us): catch up step by step, not at once
                step_share = count * behaviour.token_delay_s * MIN_STEP_SHARE
                earliest = decoded[-1] + step_share if decoded else 0.0
                if long:
                    target = t_body + first_delay + last_index * behaviour.token_delay_s
                    target = max(target, earliest)
                else:  # on an absolute schedule still: each token from the one before
                    step = count * behaviour.token_delay_s
                    nominal = due + (step if sent else first_delay + step - behaviour.token_delay_s)
                    nominal = max(nominal, earliest)
                    # then the long prefills around it, which may hold it back
                    target = self.fake.next_token_at(due, nominal, count)
                due = target
                self._idle_until(behaviour, target)
                text = "".join(
                    token_text(sent + n, answer, behaviour, empty) for n in range(count)
                )
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": "length" if sent + count == total else None,
                    "stop_reason": None,
                }
                if with_ids:
                    choice["token_ids"] = [(sent + n) % VOCAB_SIZE for n in range(count)]
                    if sent == 0:
                        choice["prompt_token_ids"] = payload.get("prompt")
                running = None
                if running_usage:
                    running = {
                        "prompt_tokens": prompt_tokens,
                        "total_tokens": prompt_tokens + sent + count,
                        "completion_tokens": sent + count,
                    }
                event = chunk([choice], running)
                decoded.append(time.perf_counter())
                if behaviour.deliver_at_once or sent + count > total - behaviour.flush_last_tokens:
                    held.append(event)
                else:
                    written.append(decoded[-1])
                    self._write(event)
                counts.append(count)
                sent += count
                self.fake.track([t_body, prompt_tokens, sent], behaviour)
            if behaviour.deliver_at_once:  # the whole stream, read event by event
                for event in held:
                    written.append(time.perf_counter())
                    self._write(event)
            elif held:  # the end of a stream in one write, as a starved server's buffer
                # leaves: a pause of this thread between writes would break the flush in two
                written.extend([time.perf_counter()] * len(held))
                self._write(b"".join(held))
            first_at, last_at = (decoded[0], decoded[-1]) if decoded else (None, None)
            if counts:  # the engine's clock: the first token left before the rest of its chunk
                first_at -= (counts[0] - 1) * behaviour.token_delay_s
            metrics = None
            if include_usage and behaviour.per_request_metrics and first_at is not None:
                metrics = per_request_metrics(queued_at, t_body, first_at, last_at, total)
            if include_usage:
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + total,
                    "completion_tokens": total,
                }
                cached = behaviour.cached_prompt_tokens + behaviour.external_cached_prompt_tokens
                if cached or behaviour.prompt_tokens_details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                self._write(chunk([], usage, metrics))
            end = time.perf_counter()
            if first_at is None or last_at is None:
                first_at, last_at = end, end
            ttft = first_at - t_body
            decode = last_at - first_at
            # recorded before [DONE]: a client that has its figures can read the stamps, and
            # a /metrics read right after the stream counts this request, as vLLM's does
            self.fake.record_stream(
                StreamTimes(
                    self._request_at,
                    t_body,
                    tuple(written),
                    tuple(counts),
                    total,
                    tuple(prompt[:8]) if isinstance(prompt := payload.get("prompt"), list) else (),
                    decode_s=decode,
                    metrics=metrics,
                )
            )
            self.fake.count_gaps([decoded[i] - decoded[i - 1] for i in range(1, len(decoded))])
            self.fake.account(
                requests=1 + behaviour.other_requests,
                ttft=ttft,
                prefill=ttft,
                decode=decode,
                inter_token=decode,
                inter_token_count=max(0, total - 1),
                e2e=end - t_body,
                prompt_tokens=prompt_tokens,
                generation_tokens=total,
                cached_tokens=(
                    behaviour.cached_prompt_tokens if behaviour.cached_tokens_in_metrics else 0
                ),
                external_cached_tokens=(
                    behaviour.external_cached_prompt_tokens
                    if behaviour.cached_tokens_in_metrics
                    else 0
                ),
                # vLLM asks its connector for what the device's cache did not hold
                external_queries=(
                    prompt_tokens - behaviour.cached_prompt_tokens if behaviour.kv_connector else 0
                ),
                preemptions=behaviour.preemptions_per_long_request if long else 0,
            )
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test): nothing to tell it
        finally:
            self.fake.track(None)

    def _inject(self, fault: str) -> None:
        if fault in ("error_frame", "engine_death"):
            behaviour = self.fake.behaviour
            error = {
                "error": {
                    "message": ENGINE_DEAD_MESSAGE
                    if fault == "engine_death"
                    else behaviour.error_message,
                    "type": behaviour.error_type,
                    "param": None,
                    "code": 500,
                }
            }
            if fault == "engine_death":
                self.fake.die()
            self._write(b"data: " + json.dumps(error).encode() + b"\n\n")
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        elif fault == "malformed_chunk":
            self._write(b'data: {"id": "cmpl-1", "choices": [{"text": \n\n')
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        elif fault == "stall":
            self._hold()
        elif fault == "end_without_done":
            self.wfile.write(b"0\r\n\r\n")
        # "truncate": return without the terminating chunk; the socket closes

    # -- plumbing ----------------------------------------------------------------------------

    def _hold(self) -> None:
        """Keep the request until its client goes away, as vLLM aborts a request whose
        client disconnected (``num_requests_running`` drops), or until the fake stops."""
        while not self.fake._stopping.is_set():
            ready, _, _ = select.select([self.connection], [], [], 0.05)
            if not ready:
                continue
            try:
                if not self.connection.recv(1, socket.MSG_PEEK):
                    return
            except OSError:
                return
            self.fake._stopping.wait(0.05)

    def _idle_until(self, behaviour: Behaviour, target: float) -> None:
        """Wait for ``target``, sending vLLM's keep-alive comment every ``keep_alive_s``."""
        interval = behaviour.keep_alive_s
        while interval > 0 and time.perf_counter() + interval < target:
            if self.fake._stopping.wait(interval):
                return
            self._write(b": keep-alive\n\n")
        if not self.fake._stopping.is_set() and target - time.perf_counter() < _HANG_LIMIT_S / 2:
            _sleep_until(target)

    def _read_body(self, keep: bool) -> tuple[bytes, int, bytes]:
        """The body (or, when not kept, its comma count and first kilobyte)."""
        remaining = int(self.headers.get("Content-Length", "0"))
        pieces = []
        commas = 0
        head = b""
        while remaining > 0:
            piece = self.rfile.read(min(remaining, 1 << 20))
            if not piece:
                raise ConnectionError("client closed during upload")
            remaining -= len(piece)
            if keep:
                pieces.append(piece)
            else:
                if len(head) < 1024:
                    head += piece[: 1024 - len(head)]
                commas += piece.count(b",")
        return b"".join(pieces), commas, head

    def _authorized(self) -> bool:
        behaviour = self.fake.behaviour
        sent = self.headers.get("Authorization", "")
        if behaviour.fault == "reject_echoing_auth":
            self._error(401, "AuthenticationError", f"invalid credentials in header {sent!r}")
            return False
        if behaviour.api_key is None or sent == f"Bearer {behaviour.api_key}":
            return True
        self._send_json(401, {"error": "Unauthorized"})
        return False

    def _write(self, event: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, body: Any) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _error(
        self,
        status: int,
        error_type: str,
        message: str,
        param: str | None = None,
        code_name: str | None = None,
    ) -> None:
        error = {"message": message, "type": error_type, "param": param, "code": status}
        if code_name is not None:
            error["code"] = code_name
        self._send_json(status, {"error": error})


def _sink_payload(head: bytes, commas: int) -> dict[str, Any]:
    """What a discarded body asked for, from its first kilobyte and its comma count."""
    text = head.decode("utf-8", "replace")
    max_tokens = re.search(r'"max_tokens":\s*(\d+)', text)
    marker = text.find('"prompt":')
    head_commas = text[:marker].count(",") if marker != -1 else 0
    usage = re.search(r'"include_usage":\s*true', text)
    running = re.search(r'"continuous_usage_stats":\s*true', text)
    return {
        "_count": commas - head_commas + 1,  # the prompt is last: its ids are its commas + 1
        "max_tokens": int(max_tokens.group(1)) if max_tokens else 16,
        "stream_options": {"include_usage": bool(usage), "continuous_usage_stats": bool(running)},
    }


def _exposition(
    behaviour: Behaviour,
    totals: _Totals,
    kv_usage: float = 0.0,
    requests: tuple[int, int] = (0, 0),
) -> str:
    """vLLM-shaped Prometheus text: HELP/TYPE, labels, histograms with +Inf, _created."""
    labels = f'engine="0",model_name="{behaviour.model}"'
    lines: list[str] = []

    def histogram(
        name: str,
        help_text: str,
        total: float,
        count: int,
        buckets: tuple[tuple[float, int], ...] | None = None,
    ) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} histogram")
        if buckets is None:  # every observation at the mean
            buckets = tuple(
                (bound, count if count and total / count <= bound else 0)
                for bound in (0.001, 0.01, 0.1, 1.0, 10.0)
            )
        for bound, below in buckets:
            lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(below)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}')
        lines.append(f"{name}_count{{{labels}}} {float(count)}")
        lines.append(f"{name}_sum{{{labels}}} {total!r}")
        lines.append(f"{name}_created{{{labels}}} {totals.created!r}")

    def counter(name: str, help_text: str, value: float, extra: str = "") -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} counter")
        label_text = labels + (f",{extra}" if extra else "")
        lines.append(f"{name}_total{{{label_text}}} {float(value)}")
        lines.append(f"{name}_created{{{label_text}}} {totals.created!r}")

    histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        totals.ttft,
        totals.requests,
    )
    histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        totals.prefill,
        totals.requests,
    )
    histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        totals.queue,
        totals.requests,
    )
    if behaviour.decode_metric:
        histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            totals.decode,
            totals.requests,
        )

    def cumulative(bounds: tuple[float, ...], counts: list[int]) -> tuple[tuple[float, int], ...]:
        return tuple((bound, sum(counts[: index + 1])) for index, bound in enumerate(bounds))

    histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        totals.inter_token,
        totals.inter_token_count,
        cumulative(ITL_BUCKETS, totals.itl_buckets),
    )
    histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        totals.e2e,
        totals.requests,
    )
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", totals.prompt_tokens)
    counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        totals.generation_tokens,
    )
    external = totals.external_cached_tokens
    counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        totals.cached_tokens + external,
    )
    computed = totals.prompt_tokens - totals.cached_tokens - external
    for source, value in (
        ("local_compute", computed),
        ("local_cache_hit", totals.cached_tokens),
        ("external_kv_transfer", external),
    ):
        counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            value,
            f'source="{source}"',
        )
    if behaviour.cached_by_source:  # vLLM 0.32 on: every tier's counter, from zero
        for source in CACHE_HIT_SOURCES:
            value = totals.cached_tokens if source == "device" else 0
            if source == behaviour.kv_connector:
                value = external
            counter(
                "vllm:prompt_tokens_cached_by_source",
                "Prefix-cache hit tokens by the cache tier that supplied them.",
                value,
                f'source="{source}"',
            )
    counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing.",
        totals.external_queries,
    )
    counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing.",
        external,
    )
    counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        totals.prompt_tokens,
    )
    counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        totals.cached_tokens,
    )
    counter("vllm:num_preemptions", "Cumulative number of preemption.", totals.preemptions)
    for name, value in zip(("running", "waiting"), requests, strict=True):
        lines.append(f"# TYPE vllm:num_requests_{name} gauge")
        lines.append(f"vllm:num_requests_{name}{{{labels}}} {float(value)}")
    lines.append("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.")
    lines.append("# TYPE vllm:kv_cache_usage_perc gauge")
    lines.append(f"vllm:kv_cache_usage_perc{{{labels}}} {kv_usage!r}")
    lines.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
    lines.append("# TYPE vllm:cache_config_info gauge")
    size_tokens = behaviour.block_size * behaviour.num_gpu_blocks
    alignment = behaviour.cache_hit_alignment_tokens
    lines.append(
        f'vllm:cache_config_info{{block_size="{behaviour.block_size}",cache_dtype="auto",'
        + (f'cache_hit_alignment_tokens="{alignment}",' if alignment is not None else "")
        + f'enable_prefix_caching="{behaviour.prefix_caching}",engine="0",'
        f'kv_cache_size_tokens="{size_tokens}",num_gpu_blocks="{behaviour.num_gpu_blocks}"}} 1.0'
    )
    return "\n".join(lines) + "\n"


class FakeVLLMProcess:
    """The fake in a process of its own, for timing the client.

    In the client's process the fake's parsing and writing would compete with the client for
    the interpreter lock, and its time would show as the client's; here it runs on another
    core. Its stamps are on the same clock (``time.perf_counter``, CLOCK_MONOTONIC on Linux,
    shared across processes). It offers ``url``, ``configure()`` and ``streams``.
    """

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self._behaviour = behaviour or Behaviour()
        self._context = multiprocessing.get_context("spawn")
        self._conn: Any = None
        self._process: Any = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("FakeVLLMProcess is not started")
        return self._url

    @property
    def streams(self) -> list[StreamTimes]:
        return self._call("streams")

    def configure(self, **changes: Any) -> FakeVLLMProcess:
        self._call("configure", changes)
        return self

    def start(self) -> FakeVLLMProcess:
        self._conn, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve_in_process, args=(child, self._behaviour), daemon=True
        )
        self._process.start()
        child.close()
        if not self._conn.poll(60):
            self.stop()
            raise RuntimeError("the fake server's process did not start within 60 s")
        self._url = self._conn.recv()
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.is_alive():
            with contextlib.suppress(EOFError, OSError):
                self._call("stop")
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
        self._conn.close()
        self._process = None

    def __enter__(self) -> FakeVLLMProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _call(self, command: str, argument: Any = None) -> Any:
        self._conn.send((command, argument))
        return self._conn.recv()


def _serve_in_process(conn: Any, behaviour: Behaviour) -> None:
    with FakeVLLM(behaviour) as fake:
        conn.send(fake.url)
        while True:
            try:
                command, argument = conn.recv()
            except EOFError:
                return
            if command == "configure":
                fake.configure(**argument)
                conn.send(None)
            elif command == "streams":
                with fake._lock:
                    conn.send(list(fake.streams))
            else:
                conn.send(None)
                return


@pytest.fixture
def fake_vllm() -> Iterator[FakeVLLM]:
    """A started fake server with default behaviour; ``configure()`` it per test."""
    with FakeVLLM() as server:
        yield server
