"""The client: control endpoints, and one streamed completion timed from t0: the stream's
server-sent events and token counts, the connection opened before t0, and the two deadlines
that cut a stalled stream."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from pytest_longctx.core.files import REDACTED

from .config import ClientConfig, ModelEntry
from .errors import (
    CompletionCountError,
    ErrorFrameError,
    FirstTokenTimeoutError,
    InterTokenTimeoutError,
    MalformedChunkError,
    MalformedResponseError,
    MeasurementError,
    MeasurementTimeoutError,
    MissingUsageError,
    NotConnectedError,
    NoTokensError,
    ServerUnavailableError,
    StreamError,
    TruncatedStreamError,
)
from .rejections import count_message, describe, int_or_none, read_limited, rejection
from .request import CompletionRequest, RequestBody, encode_request
from .result import (
    COMPLETION_HEAD_CHARS,
    ServerTiming,
    StreamMeasurement,
    inter_token_gaps,
    quantile,
    summarize_stream,
)
from .stream_progress import StreamProgress

# Server-sent events from raw bytes, and how many tokens a streamed choice carries.


class _SSEDecoder:
    """Server-sent events from raw bytes; linear in the input even for a huge single event."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0
        self._data_lines: list[bytes] = []

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        events: list[str] = []
        start = 0
        while True:
            newline = self._buffer.find(b"\n", max(start, self._scanned))
            if newline < 0:
                break
            line = bytes(self._buffer[start:newline]).rstrip(b"\r")
            start = newline + 1
            if not line:
                if self._data_lines:
                    events.append(b"\n".join(self._data_lines).decode("utf-8", "replace"))
                    self._data_lines = []
            elif line.startswith(b"data:"):
                payload = line[5:]
                self._data_lines.append(payload[1:] if payload.startswith(b" ") else payload)
            # comments (":...") and event:/id:/retry: fields carry nothing measured
        del self._buffer[:start]
        self._scanned = len(self._buffer)
        return events

    def finish(self) -> list[str]:
        """Events left when the stream ends without a final blank line."""
        events = self.feed(b"\n\n") if (self._buffer or self._data_lines) else []
        return events


def _choice_tokens(choice: Mapping[str, Any]) -> tuple[int, str]:
    """Tokens a streamed choice carries and how they were counted."""
    token_ids = choice.get("token_ids")
    if isinstance(token_ids, list):
        return len(token_ids), "token_ids"
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, Mapping) and isinstance(logprobs.get("tokens"), list):
        return len(logprobs["tokens"]), "logprobs"
    if isinstance(choice.get("text"), str):
        return 1, "text"  # "" too: a token whose text the detokenizer holds back
    delta = choice.get("delta")
    if isinstance(delta, Mapping) and isinstance(delta.get("content"), str):
        # a chat role announcement carries "content": "" beside "role" and no token
        return (0 if "role" in delta and not delta["content"] else 1), "text"
    return 0, "text"


