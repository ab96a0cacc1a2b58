"""The answers' map: the probe's verdicts by prompt length and needle depth.

A bug that loses context loses it somewhere: past a length (an offset that wraps), at a depth
(a block far back, a chunk boundary), on a reused prefix. One row per length and kind of
point (cold, warm follow-up, interference), one column per needle depth to the nearest eighth
of the prompt; a cell counts the right (✓) and wrong (✗) answers of the points whose needle sat
there. Points whose answer was not checked (no probe, ``--longctx-fidelity=off``, a model that
did not answer the probe in the warm-ups) are left out of the map, and each reason is said once
under it with the points it covers.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Sequence

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records, unchecked_reasons
from pytest_longctx.rendering.text_table import html_table, markdown_table_lines

#: Depth columns: eighths of the prompt, 0 (its start) to 1 (right before the question).
EIGHTHS = 8
COLUMNS = ("Prompt", *(f"{i / EIGHTHS:g}" for i in range(EIGHTHS + 1)))
MARKS = {"correct": "✓", "wrong": "✗"}
_EMPTY = "·"
_KIND_ORDER = {"cold": 0, "warm": 1, "interference": 2}

INTRO = (
    "Verdicts of the fidelity probe by prompt length and by the depth of the needle asked for "
    "(a fraction of the prompt, to the nearest eighth: 0 its start, 1 right before the "
    "question): ✓ right, ✗ wrong, with counts where several points fall in one cell. Warm "
    "follow-ups ask a needle of the cached prefix; their depth is within the whole prompt."
)


def depth_map(records: Iterable[Record]) -> list[tuple[str, list[str]]]:
    """``(row label, cells)`` per length and kind of point; empty without judged answers."""
    counts: dict[tuple[int, str], Counter[tuple[int, str]]] = {}
    for record in latest_records(records):
        verdict = record.fidelity.get("verdict")
        depth = record.fidelity.get("depth")
        if verdict not in MARKS or not isinstance(depth, (int, float)):
            continue
        column = round(min(max(float(depth), 0.0), 1.0) * EIGHTHS)
        counts.setdefault((record.length, record.cache_state), Counter())[column, verdict] += 1
    rows = []
    for (length, kind), cells in sorted(
        counts.items(), key=lambda i: (i[0][0], _KIND_ORDER.get(i[0][1], 3))
    ):
        label = format_size(length) + ("" if kind == "cold" else f" {kind}")
        rows.append((label, [_cell(cells, column) for column in range(EIGHTHS + 1)]))
    return rows


def _cell(cells: Counter[tuple[int, str]], column: int) -> str:
    marks = []
    for verdict, mark in MARKS.items():
        count = cells[column, verdict]
        if count:
            marks.append(mark if count == 1 else f"{count}{mark}")
    return " ".join(marks) or _EMPTY


def unchecked_notes(records: Iterable[Record]) -> list[str]:
    """``Not checked at N point(s): reason``, once per reason."""
    return [
        f"Not checked at {count} point(s): {reason}"
        for reason, count in unchecked_reasons(latest_records(records)).items()
    ]


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Answers by length and needle depth`` section; empty without answers."""
    rows = depth_map(records)
    notes = unchecked_notes(records)
    if not rows and not notes:
        return []
    lines = ["## Answers by length and needle depth", ""]
    if rows:
        lines += [INTRO, ""]
        lines += markdown_table_lines(COLUMNS, [[label, *cells] for label, cells in rows])
        lines.append("")
    if notes:
        lines += [f"- {note}" for note in notes]
        lines.append("")
    return lines


def html_fragment(records: Sequence[Record]) -> str:
    rows = depth_map(records)
    notes = unchecked_notes(records)
    if not rows and not notes:
        return ""
    parts = ["<h3>Answers by length and needle depth</h3>"]
    if rows:
        parts.append(f"<p>{html.escape(INTRO)}</p>")
        parts.append(
            html_table(
                COLUMNS,
                [[label, *cells] for label, cells in rows],
                "longctx-summary-table longctx-depth-map",
            )
        )
    if notes:
        items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
        parts.append(f"<ul class='longctx-unchecked-answers'>{items}</ul>")
    return "".join(parts)
