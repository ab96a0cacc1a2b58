"""Server-sent events from raw bytes, and how many tokens a streamed choice carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


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