def _running_count(chunk: Mapping[str, Any]) -> int | None:
    """A chunk's running ``usage.completion_tokens`` (``continuous_usage_stats``), if any.

    Only chunks with choices: the final usage-only chunk repeats the total and carries nothing.
    """
    usage = chunk.get("usage")
    if not chunk.get("choices") or not isinstance(usage, Mapping):
        return None
    value = usage.get("completion_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _ChunkCounter:
    """Tokens per carrying chunk: from the running usage count when every chunk has one.

    vLLM's ``continuous_usage_stats`` puts the running ``completion_tokens`` in every chunk,
    so a chunk carries the difference to the previous one, exactly, for chunks of any size.
    A server that omits it is counted chunk by chunk (:func:`_choice_tokens`), and the
    measurement says which source counted.
    """

    def __init__(self) -> None:
        self.choice_counts: list[int] = []
        self.running: list[int | None] = []
        self.choice_source = "text"
        self.total = 0  # tokens so far, as best known while the stream runs

    def add(self, choice_count: int, choice_source: str, running: int | None) -> int:
        """One chunk; the tokens it carries (0: it carries none and stops no clock)."""
        previous = next((value for value in reversed(self.running) if value is not None), 0)
        delta = running - previous if running is not None else None
        carried = delta if delta is not None and delta > 0 else 0
        if not choice_count and not carried:
            return 0
        if choice_count:
            self.choice_source = choice_source
        self.choice_counts.append(choice_count)
        self.running.append(running)
        tokens = carried or choice_count  # a count that did not rise: the chunk's own count
        self.total = running if running is not None else self.total + tokens
        return tokens

    def counts(self) -> tuple[tuple[int, ...], str]:
        """Tokens per carrying chunk and their source: ``usage`` when every carrying chunk had
        a running count that rose, else the chunks' own counts."""
        running = self.running
        if running and all(value is not None for value in running):
            values = [0, *(value or 0 for value in running)]
            deltas = tuple(values[i + 1] - values[i] for i in range(len(running)))
            if all(delta >= 1 for delta in deltas):
                return deltas, "usage"
        return tuple(self.choice_counts), self.choice_source


# A TCP connection opened just before t0, so connecting is not timed as TTFT.


#: Unanswered keepalive probes after which the kernel gives up on the peer.
KEEPALIVE_PROBES = 4


def keepalive_options(interval_s: float) -> list[tuple[int, int, int]]:
    """Socket options for TCP keepalive probes every ``interval_s`` seconds of silence.

    A prefill of hours keeps its connection silent; a NAT or an L4 load balancer between
    client and server drops an idle connection after minutes. Probes are answered by the
    server's kernel, so they keep the path's state alive without a byte in the stream.
    """
    if not interval_s > 0:
        return []
    seconds = max(1, round(interval_s))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    if idle is not None:  # Linux: TCP_KEEPIDLE; macOS: TCP_KEEPALIVE
        options.append((socket.IPPROTO_TCP, idle, seconds))
    if hasattr(socket, "TCP_KEEPINTVL"):
        options.append((socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds))
    if hasattr(socket, "TCP_KEEPCNT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES))
    return options


class _PreopenedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, able to hand over a TCP connection opened in advance.

    :meth:`CompletionClient.measure` opens its request's connection just before ``t0`` and
    stages it here; the pool, which keeps no idle connection, takes it instead of connecting
    inside the timed window. Any other connection, or a staged one for another address, is
    opened as usual.
    """

    def __init__(
        self, inner: httpcore.NetworkBackend, socket_options: Sequence[tuple[int, int, int]] = ()
    ) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._staged: tuple[str, int, httpcore.NetworkStream] | None = None
        #: The options every connection gets (keepalive), staged ones included.
        self.socket_options = list(socket_options)

    def open(self, host: str, port: int, timeout: float) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, timeout=timeout, socket_options=self.socket_options or None
        )
        with self._lock:
            staged, self._staged = self._staged, (host, port, stream)
        if staged is not None:
            staged[2].close()
        return stream

    def discard(self) -> None:
        """Close a staged connection nobody took (the request failed before sending)."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            staged[2].close()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            same_options = list(socket_options or ()) == self.socket_options
            if staged[:2] == (host, port) and local_address is None and same_options:
                return staged[2]
            staged[2].close()
        return self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def verified_tls() -> ssl.SSLContext:
    """The TLS context of every client (certificates verified, as httpx's default): loading
    the CA bundle costs about 0.1 s, and a session makes a client for every health and
    metrics check, so it is loaded once per process."""
    return httpx.create_ssl_context()


def _preopening_transport(
    keepalive_s: float = 0.0,
) -> tuple[httpx.HTTPTransport, _PreopenedBackend | None]:
    """httpx's transport with :class:`_PreopenedBackend` under its pool (None if httpx changed);
    every connection probes with TCP keepalive every ``keepalive_s`` seconds (0: none)."""
    options = keepalive_options(keepalive_s)
    transport = httpx.HTTPTransport(
        verify=verified_tls(),
        limits=httpx.Limits(max_keepalive_connections=0),
        socket_options=options or None,
    )
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(inner, httpcore.NetworkBackend):
        return transport, None
    backend = _PreopenedBackend(inner, options)
    pool._network_backend = backend  # type: ignore[union-attr]
    return transport, backend


# Deadlines for a stream: httpx fixes one read timeout, a long prefill needs two.


class _Exchange:
    """httpcore trace hook: phase times and the socket, so a watchdog can cut a stalled stream."""

    def __init__(self, on_socket: Any) -> None:
        self.times: dict[str, float] = {}
        self._on_socket = on_socket

    def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        self.times[name] = time.perf_counter()
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                self._on_socket(sock)

    def span(self, begin: str, end: str) -> float | None:
        if begin in self.times and end in self.times:
            return self.times[end] - self.times[begin]
        return None


class _Watchdog:
    """Shuts the socket down when the current deadline passes; the blocked read then returns.

    httpx fixes one read timeout per response, but the first token may take hours while later
    tokens should follow within the inter-token limit: this thread enforces both.
    """

    def __init__(self) -> None:
        self._deadline = math.inf
        self._phase = ""
        self._sleeping_until = math.inf
        self._socket: socket.socket | None = None
        self._stopped = False
        self.expired_phase: str | None = None
        self._wake = threading.Condition()
        self._waiting = threading.Event()
        self._thread = threading.Thread(target=self._run, name="longctx-watchdog", daemon=True)

    def start(self, deadline: float, phase: str) -> None:
        """Start the thread and return once it sleeps, so it takes no time from the caller."""
        self.extend(deadline, phase)
        self._thread.start()
        self._waiting.wait()
        with self._wake:  # acquired once the thread's wait() released it
            pass

    def extend(self, deadline: float, phase: str) -> None:
        """Move the deadline; the thread is woken only when it must fire sooner."""
        with self._wake:
            self._deadline, self._phase = deadline, phase
            if deadline < self._sleeping_until:
                self._wake.notify()

    def attach(self, sock: socket.socket) -> None:
        with self._wake:
            self._socket = sock
            if self.expired_phase is not None:
                _shutdown(sock)

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while not self._stopped:
                remaining = self._deadline - time.perf_counter()
                if remaining <= 0:
                    self.expired_phase = self._phase
                    if self._socket is not None:
                        _shutdown(self._socket)
                    return
                self._sleeping_until = self._deadline
                self._waiting.set()
                self._wake.wait(None if math.isinf(remaining) else remaining)
                self._sleeping_until = math.inf


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: nothing left to wake
        sock.shutdown(socket.SHUT_RDWR)


_FIRST_TOKEN = "first_token"
_INTER_TOKEN = "inter_token"
_BACKSTOP_S = 30.0  # httpx's own limits trail the watchdog's by this much


class CompletionClient:
    """A vLLM-compatible server, measured one request at a time.

    Every request opens a fresh connection (no keep-alive): an idle pooled connection that the
    server closed would otherwise fail or retry inside a measurement. The measured request's
    connection is opened just before ``t0`` (reported as ``connect_s``, outside the TTFT),
    as a client with a warm connection would send it; it is never idle long enough for a
    server to drop it. Proxy settings from the environment are ignored: a proxy buffers
    streams and would move every arrival time.
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        headers = {"Accept-Encoding": "identity"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        transport, self._backend = _preopening_transport(config.tcp_keepalive_s)
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(config.control_timeout_s, connect=config.connect_timeout_s),
            transport=transport,
            trust_env=False,
        )

    def __repr__(self) -> str:
        return f"CompletionClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CompletionClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- control endpoints -------------------------------------------------------------------

    def health(self) -> bool:
        """True when ``/health`` answers 200; any failure to answer is False."""
        return self.health_status() == 200

    def health_status(self) -> int | None:
        """``/health``'s HTTP status, or None when nothing answers."""
        try:
            return self._http.get(f"{self.base_url}/health").status_code
        except httpx.HTTPError:
            return None

    def models(self) -> ModelEntry:
        """The first served model's id and ``max_model_len`` (None if the server omits it)."""
        data = self._get_json("/v1/models")
        entries = data.get("data") if isinstance(data, Mapping) else None
        if not entries or not isinstance(entries[0], Mapping) or "id" not in entries[0]:
            raise MalformedResponseError(
                f"{self.base_url}/v1/models lists no model (expected data[0].id): "
                f"{self._redact(json.dumps(data)[:300])}"
            )
        max_len = entries[0].get("max_model_len")
        root = entries[0].get("root")
        return ModelEntry(
            id=str(entries[0]["id"]),
            max_model_len=int_or_none(max_len),
            root=str(root) if root else None,
        )

    def version(self) -> str | None:
        """The engine's version from ``/version``; None when the server has no such endpoint."""
        data = self._optional_json("/version")
        version = data.get("version") if isinstance(data, Mapping) else None
        return str(version) if version else None

    def server_info(self) -> Any | None:
        """vLLM's ``/server_info`` (the configuration it runs with, as its engine resolved it),
        served only with ``VLLM_SERVER_DEV_MODE=1``; None elsewhere."""
        return self._optional_json("/server_info?config_format=json")

    def detokenize(self, model: str, ids: Sequence[int]) -> str:
        """Text for token ids through the server's own tokenizer (``POST /detokenize``)."""
        payload = {"model": model, "tokens": list(ids)}
        data = self._post_json("/detokenize", payload, None)
        text = data.get("prompt") if isinstance(data, Mapping) else None
        if not isinstance(text, str):
            raise MalformedResponseError(
                f"{self.base_url}/detokenize answered without a 'prompt' string: "
                f"{self._redact(json.dumps(data)[:300])}"
            )
        return text

    def tokenize(
        self, text: str, add_special_tokens: bool = True, timeout_s: float | None = None
    ) -> list[int]:
        """Token ids for ``text`` through the server's own tokenizer (``POST /tokenize``)."""
        payload = {"prompt": text, "add_special_tokens": add_special_tokens}
        data = self._post_json("/tokenize", payload, timeout_s)
        tokens = data.get("tokens") if isinstance(data, Mapping) else None
        if not isinstance(tokens, list):
            raise MalformedResponseError(
                f"{self.base_url}/tokenize answered without a 'tokens' list: "
                f"{self._redact(json.dumps(data)[:300])}"
            )
        return tokens

    def metrics_text(self) -> str:
        """The Prometheus exposition of ``/metrics`` (parse it with server_metrics)."""
        response = self._call("GET", "/metrics")
        return response.text

    def _get_json(self, path: str) -> Any:
        return self._decode_json(self._call("GET", path), path)

    def _optional_json(self, path: str) -> Any | None:
        try:
            return self._get_json(path)
        except MeasurementError:
            return None

    def _post_json(self, path: str, payload: Any, timeout_s: float | None) -> Any:
        return self._decode_json(self._call("POST", path, json=payload, timeout_s=timeout_s), path)

    def _decode_json(self, response: httpx.Response, path: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise MalformedResponseError(
                f"{self.base_url}{path} answered with non-JSON: {self._redact(response.text[:300])}"
            ) from None

    def _call(
        self, method: str, path: str, json: Any = None, timeout_s: float | None = None
    ) -> httpx.Response:
        url = f"{self.base_url}{path}"
        timeout = (
            httpx.USE_CLIENT_DEFAULT
            if timeout_s is None
            else httpx.Timeout(timeout_s, connect=self.config.connect_timeout_s)
        )
        try:
            response = self._http.request(method, url, json=json, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise self._unavailable(exc) from None
        except httpx.TimeoutException:
            limit = timeout_s if timeout_s is not None else self.config.control_timeout_s
            raise MeasurementTimeoutError(
                f"{method} {url} did not answer within {limit:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise ServerUnavailableError(
                f"{method} {url} failed: {self._redact(str(exc)) or type(exc).__name__}"
            ) from None
        if response.status_code >= 400:
            raise rejection(response.status_code, response.content, url, None, self._redact)
        return response

    # -- the measurement ---------------------------------------------------------------------

    def measure(
        self,
        request: CompletionRequest,
        first_token_budget_s: float,
        budget_source: str = "the caller's limit",
        check_count: bool = True,
        progress: StreamProgress | None = None,
        stream_interval: int | None = None,
    ) -> StreamMeasurement:
        """Stream ``request`` and time it; raises a :class:`MeasurementError` on any doubt.

        ``first_token_budget_s`` bounds ``t0`` to the first token (upload and prefill included);
        ``budget_source`` says where it came from, for the timeout message. With
        ``check_count`` a completion count other than ``request.decode_tokens`` raises
        :class:`CompletionCountError` (the measurement rides along on the error).
        ``progress``, when given, is updated as the stream goes (t0, first token, tokens
        received) for a watcher in another thread; updating it is a few assignments.
        ``stream_interval`` is the server's, when earlier streams showed it: a stream that
        fell behind, its chunks merged, is then still read as one of that interval.
        """
        if not first_token_budget_s > 0:
            raise ValueError(f"first_token_budget_s={first_token_budget_s!r}: expected > 0")
        body = encode_request(request)
        url = f"{self.base_url}/v1/completions"
        watchdog = _Watchdog()
        exchange = _Exchange(watchdog.attach)
        slowest = max(first_token_budget_s, self.config.inter_token_timeout_s) + _BACKSTOP_S
        http_request = self._http.build_request(
            "POST",
            url,
            # httpx's annotation says bytes; it sends any bytes-like chunk, and a view of the
            # body is not a copy of it.
            content=body.chunks(self.config.upload_chunk_bytes),  # type: ignore[arg-type]
            headers={
                "Content-Type": "application/json",
                "Content-Length": str(body.size),
                "Accept": "text/event-stream",
            },
            timeout=httpx.Timeout(
                connect=self.config.connect_timeout_s,
                read=slowest,
                write=first_token_budget_s + _BACKSTOP_S,
                pool=self.config.connect_timeout_s,
            ),
            extensions={"trace": exchange},
        )
        context = _MeasureContext(
            request,
            body,
            first_token_budget_s,
            budget_source,
            exchange,
            progress_counter=progress,
            stream_interval=stream_interval,
        )
        # Everything that is the instrument's and not the server's happens before t0: the body
        # (above), the connection, and the watchdog thread's start. At t0 the deadline moves
        # later than the one the thread sleeps on, which does not wake it.
        context.connect_s = self._preconnect(http_request.url)
        watchdog.start(time.perf_counter() + first_token_budget_s, _FIRST_TOKEN)
        t0 = time.perf_counter()
        context.t0 = t0
        if progress is not None:
            progress.t0 = t0
        try:
            watchdog.extend(t0 + first_token_budget_s, _FIRST_TOKEN)
            try:
                response = self._http.send(http_request, stream=True)
            except httpx.HTTPError as exc:
                raise self._send_failure(exc, watchdog, context) from None
            finally:
                if self._backend is not None:
                    self._backend.discard()
            context.response_headers_s = time.perf_counter() - t0
            try:
                return self._read_stream(response, watchdog, context, check_count)
            finally:
                # Closing a half-read stream can raise (h11: incomplete chunked read); the
                # connection is discarded either way, and the error to report is the one above.
                with contextlib.suppress(Exception):
                    response.close()
        finally:
            watchdog.stop()
            if progress is not None:
                progress.finished = True

    def _preconnect(self, url: httpx.URL) -> float | None:
        """Open the request's TCP connection now; seconds it took, None when not pre-opened."""
        if self._backend is None or url.scheme not in ("http", "https"):
            return None
        port = url.port or (443 if url.scheme == "https" else 80)
        started = time.perf_counter()
        try:
            self._backend.open(url.host, port, timeout=self.config.connect_timeout_s)
        except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
            raise self._unavailable(exc) from None
        return time.perf_counter() - started

    def _read_stream(
        self,
        response: httpx.Response,
        watchdog: _Watchdog,
        context: _MeasureContext,
        check_count: bool,
    ) -> StreamMeasurement:
        url = str(response.request.url)
        if response.status_code >= 400:
            content = read_limited(response)
            raise rejection(response.status_code, content, url, context.request, self._redact)
        content_type = response.headers.get("content-type", "")
        if "json" in content_type and "event-stream" not in content_type:
            content = read_limited(response)
            raise StreamError(
                f"{url} answered 200 with {content_type} instead of an event stream; "
                f"it ignored stream=true: {self._redact(content[:300].decode('utf-8', 'replace'))}"
            )
        decoder = _SSEDecoder()
        state = _StreamState()
        stream = response.iter_bytes()
        try:
            while not state.done:
                try:
                    data = next(stream)
                except StopIteration:
                    for event in decoder.finish():
                        self._handle_event(event, time.perf_counter(), state, watchdog, context)
                    break
                arrived = time.perf_counter()
                for event in decoder.feed(data):
                    self._handle_event(event, arrived, state, watchdog, context)
                    if state.done:
                        break
        except httpx.HTTPError as exc:
            raise self._stream_failure(exc, watchdog, state, context) from None
        if not state.done:
            if watchdog.expired_phase is not None:
                raise self._timeout(watchdog.expired_phase, state, context)
            raise TruncatedStreamError(
                f"the stream from {url} ended before 'data: [DONE]' after "
                f"{state.chunk_tokens_total} tokens ({context.describe_request()}): "
                "the server closed the connection; check its log for a crash or restart"
            )
        return self._finish(state, context, check_count)

    def _handle_event(
        self,
        event: str,
        arrived: float,
        state: _StreamState,
        watchdog: _Watchdog,
        context: _MeasureContext,
    ) -> None:
        if event.strip() == "[DONE]":
            state.done = True
            state.done_at = arrived - context.t0
            return
        try:
            chunk = json.loads(event)
        except ValueError as exc:
            raise MalformedChunkError(
                f"chunk {state.chunks + 1} of the stream is not JSON ({exc}): "
                f"{self._redact(event[:200])!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise MalformedChunkError(
                f"chunk {state.chunks + 1} of the stream is JSON but not an object: "
                f"{self._redact(event[:200])!r}"
            )
        state.chunks += 1
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], Mapping) else {}
            message = error.get("message", chunk["error"])
            raise ErrorFrameError(
                f"the server reported an error inside the stream after "
                f"{state.chunk_tokens_total} tokens ({context.describe_request()}): "
                f"{error.get('type', 'error')} (code {error.get('code', '?')}): "
                f"{self._redact(str(message))}",
                server_message=self._redact(str(message)),
            )
        counted, source = 0, "text"
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                raise MalformedChunkError(
                    f"chunk {state.chunks} has a choice that is not an object: "
                    f"{self._redact(event[:200])!r}"
                )
            count, choice_source = _choice_tokens(choice)
            text = choice.get("text")
            if isinstance(text, str) and state.head_chars < COMPLETION_HEAD_CHARS:
                state.keep_text(text[: COMPLETION_HEAD_CHARS - state.head_chars])
            counted += count
            if count:
                source = choice_source
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]
        tokens = state.counter.add(counted, source, _running_count(chunk))
        if tokens:
            state.token_times.append(arrived - context.t0)
            watchdog.extend(arrived + self.config.inter_token_timeout_s, _INTER_TOKEN)
            watched = context.progress_counter
            if watched is not None:
                watched.tokens += tokens
                if watched.last_token_at is not None:
                    watched.slowest_gap_s = max(
                        watched.slowest_gap_s, arrived - watched.last_token_at
                    )
                watched.last_token_at = arrived
                if watched.first_token_at is None:
                    watched.first_token_at = arrived
        usage = chunk.get("usage")
        if isinstance(usage, Mapping) and usage.get("completion_tokens") is not None:
            state.usage = usage
        timing = ServerTiming.from_metrics(chunk.get("metrics"))
        if timing is not None:  # vLLM's per-request metrics, on the final usage chunk
            state.server_timing = timing

    def _finish(
        self, state: _StreamState, context: _MeasureContext, check_count: bool
    ) -> StreamMeasurement:
        request = context.request
        if state.usage is None:
            raise MissingUsageError(
                f"the stream finished without a usage chunk ({context.describe_request()}), so "
                "the completion count is unknown; the request asks for it with "
                "stream_options.include_usage, which this server ignored"
                + ("" if request.include_usage else " (include_usage is off in the request)")
            )
        completion_tokens = int_or_none(state.usage.get("completion_tokens"))
        if completion_tokens is None:
            raise MalformedChunkError(
                f"usage.completion_tokens is not an int: {state.usage.get('completion_tokens')!r}"
            )
        if not state.token_times:
            raise NoTokensError(
                f"the server reported {completion_tokens} completion tokens but no chunk "
                "carried text or token_ids, so the first token's arrival is unknown "
                f"({context.describe_request()}); set return_token_ids to count ids"
            )
        tokens_per_chunk, count_source = state.counter.counts()
        throughput, gaps = summarize_stream(state.token_times, tokens_per_chunk, completion_tokens)
        # Inter-token latencies only from chunks of one token, on a server streaming each.
        exact = sum(tokens_per_chunk) == completion_tokens
        ordered = sorted(
            inter_token_gaps(state.token_times, tokens_per_chunk, exact, context.stream_interval)
        )
        details = state.usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        exchange = context.exchange
        measurement = StreamMeasurement(
            ttft_s=state.token_times[0],
            e2e_s=state.done_at,
            token_times_s=tuple(state.token_times),
            tokens_per_chunk=tokens_per_chunk,
            itl_s=gaps,
            completion_tokens=completion_tokens,
            requested_tokens=request.decode_tokens,
            prompt_tokens=int_or_none(state.usage.get("prompt_tokens")),
            cached_prompt_tokens=int_or_none(cached),
            token_count_source=count_source,
            finish_reason=state.finish_reason,
            decode_throughput=throughput,
            itl_median_s=quantile(ordered, 0.5) if ordered else None,
            itl_p90_s=quantile(ordered, 0.9) if ordered else None,
            itl_max_s=ordered[-1] if ordered else None,
            body_bytes=context.body.size,
            body_build_s=context.body.build_s,
            connect_s=(
                context.connect_s
                if context.connect_s is not None
                else exchange.span(
                    "connection.connect_tcp.started", "connection.connect_tcp.complete"
                )
            ),
            upload_s=exchange.span(
                "http11.send_request_body.started", "http11.send_request_body.complete"
            ),
            response_headers_s=context.response_headers_s,
            started_perf_s=context.t0,
            completion_head="".join(state.head),
            server_stream_interval=context.stream_interval,
            server_timing=state.server_timing,
        )
        if check_count and completion_tokens != request.decode_tokens:
            raise CompletionCountError(
                count_message(request, measurement),
                requested=request.decode_tokens,
                received=completion_tokens,
                measurement=measurement,
            )
        return measurement

    # -- failures ----------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, REDACTED) if key else text

    def _unavailable(self, exc: Exception) -> NotConnectedError:
        reason = self._redact(str(exc)) or type(exc).__name__
        return NotConnectedError(
            f"cannot connect to {self.base_url} within {self.config.connect_timeout_s:g} s "
            f"({reason}): is the server running and listening there?"
        )

    def _send_failure(
        self, exc: httpx.HTTPError, watchdog: _Watchdog, context: _MeasureContext
    ) -> MeasurementError:
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            return self._unavailable(exc)
        if watchdog.expired_phase is not None or isinstance(exc, httpx.TimeoutException):
            return self._timeout(_FIRST_TOKEN, _StreamState(), context)
        reason = self._redact(str(exc)) or type(exc).__name__
        return ServerUnavailableError(
            f"{self.base_url} closed the connection before answering "
            f"({context.describe_request()}; {reason}): it may have crashed or restarted"
        )

    def _stream_failure(
        self,
        exc: httpx.HTTPError,
        watchdog: _Watchdog,
        state: _StreamState,
        context: _MeasureContext,
    ) -> MeasurementError:
        if watchdog.expired_phase is not None:
            return self._timeout(watchdog.expired_phase, state, context)
        if isinstance(exc, httpx.TimeoutException):
            return self._timeout(
                _INTER_TOKEN if state.token_times else _FIRST_TOKEN, state, context
            )
        reason = self._redact(str(exc)) or type(exc).__name__
        return TruncatedStreamError(
            f"the stream broke after {state.chunk_tokens_total} tokens, before 'data: [DONE]' "
            f"({context.describe_request()}; {reason}): check the server's log for a crash"
        )

    def _timeout(
        self, phase: str, state: _StreamState, context: _MeasureContext
    ) -> MeasurementTimeoutError:
        elapsed = time.perf_counter() - context.t0
        if phase == _INTER_TOKEN and state.token_times:
            return InterTokenTimeoutError(
                f"the stream stalled: no token for {self.config.inter_token_timeout_s:g} s after "
                f"token {state.chunk_tokens_total} of {context.request.decode_tokens} "
                f"({context.describe_request()}; inter-token limit from the client config)"
            )
        length = context.request.prompt_length
        progress = context.progress()
        return FirstTokenTimeoutError(
            f"no token within the first-token budget of {context.budget_s:g} s for "
            f"{context.describe_request()} (budget: {context.budget_source}); "
            f"gave up after {elapsed:.1f} s; {progress}. Raise the budget if the server is "
            "just slow, or check that it is alive",
            length=length,
            budget_s=context.budget_s,
            budget_source=context.budget_source,
        )


@dataclass
class _StreamState:
    done: bool = False
    done_at: float = 0.0
    chunks: int = 0
    token_times: list[float] = field(default_factory=list)
    counter: _ChunkCounter = field(default_factory=_ChunkCounter)
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    #: The completion's text so far, in the pieces the chunks carried (joined once at the end).
    head: list[str] = field(default_factory=list)
    head_chars: int = 0

    def keep_text(self, text: str) -> None:
        self.head.append(text)
        self.head_chars += len(text)
    server_timing: ServerTiming | None = None

    @property
    def chunk_tokens_total(self) -> int:
        return self.counter.total


@dataclass
class _MeasureContext:
    request: CompletionRequest
    body: RequestBody
    budget_s: float
    budget_source: str
    exchange: _Exchange
    t0: float = 0.0
    connect_s: float | None = None  # the connection opened before t0
    response_headers_s: float | None = None
    progress_counter: StreamProgress | None = None
    #: The server's stream interval as known before this request (``measure``'s).
    stream_interval: int | None = None

    def describe_request(self) -> str:
        return describe(self.request)

    def progress(self) -> str:
        times = self.exchange.times
        if "http11.receive_response_headers.complete" in times:
            at = times["http11.receive_response_headers.complete"] - self.t0
            return f"the server accepted the request at {at:.2f} s and then sent no token"
        if "http11.send_request_body.complete" in times:
            at = times["http11.send_request_body.complete"] - self.t0
            return (
                f"the {self.body.size} B body was sent by {at:.2f} s and the server never answered"
            )
        if "connection.connect_tcp.complete" in times:
            return f"the upload of the {self.body.size} B body did not finish"
        return "no connection was established"
