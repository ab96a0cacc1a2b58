"""The instrument: one streamed ``/v1/completions`` request, timed from the client's side.

Definitions (all clocks are :func:`time.perf_counter`, CLOCK_MONOTONIC on Linux and so comparable
with other processes' stamps, relative to ``t0``, taken just before the request is handed to the
HTTP client; the JSON body is built and the connection opened before ``t0``):

* A chunk *carries tokens* when its choices count any. A choice with a ``token_ids`` list (vLLM
  sends it with ``return_token_ids``) counts ``len(token_ids)``, else one with a
  ``logprobs.tokens`` list counts ``len(tokens)``: exact, an empty list is no token. Otherwise a
  choice with a ``text`` key (``delta.content`` for chat-style chunks) counts one token, also
  for ``"text": ""``: vLLM streams one chunk per generated token and sends empty text while
  the token is an incomplete UTF-8 piece. Chunks without any of these (a role-only chunk, a
  keep-alive chunk, the final usage chunk) never stop the TTFT clock.
* ``ttft_s``: ``t0`` to the arrival of the first chunk that carries tokens. It includes the
  upload, the server's parsing, queueing and prefill, and the chunk's way back: what a client
  with an open connection waits. The TCP connection is opened just before ``t0`` (``connect_s``)
  and the watchdog thread started, so neither is inside the TTFT.
* ``decode_throughput``: ``(N - k1) / (t_last - t_first)``, N the server's
  ``usage.completion_tokens``, k1 the tokens in the first carrying chunk, t_first/t_last the
  arrivals of the first/last carrying chunks. With one token per chunk this is ``(N-1)/(t_last -
  t_first)``. N comes from ``usage`` because without ``token_ids`` a chunk that carries several
  tokens (``--stream-interval`` above 1) counts as one and the stream alone undercounts.
  Counting text, k1 is taken as 1, which is exact for vLLM: it sends the first token alone even
  with ``--stream-interval`` above 1.
* Inter-token gaps: a carrying chunk that arrives ``g`` seconds after the previous one and
  carries ``k`` tokens adds ``k`` gaps of ``g / k``, so the gaps sum to ``t_last - t_first`` and
  their mean is ``1 / decode_throughput`` whenever the stream's count matches ``usage``.
  Counting text, every chunk is one gap (k is unknown): with ``--stream-interval`` above 1 ask
  for ``return_token_ids`` on short prompts to see per-token gaps.
* ``e2e_s``: ``t0`` to the arrival of ``data: [DONE]``.

Only vLLM-compatible servers are targeted; everything the client checks is named in the error
it raises, and no error message or repr ever contains the API key.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from .sizes import format_size

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]

UPLOAD_CHUNK_BYTES = 1 << 20  # httpcore copies the unsent tail on each send: keep pieces small
ERROR_BODY_LIMIT = 1 << 20
_REDACTED = "***"


# --------------------------------------------------------------------------------------------
# Errors


class MeasurementError(Exception):
    """A measurement that produced no trustworthy figures; the message says what to do."""


class ServerUnavailableError(MeasurementError):
    """Nothing answered: connection refused, reset or closed before a response."""


class MalformedResponseError(MeasurementError):
    """A non-streaming endpoint answered with something that is not the documented JSON."""


class RequestRejectedError(MeasurementError):
    """The server answered with an HTTP error status before streaming."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        server_message: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.server_message = server_message
        self.error_type = error_type


