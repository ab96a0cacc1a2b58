"""What can go wrong with a measured request; every message says what to do."""

from __future__ import annotations

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]

from .result import StreamMeasurement

UPLOAD_CHUNK_BYTES = 1 << 20  # httpcore copies the unsent tail on each send: keep pieces small
ERROR_BODY_LIMIT = 1 << 20


class MeasurementError(Exception):
    """A measurement that produced no trustworthy figures; the message says what to do."""


class ServerUnavailableError(MeasurementError):
    """Nothing answered: connection refused, reset or closed before a response."""


class NotConnectedError(ServerUnavailableError):
    """No connection could be made: the request was never sent."""


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

    def __init__(self, message: str, server_message: str | None = None) -> None:
        super().__init__(message)
        self.server_message = server_message


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
