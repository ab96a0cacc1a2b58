"""Both sides of each request: the client's TTFT and vLLM's own, and the front end's share.

Per length and kind of request (a cold or warm point's, an interference point's long request
and its background requests, a concurrency level's every request), over the passed points'
requests that carry the server's per-request timing (the record's ``server_timing``): the
client's TTFT (``t0`` to the first token's arrival), the server's (scheduled to first token),
their difference, the front end's share (the upload, the request's parsing, the validation of
its ids, the queue and the first token's way back: a cost users pay at millions of tokens that
no engine figure shows), the server's queue, and how many streams showed the decode the server
timed for that very request. Points whose server sent no per-request timing are counted apart,
with the reason their records give.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import format_mean_std, latest_records
from pytest_longctx.rendering.text_table import html_table, markdown_table_lines

TITLE = "Client and server TTFT"
COLUMNS = (
    "Prompt",
    "Requests",
    "Client TTFT (s)",
    "Server TTFT (s)",
    "Front end (s)",
    "Front end share",
    "Server queue (s)",
    "Streams showing the server's decode",
)
INTRO = (
    "Each request's time to first token as the client saw it (sent to the first token's "
    "arrival) and as vLLM timed it (scheduled to first token: its per-request metrics, "
    "--enable-per-request-metrics), mean ± sample std over the passed points' requests. The "
    "difference is the front end's share: the upload, the request's parsing, the validation "
    "of its ids, the queue and the first token's way back. The last column counts the "
    "requests whose stream showed the decode the server timed for that very request (rate "
    "and bursts), of those it could judge."
)
_MISSING = "–"
_KIND_ORDER = {"cold": 0, "warm": 1, "interference": 2, "interference background": 3}


@dataclass(frozen=True)
class TimingRow:
    """The timed requests of one length and kind."""

    length: int
    kind: str
    entries: tuple[Mapping[str, object], ...]

    @property
    def label(self) -> str:
        return format_size(self.length) + ("" if self.kind == "cold" else f" {self.kind}")

    def values(self, key: str) -> list[float]:
        found = (entry.get(key) for entry in self.entries)
        return [float(v) for v in found if isinstance(v, (int, float)) and math.isfinite(v)]

    def cells(self) -> list[str]:
        client, server = self.values("client_ttft_s"), self.values("ttft_s")
        front = self.values("front_end_s")
        share = _MISSING
        if client and front and math.fsum(client) > 0:
            share = f"{math.fsum(front) / len(front) / (math.fsum(client) / len(client)):.1%}"
        verdicts = [str(entry.get("decode", "unchecked")) for entry in self.entries]
        judged = [v for v in verdicts if not v.startswith("unchecked")]
        agree = sum(v == "agrees" for v in judged)
        return [
            self.label,
            str(len(self.entries)),
            _mean_std(client),
            _mean_std(server),
            _mean_std(front),
            share,
            _mean_std(self.values("queue_s")),
            f"{agree} of {len(judged)}" if judged else _MISSING,
        ]


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return _MISSING
    mean = math.fsum(values) / len(values)
    std = None
    if len(values) > 1:
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    largest = max(abs(mean), std or 0.0)
    decimals = 3 if largest >= 0.1 or largest == 0 else min(6, 2 - math.floor(math.log10(largest)))
    return format_mean_std(mean, std, decimals)


def _kind(record: Record) -> str:
    if record.cache_state == "concurrency":
        return f"concurrency {record.concurrency_level}"
    return record.cache_state


def _entries(record: Record) -> Iterable[tuple[str, Mapping[str, object]]]:
    timing = record.server_timing
    request = timing.get("request")
    if isinstance(request, Mapping):
        yield _kind(record), request
    for key, kind in (("requests", _kind(record)), ("background", "interference background")):
        for entry in timing.get(key) or ():
            if isinstance(entry, Mapping):
                yield kind, entry


def timing_rows(records: Iterable[Record]) -> list[TimingRow]:
    """One row per length and kind, from the passed points that carry per-request timing."""
    grouped: dict[tuple[int, str], list[Mapping[str, object]]] = {}
    for record in latest_records(records):
        if record.outcome != "passed":
            continue
        for kind, entry in _entries(record):
            grouped.setdefault((record.length, kind), []).append(entry)
    rows = [TimingRow(length, kind, tuple(entries)) for (length, kind), entries in grouped.items()]
    return sorted(rows, key=lambda row: (row.length, _kind_order(row.kind)))


def _kind_order(kind: str) -> tuple[int, int]:
    if kind.startswith("concurrency "):
        return (len(_KIND_ORDER), int(kind.split()[1]))
    return (_KIND_ORDER.get(kind, len(_KIND_ORDER)), 0)


def untimed_note(records: Iterable[Record]) -> str | None:
    """How many passed points carry no per-request timing, and why (their records')."""
    untimed = [
        record
        for record in latest_records(records)
        if record.outcome == "passed" and record.server_timing.get("source") == "metrics"
    ]
    if not untimed:
        return None
    why = untimed[-1].server_timing.get("why") or "no reason recorded"
    count = f"{len(untimed)} passed point{'s' if len(untimed) != 1 else ''}"
    return f"{count} without the server's per-request timing: {why}."


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Client and server TTFT`` section; empty when no record has either side."""
    rows, note = timing_rows(records), untimed_note(records)
    if not rows and not note:
        return []
    lines = [f"## {TITLE}", "", INTRO, ""]
    if rows:
        lines += markdown_table_lines(COLUMNS, [row.cells() for row in rows])
        lines.append("")
    if note:
        lines += [note, ""]
    return lines


def html_fragment(records: Sequence[Record]) -> str:
    rows, note = timing_rows(records), untimed_note(records)
    if not rows and not note:
        return ""
    parts = [f"<h3>{html.escape(TITLE)}</h3><p>{html.escape(INTRO)}</p>"]
    if rows:
        parts.append(
            html_table(
                COLUMNS,
                [row.cells() for row in rows],
                "longctx-summary-table longctx-server-timing",
            )
        )
    if note:
        parts.append(f'<p class="longctx-note">{html.escape(note)}</p>')
    return "".join(parts)