class PromptTooLongError(RequestRejectedError):
    """The prompt alone exceeds the server's ``max_model_len`` (vLLM's HTTP 400)."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        server_message: str | None = None,
        error_type: str | None = None,
        max_model_len: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(message, status_code, server_message, error_type)
        self.max_model_len = max_model_len
        self.prompt_tokens = prompt_tokens


class StreamError(MeasurementError):
    """The HTTP 200 stream itself went wrong."""


class ErrorFrameError(StreamError):
    """The server reported an error inside the stream (``data: {"error": ...}``)."""


class TruncatedStreamError(StreamError):
    """The connection ended before ``data: [DONE]``."""


class MalformedChunkError(StreamError):
    """A ``data:`` line that is not JSON or not a JSON object."""


class MissingUsageError(StreamError):
    """The stream finished without a ``usage`` chunk, so the token count is unknown."""


class NoTokensError(StreamError):
    """The stream finished without any chunk that carries a generated token."""


class CompletionCountError(MeasurementError):
    """The server generated a different number of tokens than requested.

    The timing is still attached as ``measurement`` for callers that want to keep it.
    """

    def __init__(
        self,
        message: str,
        requested: int | None = None,
        received: int | None = None,
        measurement: StreamMeasurement | None = None,
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.received = received
        self.measurement = measurement


class MeasurementTimeoutError(MeasurementError):
    """A limit ran out; nothing waits forever."""


class FirstTokenTimeoutError(MeasurementTimeoutError):
    """No generated token within the first-token budget."""

    def __init__(
        self,
        message: str,
        length: int | None = None,
        budget_s: float | None = None,
        budget_source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.length = length
        self.budget_s = budget_s
        self.budget_source = budget_source


class InterTokenTimeoutError(MeasurementTimeoutError):
    """The stream went silent between two tokens for longer than the inter-token limit."""


# --------------------------------------------------------------------------------------------
# Request and body


@dataclass(frozen=True)
class CompletionRequest:
    """One measured completion: decode exactly ``decode_tokens`` tokens after ``prompt``.

    ``prompt`` is a sequence of token ids (``array('I')``, a numpy array, a list, a range) or a
    str for engines that need text. ``extra_body`` fields are merged last and win, except
    ``prompt``. ``return_token_ids`` makes the count per chunk exact, but vLLM 0.32 then echoes
    all prompt ids in the first chunk, which at long prompts delays that chunk by the time it
    takes to serialize and ship the prompt again: leave it off for timing long prompts.
    """

    model: str
    prompt: Sequence[int] | str = field(repr=False, compare=False)
    decode_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0
    include_usage: bool = True
    return_token_ids: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.decode_tokens, bool) or not isinstance(self.decode_tokens, int):
            raise ValueError(f"decode_tokens={self.decode_tokens!r}: expected a positive int")
        if self.decode_tokens < 1:
            raise ValueError(f"decode_tokens={self.decode_tokens}: expected a positive int")
        if "prompt" in self.extra_body:
            raise ValueError("extra_body may not contain 'prompt'; pass it as prompt=")

    @property
    def prompt_length(self) -> int | None:
        """Tokens in the prompt, or None for a text prompt (the server tokenizes it)."""
        return None if isinstance(self.prompt, str) else len(self.prompt)

    def fields(self) -> dict[str, Any]:
        """Every body field except ``prompt``, as sent."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.decode_tokens,
            "min_tokens": self.decode_tokens,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "stream": True,
        }
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.return_token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    def __repr__(self) -> str:
        length = self.prompt_length
        prompt = f"text of {len(self.prompt)} chars" if length is None else f"{length} ids"
        return (
            f"CompletionRequest(model={self.model!r}, prompt=<{prompt}>, "
            f"decode_tokens={self.decode_tokens}, extra_body={dict(self.extra_body)!r})"
        )


@dataclass(frozen=True, eq=False)
class RequestBody:
    """Serialized JSON, built once before the clock starts."""

    data: bytes | bytearray = field(repr=False)
    build_s: float

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self, chunk_bytes: int = UPLOAD_CHUNK_BYTES) -> Iterator[memoryview]:
        view = memoryview(self.data)
        for start in range(0, len(view), chunk_bytes):
            yield view[start : start + chunk_bytes]


def encode_request(request: CompletionRequest) -> RequestBody:
    """``request`` as compact UTF-8 JSON, as ``json.dumps`` writes it with ``(",", ":")``."""
    started = time.perf_counter()
    head = json.dumps(request.fields(), separators=(",", ":"), ensure_ascii=False)
    prefix = (head[:-1] + ("," if head != "{}" else "") + '"prompt":').encode()
    if isinstance(request.prompt, str):
        prompt = json.dumps(request.prompt, ensure_ascii=False).encode()
        data: bytes | bytearray = prefix + prompt + b"}"
    else:
        data = encode_token_ids(request.prompt, prefix=prefix, suffix=b"}")
    return RequestBody(data=data, build_s=time.perf_counter() - started)


def encode_token_ids(ids: Sequence[int], prefix: bytes = b"", suffix: bytes = b"") -> bytearray:
    """``prefix + b"[1,2,3]" + suffix`` without building a Python string per id.

    Uses numpy when present: about 20 ns per id against about 200 ns for ``json.dumps`` of a
    list, which matters at 64Mi ids (see benchmarks/bench_client.py).
    """
    if np is None:
        return _encode_ids_python(ids, prefix, suffix)
    return _encode_ids_numpy(_as_id_array(ids), prefix, suffix)


