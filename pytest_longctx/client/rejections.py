"""What an HTTP error status, a vLLM error body or a clamped completion means, in words."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from pytest_longctx.core.sizes import format_size

from .errors import ERROR_BODY_LIMIT, PromptTooLongError, RequestRejectedError
from .request import CompletionRequest
from .result import StreamMeasurement

_MAX_LEN_RE = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS_RE = re.compile(r"contains (?:at least )?(\d+) input tokens")


def rejection(
    status: int,
    content: bytes,
    url: str,
    request: CompletionRequest | None,
    redact: Callable[[str], str] = str,
) -> RequestRejectedError:
    """An HTTP error status as the error that says what to do (a too-long prompt apart)."""
    text = content.decode("utf-8", "replace")
    server_message, error_type = _server_error(text)
    server_message = redact(server_message)
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
    what = f" for {describe(request)}" if request is not None else ""
    return RequestRejectedError(
        f"{url} answered HTTP {status}{what}{hint}: {server_message or '(empty body)'}",
        status_code=status,
        server_message=server_message,
        error_type=error_type,
    )


def describe(request: CompletionRequest) -> str:
    length = request.prompt_length
    prompt = "a text prompt" if length is None else f"a {format_size(length)}-token prompt"
    return f"{prompt}, {request.decode_tokens} tokens to decode"


def count_message(request: CompletionRequest, measurement: StreamMeasurement) -> str:
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


def read_limited(response: httpx.Response) -> bytes:
    collected = bytearray()
    try:
        for piece in response.iter_bytes():
            collected += piece
            if len(collected) >= ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass  # an error body cut short still says something
    return bytes(collected[:ERROR_BODY_LIMIT])


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def int_or_none(value: Any) -> int | None:
    """A JSON count as an int; None for anything else (a bool, a fraction, a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
