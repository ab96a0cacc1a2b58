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
it raises, and no error message or repr ever contains the API key."""

from __future__ import annotations

from .client import (
    ClientConfig,
    CompletionClient,
    ServedModel,
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
    "NoTokensError",
    "PromptTooLongError",
    "RequestBody",
    "RequestRejectedError",
    "ServedModel",
    "NotConnectedError",
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
