"""What the reports say about the stream: its chunking when a chunk carried more than one token,
and the points whose decode figure is the server's (or absent) because the stream disagreed with
the server's decode."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size

_SOURCES = {
    "usage": "the running usage count",
    "token_ids": "token_ids",
    "logprobs": "logprobs",
    "text": "text (one per chunk: the server sent no running usage)",
}


def chunking_words(stream: Mapping[str, Any]) -> str:
    """``chunks of 8 tokens (stream interval 8, counted from the running usage count)``."""
    interval = stream.get("stream_interval")
    mean = stream.get("tokens_per_chunk_mean")
    source = _SOURCES.get(str(stream.get("token_count_source")), stream.get("token_count_source"))
    if interval:
        size = f"chunks of {interval} tokens (stream interval {interval}"
    elif mean:
        size = f"chunks of {mean:g} tokens on average (stream interval unknown"
    else:
        size = "chunks of unknown size ("
    return f"{size}, counted from {source})"


def stream_items(records: Sequence[Record]) -> list[tuple[str, str]]:
    """Header lines for every report: the chunking when it is not one token per chunk, and
    the points kept with the server's decode figure."""
    passed = [record for record in records if record.outcome == "passed" and record.stream]
    items: list[tuple[str, str]] = []
    chunked = [record for record in passed if not record.stream.get("per_token_gaps", True)]
    if chunked:
        kinds = sorted({chunking_words(record.stream) for record in chunked})
        items.append(
            (
                "Streaming",
                f"{len(chunked)} of {len(passed)} passed points streamed {'; '.join(kinds)}: "
                "their gaps are between chunks (chunk_gap_*), the per-token figures are "
                "derived from them (derived_itl_*), and no ITL is recorded or gated for them",
            )
        )
    kept = _ordered(r for r in passed if r.stream.get("decode_source") == "server")
    if kept:
        items.append(
            (
                "Decode figures",
                f"{_count(kept)} kept the server's decode throughput, the stream arriving in "
                f"bursts or off the server's rate (--longctx-strict-stream fails such points; "
                f"the stream's own figures are kept as stream_*): {_points(kept)}. First: "
                f"{kept[0].stream.get('agreement')}",
            )
        )
    lost = _ordered(r for r in passed if r.stream.get("decode_source") == "none")
    if lost:
        items.append(
            (
                "Decode figures",
                f"{_count(lost)} without a decode figure, TTFT kept: neither the stream nor the "
                f"server shows this request's decode (the stream's own figures are kept as "
                f"stream_*): {_points(lost)}. First: {lost[0].stream.get('decode_problem')}",
            )
        )
    fingerprint = next((r.fingerprint for r in reversed(records) if r.fingerprint), {})
    check = fingerprint.get("stream") if isinstance(fingerprint, Mapping) else None
    if isinstance(check, Mapping) and check.get("bursts_allowed") is False:
        items.append(
            (
                "Decode figures",
                "points whose stream disagrees with the server's decode fail "
                "(--longctx-strict-stream)",
            )
        )
    return items


def _count(records: Sequence[Record]) -> str:
    return f"{len(records)} point{'s' if len(records) != 1 else ''}"


def _points(records: Iterable[Record]) -> str:
    return ", ".join(f"{format_size(record.length)} rep {record.repeat}" for record in records)


def _ordered(records: Iterable[Record]) -> list[Record]:
    return sorted(records, key=lambda record: (record.length, record.repeat))
