"""HTML for pytest-html's report during a session, and a standalone page for rebuilt reports.

Everything is self-contained: plots are embedded as ``data:image/png;base64`` URIs and the
page carries its own style, so a report opens offline, attached to a ticket or a CI artefact.

Numeric sorting in pytest-html 4 (read from pytest-html 4.2's ``basereport.py`` and
``resources/app.js``): a header cell is sortable when its HTML contains ``sortable``, and its
``data-column-type`` names the sort key. For every row, ``BaseReport._hydrate_data`` takes the
key from the cell's first ``col-(\\w+)`` class and the value from the cell's inner HTML
(``<td.*?>(.*?)</td>``, one line), then the browser sorts with ``a[key] > b[key]``: a plain
string comparison, with no numeric mode and no ``data-sort`` attribute. So each cell here
starts with an HTML comment holding the value zero-padded to a fixed width (``<!--000...1024.
000000000-->1Ki``): invisible in the page, and string order equals numeric order.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records
from pytest_longctx.rendering.text_table import html_table
from pytest_longctx.reporting.depth_map import html_fragment as depth_map_fragment
from pytest_longctx.reporting.kv_plot import kv_plot_note
from pytest_longctx.reporting.predictions import html_fragment as progress_fragment
from pytest_longctx.reporting.request_timing import html_fragment as server_timing_fragment
from pytest_longctx.reporting.view import (
    COMMAND_KEYS,
    DEFAULT_TITLE,
    REPRODUCE_LABELS,
    TABLE_COLUMNS,
    format_fingerprint_value,
    header_items,
    non_passed_records,
    one_line,
    outcome_words,
    point_words,
    reproduce_items,
    setup_variations,
    summary_rows,
    ttft_decimals,
    workload_words,
)
from pytest_longctx.workloads import report_sections

#: (sort key, header label) of the columns added to pytest-html's results table.
RESULTS_TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("longctx_length", "Length"),
    ("longctx_repeat", "Repeat"),
    ("longctx_ttft", "TTFT (s)"),
    ("longctx_decode", "Decode (tok/s)"),
    ("longctx_prompt_tokens", "Prompt tokens"),
)
# 15 integer digits and 9 decimals: exact order for any value in [0, 1e15).
_SORT_KEY_WIDTH = 25
_SORT_KEY_DECIMALS = 9


def sort_key(value: float | None) -> str:
    """A string whose lexicographic order is the numeric order of non-negative values.

    Missing, negative and non-finite values get the empty key and sort before every number.
    """
    if value is None or not math.isfinite(value) or value < 0:
        return ""
    return f"{value:0{_SORT_KEY_WIDTH}.{_SORT_KEY_DECIMALS}f}"


def table_header_cells() -> list[str]:
    """``<th>`` cells for pytest-html's results table.

    pytest-html pairs a row cell with the header cell at the same index, so the row cells of
    :func:`table_row_cells` must be inserted at the same position (e.g. both appended). The
    keys also work with pytest-html's ``initial_sort`` ini option (``longctx_length``).
    """
    return [
        f'<th class="sortable" data-column-type="{key}">{html.escape(label)}</th>'
        for key, label in RESULTS_TABLE_COLUMNS
    ]


def _ttft_text(ttft: float | None) -> str:
    return f"{ttft:,.{ttft_decimals(ttft)}f}" if ttft is not None else ""


def _sortable_cell(key: str, value: float | None, text: str) -> str:
    if value is None:
        return f'<td class="col-{key}"></td>'
    return f'<td class="col-{key}"><!--{sort_key(value)}-->{html.escape(text)}</td>'


def table_row_cells(record: Record | None) -> list[str]:
    """``<td>`` cells matching :func:`table_header_cells`; empty for tests outside the sweep."""
    if record is None:
        return [_sortable_cell(key, None, "") for key, _ in RESULTS_TABLE_COLUMNS]
    ttft = record.figure("ttft")
    decode = record.figure("decode_throughput")
    tokens = record.prompt_tokens
    return [
        _sortable_cell("longctx_length", record.length, format_size(record.length)),
        _sortable_cell(
            "longctx_repeat",
            record.repeat,
            f"{record.repeat}{workload_words(record)}",
        ),
        _sortable_cell("longctx_ttft", ttft, _ttft_text(ttft)),
        _sortable_cell("longctx_decode", decode, f"{decode:,.1f}" if decode is not None else ""),
        _sortable_cell(
            "longctx_prompt_tokens", tokens, f"{tokens:,}" if tokens is not None else ""
        ),
    ]


# --------------------------------------------------------------------------- fragments


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], css_class: str) -> str:
    return html_table(headers, list(rows), css_class)


def embedded_image(path: Path) -> str:
    """An ``<img>`` carrying the PNG itself, so the page needs no file beside it."""
    encoded = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    alt = html.escape(Path(path).stem)
    return f'<img src="data:image/png;base64,{encoded}" alt="{alt}" style="max-width:100%">'


def summary_fragment(records: Iterable[Record], plot_paths: Iterable[Path | None] = ()) -> str:
    """Per-length table and embedded plots, for pytest-html's summary or the standalone page.

    Plot paths that are None or no longer exist are left out: a plot is optional, the table
    is not.
    """
    records = list(records)
    table = _table(TABLE_COLUMNS, summary_rows(records), "longctx-summary-table longctx-lengths")
    images = [
        f"<figure>{embedded_image(Path(path))}</figure>"
        for path in plot_paths
        if path is not None and Path(path).is_file()
    ]
    note = kv_plot_note(records)
    if note:
        images.append(f'<p class="longctx-note">{html.escape(note)}</p>')
    return (
        f'<section class="longctx-summary"><style>{_SUMMARY_STYLE}</style>'
        "<h3>Long-context sweep (mean ± sample std over passed repeats)</h3>"
        f"{table}{''.join(images)}{server_timing_fragment(records)}"
        f"{depth_map_fragment(records)}"
        f"{''.join(workload.html_fragment(records) for workload in report_sections())}"
        f"{progress_fragment(records)}"
        "</section>"
    )


#: Scoped to the fragment, so it reads the same inside pytest-html's page and on its own.
_SUMMARY_STYLE = """
.longctx-summary h3 { color: #222; }
.longctx-summary-table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
.longctx-summary-table th, .longctx-summary-table td {
  border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; color: #222; }
.longctx-summary-table th { background: #f3f3f3; }
.longctx-summary-table td:first-child, .longctx-summary-table th:first-child { text-align: left; }
.longctx-summary figure { margin: 0.8em 0; }
"""


# --------------------------------------------------------------------------- standalone page

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
figure { margin: 1em 0; }
.warning { color: #a40; }
"""

_POINT_COLUMNS = (
    "Run",
    "Prompt",
    "Repeat",
    "Outcome",
    "TTFT (s)",
    "Decode tok/s",
    "Prompt tokens",
    "Reason",
)


def _point_row(record: Record) -> list[str]:
    ttft = record.figure("ttft")
    decode = record.figure("decode_throughput")
    return [
        record.run_id,
        format_size(record.length),
        str(record.repeat),
        outcome_words(record),
        _ttft_text(ttft),
        f"{decode:,.1f}" if decode is not None else "",
        f"{record.prompt_tokens:,}" if record.prompt_tokens is not None else "",
        one_line(record.reason) if record.outcome != "passed" else "",
    ]


def _header_html(records: Sequence[Record]) -> str:
    items = "".join(
        f"<li><b>{html.escape(label)}:</b> {html.escape(text)}</li>"
        for label, text in header_items(records)
    )
    parts = [f"<ul>{items}</ul>"]
    differences = setup_variations(records)
    if differences:
        lines = []
        for key, values in differences.items():
            variants = "".join(
                f"<li>{html.escape(', '.join(run_ids))}: {html.escape(value)}</li>"
                for value, run_ids in values.items()
            )
            lines.append(f"<li><code>{html.escape(key)}</code><ul>{variants}</ul></li>")
        parts.append(
            '<p class="warning"><b>The runs differ in fingerprint</b>, so the spread mixes '
            f"setups:</p><ul>{''.join(lines)}</ul>"
        )
    return "".join(parts)


def _non_passed_html(records: Sequence[Record]) -> str:
    failures = non_passed_records(records)
    if not failures:
        return "<p>Every recorded point passed.</p>"
    items = "".join(
        f"<li>{html.escape(point_words(r))} "
        f"(run <code>{html.escape(r.run_id)}</code>): <b>{html.escape(outcome_words(r))}</b>: "
        f"{html.escape(one_line(r.reason))}</li>"
        for r in failures
    )
    return f"<ul>{items}</ul>"


def _reproduce_html(records: Sequence[Record], reproduce: Mapping[str, Any] | None) -> str:
    items = reproduce_items(records, reproduce)
    if not items:
        return "<p>The records carry no fingerprint to reproduce from.</p>"
    parts = []
    for key in COMMAND_KEYS:
        if key in items:
            command = html.escape(format_fingerprint_value(items[key]))
            parts.append(f"<p>{REPRODUCE_LABELS[key]}:</p><pre>{command}</pre>")
    others = "".join(
        f"<li>{html.escape(REPRODUCE_LABELS.get(key, key))}: "
        f"{html.escape(format_fingerprint_value(value))}</li>"
        for key, value in items.items()
        if key not in COMMAND_KEYS
    )
    if others:
        parts.append(f"<ul>{others}</ul>")
    return "".join(parts)


def standalone_page(
    records: Iterable[Record],
    plot_paths: Iterable[Path | None] = (),
    title: str = DEFAULT_TITLE,
    *,
    reproduce: Mapping[str, Any] | None = None,
    sections: Sequence[str] = (),
) -> str:
    """A complete HTML document that opens offline: no scripts, no links, images inline.

    ``sections`` are HTML fragments placed after the summary (the regression gate).
    """
    records = list(records)
    escaped_title = html.escape(title)
    if records:
        points = sorted(
            latest_records(records), key=lambda r: (r.length, r.run_id, r.repeat, r.question)
        )
        body = (
            _header_html(records)
            + summary_fragment(records, plot_paths)
            + "".join(sections)
            + "<h2>Points that did not pass</h2>"
            + _non_passed_html(records)
            + "<h2>Every point</h2>"
            + _table(_POINT_COLUMNS, map(_point_row, points), "longctx-points-table")
            + "<h2>How to reproduce</h2>"
            + _reproduce_html(records, reproduce)
        )
    else:
        body = "<p>No records yet.</p>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escaped_title}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escaped_title}</h1>{body}</body></html>\n"
    )


def write_standalone_html(
    path: Path,
    records: Iterable[Record],
    plot_paths: Iterable[Path | None] = (),
    title: str = DEFAULT_TITLE,
    *,
    reproduce: Mapping[str, Any] | None = None,
    sections: Sequence[str] = (),
) -> Path:
    page = standalone_page(records, plot_paths, title, reproduce=reproduce, sections=sections)
    return write_atomically(path, page)