def _encode_ids_python(ids: Sequence[int], prefix: bytes, suffix: bytes) -> bytearray:
    values = []
    for value in ids:
        try:
            number = operator.index(value)
        except TypeError:
            number = -1
        if isinstance(value, bool) or number < 0:
            raise ValueError(f"token id {value!r} is not a non-negative int")
        values.append(number)
    out = bytearray(prefix)
    out += b"[" + ",".join(map(str, values)).encode() + b"]"
    out += suffix
    return out


def _as_id_array(ids: Sequence[int]) -> Any:
    if isinstance(ids, range):
        array = np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
    else:
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"token ids must be non-negative ints: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"token ids must be a flat sequence, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.uint32)
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        raise ValueError(f"token ids must be non-negative ints, got dtype {array.dtype}")
    if array.dtype.kind == "i":
        smallest = int(array.min())
        if smallest < 0:
            raise ValueError(f"token id {smallest} is negative; ids must be >= 0")
        array = array.astype(np.uint64, copy=False)
    return array


_ENCODE_CHUNK_IDS = 1 << 20
_TABLE_LIMIT = 1 << 22  # ids below this (7 digits at most) render through a lookup table
_TABLE_ROW = 8  # bytes per table row: 7 digits and a comma, one uint64


@dataclass(frozen=True, eq=False)
class _IdTable:
    """Every id below ``size`` pre-rendered as one uint64: NUL padding, digits, a comma."""

    size: int
    rows: Any  # numpy uint64, one per id; gathering uint64 is the fastest numpy gather
    lengths: Any  # numpy int8: bytes each id adds, comma included


_ID_TABLES: dict[int, _IdTable] = {}


def _id_table(largest: int) -> _IdTable:
    size = 1 << max(10, largest.bit_length())  # one table serves a whole vocabulary
    table = _ID_TABLES.get(size)
    if table is None:
        rows = _render_rows(np.arange(size, dtype=np.uint64), _TABLE_ROW)
        table = _IdTable(
            size=size,
            rows=rows.view(np.uint64).ravel(),
            lengths=np.count_nonzero(rows, axis=1).astype(np.int8),
        )
        _ID_TABLES.clear()  # keep one: a sweep uses one vocabulary
        _ID_TABLES[size] = table
    return table


def _render_rows(values: Any, width: int) -> Any:
    """uint8 rows of ``width`` bytes: right-aligned decimal digits and a comma, NUL before.

    NUL never occurs in the JSON, so ``rows[rows != 0]`` is the compact text.
    """
    rows = np.empty((values.size, width), dtype=np.uint8)
    rows[:, width - 1] = ord(",")
    remaining = values.astype(np.uint64, copy=True)
    for column in range(width - 2, -1, -1):
        rows[:, column] = remaining % 10 + ord("0")
        remaining //= 10
    digits = np.ones(values.size, dtype=np.int64)
    power = 10
    for _ in range(width - 2):
        digits += values >= power
        power *= 10
    rows[np.arange(width)[None, :] < (width - 1 - digits)[:, None]] = 0
    return rows


