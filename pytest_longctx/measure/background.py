"""Background streams: K short requests kept running beside a measured long prompt.

They run in a process of their own (``multiprocessing`` spawn), one thread and one HTTP
connection per stream, so neither their parsing nor their stamps share an interpreter lock
with the measured stream's. Each stream sends a bounded request (a short prompt that opens
with its own nonce, then a fixed decode), and when it ends sends the next one, until told to
stop: one endless request would grow its own context, and its cache, through an hours-long
prefill. The streams' first requests are shorter, each by its own share, so that their
requests never end together (:func:`request_decode_tokens`). Every token's arrival is stamped
by the one client (:mod:`pytest_longctx.client`) on :func:`time.perf_counter`, CLOCK_MONOTONIC
on Linux, the clock of every process of the machine: the parent lines the stamps up with its
own. A request's stamps come back to the parent when it ends.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pytest_longctx.client import (
    ClientConfig,
    CompletionClient,
    CompletionRequest,
    MeasurementError,
    ServerTiming,
    StreamProgress,
)
from pytest_longctx.prompts.builder import nonce_ids

#: The clock the stamps are on, as :func:`time.get_clock_info` names it: the parent checks the
#: child's is the same.
CLOCK: Final = "perf_counter"
#: Longest wait for a stream's first token, and for the process to come up and go down.
FIRST_TOKEN_BUDGET_S = 600.0
STOP_TIMEOUT_S = 120.0
_POLL_S = 0.01


class BackgroundError(RuntimeError):
    """The background streams could not be started or did not report back."""


@dataclass(frozen=True)
class BackgroundSpec:
    """What the background process sends: to whom, how many streams, and the prompts."""

    base_url: str
    model: str
    streams: int
    #: The prompt every request sends after its own nonce (token ids).
    prompt_ids: tuple[int, ...] = field(repr=False)
    #: Ids a nonce is drawn from, and the key that makes these nonces this point's own.
    nonce_pool: tuple[int, ...] = field(repr=False)
    nonce_key: str
    decode_tokens: int
    api_key: str | None = field(default=None, repr=False)
    tcp_keepalive_s: float = 15.0
    first_token_budget_s: float = FIRST_TOKEN_BUDGET_S


@dataclass(frozen=True)
class BackgroundRequest:
    """One finished (or failed) background request, on the shared monotonic clock."""

    stream: int
    index: int
    sent_at: float
    #: Arrival of each token-carrying chunk, absolute (perf_counter seconds).
    token_times: tuple[float, ...]
    tokens_per_chunk: tuple[int, ...]
    completion_tokens: int
    prompt_tokens: int | None = None
    error: str | None = None
    #: The server's own timing of this request (vLLM's per-request metrics), if it sent it.
    server_timing: ServerTiming | None = None

    @property
    def gaps(self) -> list[tuple[float, float, int]]:
        """(start, end, tokens) of each gap between two chunks of this request: the gaps a
        user of this stream waits between tokens (not its first token's wait)."""
        times, counts = self.token_times, self.tokens_per_chunk
        return [(times[i - 1], times[i], counts[i]) for i in range(1, len(times))]


def request_decode_tokens(spec: BackgroundSpec, stream: int, index: int) -> int:
    """Tokens the stream's ``index``-th request decodes. The first requests end a K-th of the
    decode apart (stream s decodes (s + 1) / K of it), the later ones decode all of it: the
    streams' requests then end in different steps, and at any moment all but one stream are
    inside a request, where a step the long prompt holds shows as a gap. Sent in step, all K
    requests ended together, and a prefill that began while all K waited for their next first
    token showed in no gap (on a whole-prompt chunk, the longest gap beside a 16Ki prefill was
    0.4 s)."""
    if index > 0:
        return spec.decode_tokens
    return max(1, spec.decode_tokens * (stream + 1) // spec.streams)


def request_prompt(spec: BackgroundSpec, stream: int, index: int) -> list[int]:
    """The stream's ``index``-th prompt: its own nonce, then the shared text."""
    nonce = nonce_ids(spec.nonce_pool, spec.nonce_key, stream * 1_000_003 + index)
    return [*nonce, *spec.prompt_ids[len(nonce) :]]


def _stream_loop(
    spec: BackgroundSpec,
    stream: int,
    stop: threading.Event,
    progress: list[StreamProgress],
    ended: dict[int, bool],
    results: Any,
) -> None:
    """Send one request after the other until ``stop``; report each as it ends, and note the
    stream in ``ended`` once a request of it ended with a token (a request flushed whole can
    end before a poll of ``progress`` sees its first token), True once one of them brought
    its tokens over more than a poll's interval (it streamed, rather than arrived whole)."""
    config = ClientConfig(
        base_url=spec.base_url, api_key=spec.api_key, tcp_keepalive_s=spec.tcp_keepalive_s
    )
    with CompletionClient(config) as client:
        index = 0
        while not stop.is_set():
            request = CompletionRequest(
                model=spec.model,
                prompt=request_prompt(spec, stream, index),
                decode_tokens=request_decode_tokens(spec, stream, index),
            )
            watched = StreamProgress()
            progress[stream] = watched
            sent_at = time.perf_counter()
            try:
                measured = client.measure(
                    request,
                    first_token_budget_s=spec.first_token_budget_s,
                    budget_source="the background streams' limit",
                    check_count=False,
                    progress=watched,
                )
            except MeasurementError as exc:
                failed = BackgroundRequest(stream, index, sent_at, (), (), 0, None, str(exc))
                results.put(("request", failed))
                stop.wait(0.5)  # a server that refuses or died: do not spin on it
            else:
                times = measured.token_times_s
                if times:
                    spread = len(times) > 1 and times[-1] - times[0] > _POLL_S
                    ended[stream] = ended.get(stream, False) or spread
                start = measured.started_perf_s
                results.put(
                    (
                        "request",
                        BackgroundRequest(
                            stream,
                            index,
                            start,
                            tuple(start + t for t in measured.token_times_s),
                            measured.tokens_per_chunk,
                            measured.completion_tokens,
                            measured.prompt_tokens,
                            server_timing=measured.server_timing,
                        ),
                    )
                )
            index += 1


def _serve(spec: BackgroundSpec, stop_event: Any, ready: Any, results: Any) -> None:
    """The background process: K stream threads; ``ready`` once every stream's first request
    has ended, then run until the parent sets ``stop_event``. The streams' start (a new
    process, K connections and prefills at once) is what a loaded host most often holds back
    or flushes whole: no window of the point begins before it is over. With ``ready`` it
    reports how many streams were seen streaming (tokens arriving at two polls of one
    request, or a finished request's tokens spread over more than a poll's interval) and how
    many had only had requests arrive whole: a stream flushed whole has no gap of the
    server's."""
    results.put(("clock", time.get_clock_info(CLOCK).implementation))
    stop = threading.Event()
    progress = [StreamProgress() for _ in range(spec.streams)]
    ended: dict[int, bool] = {}  # streams a request of which ended with tokens (their threads')
    threads = [
        threading.Thread(
            target=_stream_loop, args=(spec, index, stop, progress, ended, results), daemon=True
        )
        for index in range(spec.streams)
    ]
    for thread in threads:
        thread.start()
    seen: set[int] = set()  # streams seen receiving tokens at two polls of one request
    counted: dict[int, tuple[StreamProgress, int]] = {}
    while not stop_event.is_set():
        if not ready.is_set():
            for index, watched in enumerate(progress):
                if watched.first_token_at is None or watched.finished:
                    continue
                earlier = counted.get(index)
                if earlier is not None and earlier[0] is watched and earlier[1] < watched.tokens:
                    seen.add(index)
                counted[index] = (watched, watched.tokens)
            done = dict(ended)
            streaming = (seen & set(done)) | {index for index, spread in done.items() if spread}
            flushed = set(done) - streaming
            if len(done) == spec.streams:
                ready_by = {"streaming": len(streaming), "flushed_whole": len(flushed)}
                results.put(("ready", ready_by))
                ready.set()
        time.sleep(_POLL_S)
    stop.set()
    for thread in threads:
        thread.join()
    results.put(("done", None))


class BackgroundStreams:
    """The parent's handle on the background process: start, wait until every stream
    streams, stop and collect every request's stamps."""

    def __init__(self, spec: BackgroundSpec) -> None:
        self.spec = spec
        self._context = multiprocessing.get_context("spawn")
        self._stop = self._context.Event()
        self._ready = self._context.Event()
        self._results = self._context.Queue()
        self._process: Any = None
        self.requests: list[BackgroundRequest] = []
        #: When the parent saw every stream streaming (perf_counter), once it has.
        self.ready_at: float | None = None
        #: How the streams became ready: ``streaming`` (a token seen while their request
        #: ran) and ``flushed_whole`` (only a request that arrived whole); None before.
        self.ready_by: dict[str, int] | None = None

    def start(self) -> BackgroundStreams:
        self._process = self._context.Process(
            target=_serve, args=(self.spec, self._stop, self._ready, self._results), daemon=True
        )
        self._process.start()
        kind, clock = self._next(STOP_TIMEOUT_S)
        own = time.get_clock_info(CLOCK).implementation
        if kind != "clock" or clock != own:
            self.stop()
            raise BackgroundError(
                f"the background process stamps on {clock!r}, this one on {own!r}: the stamps "
                "would not line up"
            )
        return self

    def wait_streaming(self, timeout_s: float) -> bool:
        """True once every stream streams, its first request ended; False after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            self._drain()
            if not self._process.is_alive():
                raise BackgroundError(
                    f"the background process exited (status {self._process.exitcode})"
                )
            if time.monotonic() > deadline:
                return False
        self.ready_at = time.perf_counter()
        return True

    def stop(self, abandon: bool = False) -> list[BackgroundRequest]:
        """Stop sending; the requests in flight finish (bounded), then the process ends.
        ``abandon``: end it at once, its connections closed (the server aborts what they
        asked; for a probe, whose requests measure nothing)."""
        if self._process is None:
            return self.requests
        self._stop.set()
        if abandon:
            self._process.kill()
        deadline = time.monotonic() + (0 if abandon else STOP_TIMEOUT_S)
        done = False
        while not done and time.monotonic() < deadline:
            try:
                kind, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                if not self._process.is_alive():
                    self._drain()
                    break
                continue
            self._take(kind, payload)
            done = kind == "done"
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        with contextlib.suppress(Exception):
            self._results.close()
        self._process = None
        return self.requests

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._take(*self._results.get_nowait())

    def _take(self, kind: str, payload: Any) -> None:
        if kind == "request":
            self.requests.append(payload)
        elif kind == "ready":
            self.ready_by = dict(payload)

    def _next(self, timeout_s: float) -> tuple[str, Any]:
        try:
            return self._results.get(timeout=timeout_s)
        except queue.Empty:
            raise BackgroundError(
                f"the background process did not start within {timeout_s:g} s"
            ) from None

    def __enter__(self) -> BackgroundStreams:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def requests_in(requests: Sequence[BackgroundRequest]) -> dict[str, int]:
    """How many background requests ran, finished and failed."""
    failed = sum(r.error is not None for r in requests)
    return {"requests": len(requests), "finished": len(requests) - failed, "failed": failed}
