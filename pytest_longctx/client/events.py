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