def _encode_ids_numpy(ids: Any, prefix: bytes, suffix: bytes) -> bytearray:
    count = int(ids.size)
    if count == 0:
        return bytearray(prefix + b"[]" + suffix)
    largest = int(ids.max())
    if largest >= _TABLE_LIMIT:
        return _encode_ids_wide(ids, prefix, suffix)
    table = _id_table(largest)
    starts = range(0, count, _ENCODE_CHUNK_IDS)
    chunk_lengths = [
        int(table.lengths[ids[start : start + _ENCODE_CHUNK_IDS]].sum(dtype=np.int64))
        for start in starts
    ]
    # Sized once and filled in place: the body is the only large allocation.
    out = bytearray(len(prefix) + 1 + sum(chunk_lengths) + len(suffix))
    view = np.frombuffer(out, dtype=np.uint8)
    view[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    position = len(prefix)
    view[position] = ord("[")
    position += 1
    for start, length in zip(starts, chunk_lengths, strict=True):
        rows = table.rows[ids[start : start + _ENCODE_CHUNK_IDS]].view(np.uint8)
        view[position : position + length] = rows[rows != 0]
        position += length
    view[position - 1] = ord("]")  # the last id's comma closes the list
    if suffix:
        view[position:] = np.frombuffer(suffix, dtype=np.uint8)
    return out


def _encode_ids_wide(ids: Any, prefix: bytes, suffix: bytes) -> bytearray:
    """Ids too large for a lookup table: render each chunk digit by digit."""
    width = len(str(int(ids.max()))) + 1
    out = bytearray(prefix)
    out += b"["
    for start in range(0, int(ids.size), _ENCODE_CHUNK_IDS):
        rows = _render_rows(ids[start : start + _ENCODE_CHUNK_IDS], width)
        out += rows[rows != 0].tobytes()
    out[-1] = ord("]")
    out += suffix
    return out


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class StreamMeasurement:
    """What one streamed request measured; see the module docstring for every definition."""

    ttft_s: float
    e2e_s: float
    token_times_s: tuple[float, ...]  # arrival of each token-carrying chunk, relative to t0
    tokens_per_chunk: tuple[int, ...]  # tokens each of those chunks carried, as counted
    itl_s: tuple[float, ...]  # inter-token gaps, k gaps of g/k for a k-token chunk
    completion_tokens: int  # usage.completion_tokens, the server's count
    requested_tokens: int
    prompt_tokens: int | None  # usage.prompt_tokens
    cached_prompt_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, if sent
    token_count_source: str  # "token_ids", "logprobs" or "text": how chunks were counted
    finish_reason: str | None
    decode_throughput: float | None  # tokens/s, None below two carrying chunks
    itl_median_s: float | None
    itl_p90_s: float | None
    itl_max_s: float | None
    body_bytes: int
    body_build_s: float
    connect_s: float | None  # TCP connect, just before t0 (outside ttft_s)
    upload_s: float | None  # body handed to the kernel, inside ttft_s
    response_headers_s: float | None  # t0 to the response headers
    #: ``time.perf_counter()`` at t0: lines the stream up with other clocks of this machine.
    started_perf_s: float = 0.0

    @property
    def stream_tokens(self) -> int:
        """Tokens counted from the stream; below ``completion_tokens`` when some were hidden."""
        return sum(self.tokens_per_chunk)

    def figures(self) -> dict[str, float]:
        """The figures under the names of :data:`pytest_longctx.records.FIGURE_UNITS`."""
        values = {
            "ttft": self.ttft_s,
            "decode_throughput": self.decode_throughput,
            "itl_median": self.itl_median_s,
            "itl_p90": self.itl_p90_s,
            "itl_max": self.itl_max_s,
            "e2e": self.e2e_s,
            "request_body_bytes": float(self.body_bytes),
        }
        return {name: value for name, value in values.items() if value is not None}


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def summarize_stream(
    token_times_s: Sequence[float], tokens_per_chunk: Sequence[int], completion_tokens: int
) -> tuple[float | None, tuple[float, ...]]:
    """Decode throughput and inter-token gaps from the carrying chunks (module docstring)."""
    gaps: list[float] = []
    for index in range(1, len(token_times_s)):
        tokens = max(1, tokens_per_chunk[index])
        gap = (token_times_s[index] - token_times_s[index - 1]) / tokens
        gaps.extend([gap] * tokens)
    throughput = None
    if len(token_times_s) >= 2:
        span = token_times_s[-1] - token_times_s[0]
        after_first = completion_tokens - max(1, tokens_per_chunk[0])
        if span > 0 and after_first >= 1:
            throughput = after_first / span
    return throughput, tuple(gaps)


@dataclass(frozen=True)
class ServedModel:
    id: str
    max_model_len: int | None
    #: Where the server loaded it from (vLLM's ``root``: a hub id or a folder on its machine).
    root: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    """Where the server is and how long to wait; the first-token budget comes per request."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0
    #: Longest silence between two token chunks; decode steps at 64Mi context are slow.
    inter_token_timeout_s: float = 600.0
    #: /health, /v1/models, /metrics, /tokenize (which may tokenize megabytes: see tokenize()).
    control_timeout_s: float = 60.0
    upload_chunk_bytes: int = UPLOAD_CHUNK_BYTES

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "inter_token_timeout_s", "control_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}={value!r}: expected a positive number of seconds")
        if self.upload_chunk_bytes < 1:
            raise ValueError(f"upload_chunk_bytes={self.upload_chunk_bytes}: expected >= 1")


# --------------------------------------------------------------------------------------------
# Stream plumbing


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


_MAX_LEN_RE = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS_RE = re.compile(r"contains (?:at least )?(\d+) input tokens")


# --------------------------------------------------------------------------------------------
# Client


class _PreopenedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, able to hand over a TCP connection opened in advance.

    :meth:`CompletionClient.measure` opens its request's connection just before ``t0`` and
    stages it here; the pool, which keeps no idle connection, takes it instead of connecting
    inside the timed window. Any other connection, or a staged one for another address, is
    opened as usual.
    """

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._staged: tuple[str, int, httpcore.NetworkStream] | None = None

    def open(self, host: str, port: int, timeout: float) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout=timeout)
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
            if staged[:2] == (host, port) and local_address is None and not socket_options:
                return staged[2]
            staged[2].close()
        return self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _preopening_transport() -> tuple[httpx.HTTPTransport, _PreopenedBackend | None]:
    """httpx's transport with :class:`_PreopenedBackend` under its pool (None if httpx changed)."""
    transport = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(inner, httpcore.NetworkBackend):
        return transport, None
    backend = _PreopenedBackend(inner)
    pool._network_backend = backend  # type: ignore[union-attr]
    return transport, backend


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
        transport, self._backend = _preopening_transport()
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
        try:
            return self._http.get(f"{self.base_url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> ServedModel:
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
        return ServedModel(
            id=str(entries[0]["id"]),
            max_model_len=_int_or_none(max_len),
            root=str(root) if root else None,
        )

    def version(self) -> str | None:
        """The engine's version from ``/version``; None when the server has no such endpoint."""
        try:
            data = self._get_json("/version")
        except MeasurementError:
            return None
        version = data.get("version") if isinstance(data, Mapping) else None
        return str(version) if version else None

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
        timeout = httpx.USE_CLIENT_DEFAULT
        if timeout_s is not None:
            timeout = httpx.Timeout(timeout_s, connect=self.config.connect_timeout_s)
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
            raise self._rejection(response.status_code, response.content, url, None)
        return response

    # -- the measurement ---------------------------------------------------------------------

    def measure(
        self,
        request: CompletionRequest,
        first_token_budget_s: float,
        budget_source: str = "the caller's limit",
        check_count: bool = True,
    ) -> StreamMeasurement:
        """Stream ``request`` and time it; raises a :class:`MeasurementError` on any doubt.

        ``first_token_budget_s`` bounds ``t0`` to the first token (upload and prefill included);
        ``budget_source`` says where it came from, for the timeout message. With
        ``check_count`` a completion count other than ``request.decode_tokens`` raises
        :class:`CompletionCountError` (the measurement rides along on the error).
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
            content=body.chunks(self.config.upload_chunk_bytes),
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
        context = _MeasureContext(request, body, first_token_budget_s, budget_source, exchange)
        # Everything that is the instrument's and not the server's happens before t0: the body
        # (above), the connection, and the watchdog thread's start. At t0 the deadline moves
        # later than the one the thread sleeps on, which does not wake it.
        context.connect_s = self._preconnect(http_request.url)
        watchdog.start(time.perf_counter() + first_token_budget_s, _FIRST_TOKEN)
        t0 = time.perf_counter()
        context.t0 = t0
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
            content = _read_limited(response)
            raise self._rejection(response.status_code, content, url, context.request)
        content_type = response.headers.get("content-type", "")
        if "json" in content_type and "event-stream" not in content_type:
            content = _read_limited(response)
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
                f"{self._redact(str(message))}"
            )
        tokens = 0
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                raise MalformedChunkError(
                    f"chunk {state.chunks} has a choice that is not an object: "
                    f"{self._redact(event[:200])!r}"
                )
            count, source = _choice_tokens(choice)
            tokens += count
            if count:
                state.count_source = source
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]
        if tokens:
            state.token_times.append(arrived - context.t0)
            state.tokens_per_chunk.append(tokens)
            watchdog.extend(arrived + self.config.inter_token_timeout_s, _INTER_TOKEN)
        usage = chunk.get("usage")
        if isinstance(usage, Mapping) and usage.get("completion_tokens") is not None:
            state.usage = usage

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
        completion_tokens = _int_or_none(state.usage.get("completion_tokens"))
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
        throughput, gaps = summarize_stream(
            state.token_times, state.tokens_per_chunk, completion_tokens
        )
        ordered = sorted(gaps)
        details = state.usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        exchange = context.exchange
        measurement = StreamMeasurement(
            ttft_s=state.token_times[0],
            e2e_s=state.done_at,
            token_times_s=tuple(state.token_times),
            tokens_per_chunk=tuple(state.tokens_per_chunk),
            itl_s=gaps,
            completion_tokens=completion_tokens,
            requested_tokens=request.decode_tokens,
            prompt_tokens=_int_or_none(state.usage.get("prompt_tokens")),
            cached_prompt_tokens=_int_or_none(cached),
            token_count_source=state.count_source,
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
        )
        if check_count and completion_tokens != request.decode_tokens:
            raise CompletionCountError(
                _count_message(request, measurement),
                requested=request.decode_tokens,
                received=completion_tokens,
                measurement=measurement,
            )
        return measurement

    # -- failures ----------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, _REDACTED) if key else text

    def _unavailable(self, exc: Exception) -> ServerUnavailableError:
        reason = self._redact(str(exc)) or type(exc).__name__
        return ServerUnavailableError(
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

    def _rejection(
        self, status: int, content: bytes, url: str, request: CompletionRequest | None
    ) -> RequestRejectedError:
        text = content.decode("utf-8", "replace")
        server_message, error_type = _server_error(text)
        server_message = self._redact(server_message)
        max_len = _MAX_LEN_RE.search(server_message)
        if status == 400 and max_len:
            prompt = _PROMPT_TOKENS_RE.search(server_message)
            prompt_tokens = int(prompt.group(1)) if prompt else None
            limit = int(max_len.group(1))
            wanted = request.prompt_length if request is not None else None
            needed = ""
            if request is not None and (prompt_tokens or wanted):
                total = (prompt_tokens or wanted or 0) + request.decode_tokens
                needed = f"; serve with --max-model-len >= {total} (prompt + decode)"
            size = (
                f"the prompt has {prompt_tokens} tokens"
                if prompt_tokens is not None
                else "the prompt (with the decode length) does not fit"
            )
            return PromptTooLongError(
                f"prompt too long for the server: it accepts at most {limit} tokens, {size}"
                f"{needed}. Server said: {server_message}",
                status_code=status,
                server_message=server_message,
                error_type=error_type,
                max_model_len=limit,
                prompt_tokens=prompt_tokens,
            )
        hint = {
            401: " (check the API key)",
            403: " (check the API key)",
            404: " (check the URL and the served model name)",
        }.get(status, "")
        what = f" for {_describe(request)}" if request is not None else ""
        return RequestRejectedError(
            f"{url} answered HTTP {status}{what}{hint}: {server_message or '(empty body)'}",
            status_code=status,
            server_message=server_message,
            error_type=error_type,
        )


@dataclass
class _StreamState:
    done: bool = False
    done_at: float = 0.0
    chunks: int = 0
    token_times: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    count_source: str = "text"
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None

    @property
    def chunk_tokens_total(self) -> int:
        return sum(self.tokens_per_chunk)


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

    def describe_request(self) -> str:
        return _describe(self.request)

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


def _describe(request: CompletionRequest) -> str:
    length = request.prompt_length
    prompt = "a text prompt" if length is None else f"a {format_size(length)}-token prompt"
    return f"{prompt}, {request.decode_tokens} tokens to decode"


def _count_message(request: CompletionRequest, measurement: StreamMeasurement) -> str:
    asked, got = request.decode_tokens, measurement.completion_tokens
    prompt = measurement.prompt_tokens or request.prompt_length
    if got > asked:
        return f"asked for {asked} completion tokens, got {got}: the server ignored max_tokens"
    if measurement.finish_reason == "stop":
        return (
            f"asked for {asked} completion tokens, got {got}: the model stopped at an end "
            "token (finish_reason 'stop'), so the server ignored ignore_eos/min_tokens"
        )
    total = f" ({prompt} + {asked} = {prompt + asked})" if prompt is not None else ""
    return (
        f"asked for {asked} completion tokens, got {got}: the server clamped the request, "
        f"likely prompt + max_tokens > max_model_len{total}; serve with a --max-model-len of "
        "at least the prompt plus the decode length"
    )


def _server_error(text: str) -> tuple[str, str | None]:
    """The human part of an error body: OpenAI/vLLM ``error.message``, FastAPI ``detail``."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:1000], None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and "message" in error:
            return str(error["message"]), _str_or_none(error.get("type"))
        if isinstance(error, str):
            return error, None
        if "message" in data:
            return str(data["message"]), _str_or_none(data.get("type"))
        if "detail" in data:
            return json.dumps(data["detail"])[:1000], None
    return text.strip()[:1000], None


def _read_limited(response: httpx.Response) -> bytes:
    collected = bytearray()
    try:
        for piece in response.iter_bytes():
            collected += piece
            if len(collected) >= ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass  # an error body cut short still says something
    return bytes(collected[:ERROR_BODY_LIMIT])


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
