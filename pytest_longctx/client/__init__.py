"""The instrument: one streamed ``/v1/completions`` request, timed from the client's side.

Definitions (all clocks are :func:`time.perf_counter`, CLOCK_MONOTONIC on Linux and so comparable
with other processes' stamps, relative to ``t0``, taken just before the request is handed to the
HTTP client; the JSON body is built and the connection opened before ``t0``):

* A chunk *carries tokens* when its running ``usage.completion_tokens`` rose (the request asks
  for ``stream_options.continuous_usage_stats``, which vLLM answers with the running count in
  every chunk) or, on a server without it, when its choices count any: a choice with a
  ``token_ids`` list (vLLM sends it with ``return_token_ids``) counts ``len(token_ids)``, else
  one with a ``logprobs.tokens`` list counts ``len(tokens)``: exact, an empty list is no token.
  Otherwise a choice with a ``text`` key (``delta.content`` for chat-style chunks) counts one
  token, also for ``"text": ""``: the token may be an incomplete UTF-8 piece. The running
  count counts every chunk exactly when every carrying chunk has it (``token_count_source``
  ``"usage"``); otherwise the chunks' own counts do. Chunks without tokens (a role-only chunk,
  a keep-alive chunk, the final usage chunk) never stop the TTFT clock.
* ``ttft_s``: ``t0`` to the arrival of the first chunk that carries tokens. It includes the
  upload, the server's parsing, queueing and prefill, and the chunk's way back: what a client
  with an open connection waits. The TCP connection is opened just before ``t0`` (``connect_s``)
  and the watchdog thread started, so neither is inside the TTFT.
* ``decode_throughput``: ``(N - k1) / (t_last - t_first)``, N the server's
  ``usage.completion_tokens``, k1 the tokens in the first carrying chunk, t_first/t_last the
  arrivals of the first/last carrying chunks: exact with chunks of any size. Counting text,
  k1 is taken as 1, which is exact for vLLM: it sends the first token alone even with
  ``--stream-interval`` above 1.
* Gaps: ``itl_s`` gives a chunk that arrives ``g`` seconds after the previous one with ``k``
  tokens ``k`` gaps of ``g / k``, so they sum to ``t_last - t_first``. Inter-token latencies
  (``itl_median_s`` ...) are the gaps before one-token chunks, and only from a server that
  streams every token (the counts show stream interval 1); with chunks of several tokens
  :meth:`StreamMeasurement.chunk_figures` keeps the gaps between chunks as such and the
  per-token figures derived from them, under their own names.
* ``e2e_s``: ``t0`` to the arrival of ``data: [DONE]``.
* ``server_timing``: the server's own figures for this request, where it sends them (vLLM's
  per-request ``metrics`` on the final usage chunk, served with
  ``--enable-per-request-metrics``): :class:`ServerTiming`.

Only vLLM-compatible servers are targeted; everything the client checks is named in the error
it raises, and no error message or repr ever contains the API key."""

from __future__ import annotations

from .client import (
    ClientConfig,
    CompletionClient,
    ModelEntry,
)
from .errors import (
    ERROR_BODY_LIMIT,
    UPLOAD_CHUNK_BYTES,
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
    PromptTooLongError,
    RequestRejectedError,
    ServerUnavailableError,
    StreamError,
    TruncatedStreamError,
)
from .request import (
    CompletionRequest,
    RequestBody,
    encode_request,
    encode_token_ids,
)
from .result import (
    ServerTiming,
    StreamMeasurement,
    quantile,
    summarize_stream,
)
from .stream_progress import StreamProgress

__all__ = [
    "ClientConfig",
    "CompletionClient",
    "CompletionCountError",
    "CompletionRequest",
    "ERROR_BODY_LIMIT",
    "ErrorFrameError",
    "FirstTokenTimeoutError",
    "InterTokenTimeoutError",
    "MalformedChunkError",
    "MalformedResponseError",
    "MeasurementError",
    "MeasurementTimeoutError",
    "MissingUsageError",
    "ModelEntry",
    "NoTokensError",
    "PromptTooLongError",
    "RequestBody",
    "RequestRejectedError",
    "NotConnectedError",
    "ServerTiming",
    "ServerUnavailableError",
    "StreamError",
    "StreamMeasurement",
    "StreamProgress",
    "TruncatedStreamError",
    "UPLOAD_CHUNK_BYTES",
    "encode_request",
    "encode_token_ids",
    "quantile",
    "summarize_stream",
]
