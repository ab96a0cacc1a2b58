"""The campaign report a person reads: ``report.md``, and the same table for a terminal.

The layout follows the study's campaign report: what was measured (runs, profile, model,
versions, hardware), one row per prompt length with mean ± std over repeats (Table 1), the
points that did not pass and why, and how to reproduce the numbers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.rendering.text_table import aligned_table
from pytest_longctx.reporting.depth_map import markdown_lines as depth_map_lines
from pytest_longctx.reporting.kv_plot import kv_plot_note
from pytest_longctx.reporting.predictions import markdown_lines as progress_lines
from pytest_longctx.reporting.request_timing import markdown_lines as server_timing_lines
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
)
from pytest_longctx.workloads import report_sections

#: Columns printed left-aligned; the numeric ones align right.
_TEXT_COLUMNS = frozenset({"Prompt", "answers", "outcomes"})


# --------------------------------------------------------------------------- markdown


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(records: Iterable[Record]) -> str:
    alignment = ["---" if column in _TEXT_COLUMNS else "---:" for column in TABLE_COLUMNS]
    lines = [
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "|".join(alignment) + "|",
    ]
    for row in summary_rows(records):
        lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
    return "\n".join(lines)


def _header_lines(records: Sequence[Record]) -> list[str]:
    lines = [f"- {label}: {_markdown_cell(text)}" for label, text in header_items(records)]
    differences = setup_variations(records)
    if differences:
        lines.append("")
        lines.append("**The runs differ in fingerprint**, so the spread mixes setups:")
        for key, values in differences.items():
            lines.append(f"- `{key}`:")
            for value, run_ids in values.items():
                runs = ", ".join(f"`{run_id}`" for run_id in run_ids)
                lines.append(f"  - {runs}: {_markdown_cell(value)}")
    return lines


def _non_passed_lines(records: Sequence[Record]) -> list[str]:
    failures = non_passed_records(records)
    if not failures:
        return ["Every recorded point passed."]
    return [
        f"- {point_words(record)} (run `{record.run_id}`): "
        f"**{outcome_words(record)}**: {one_line(record.reason)}"
        for record in failures
    ]


def _reproduce_lines(items: Mapping[str, Any]) -> list[str]:
    if not items:
        return ["The records carry no fingerprint to reproduce from."]
    lines: list[str] = []
    for key in COMMAND_KEYS:
        if key in items:
            value = format_fingerprint_value(items[key])
            lines += [f"{REPRODUCE_LABELS[key]}:", "", "```sh", value, "```", ""]
    for key, value in items.items():
        if key not in COMMAND_KEYS:
            lines.append(f"- {REPRODUCE_LABELS.get(key, key)}: {format_fingerprint_value(value)}")
    while lines and not lines[-1]:
        lines.pop()
    return lines


def render_markdown(
    records: Iterable[Record],
    *,
    title: str = DEFAULT_TITLE,
    reproduce: Mapping[str, Any] | None = None,
    plot_links: Sequence[str] = (),
    sections: Sequence[str] = (),
) -> str:
    """The whole ``report.md``.

    ``reproduce`` adds to or overrides the fingerprint's reproduce keys; ``plot_links`` are
    image paths as the reader's viewer should resolve them (relative to the report);
    ``sections`` are whole Markdown sections placed after the results (the regression gate).
    """
    records = list(records)
    lines = [f"# {title}", ""]
    if not records:
        return "\n".join(lines + ["No records yet.", ""])
    lines += _header_lines(records)
    lines += ["", "## Results", "", "Mean ± sample std over the passed repeats of every run.", ""]
    if summary_rows(records):
        lines += [markdown_table(records), ""]
    else:  # the interference or concurrency points alone: their figures have their section
        lines += ["No cold point in these records: see the sections below.", ""]
    for link in plot_links:
        lines += [f"![{Path(link).stem}]({link})", ""]
    note = kv_plot_note(records)
    if note:
        lines += [note, ""]
    lines += server_timing_lines(records)
    lines += depth_map_lines(records)
    for workload in report_sections():
        lines += workload.markdown_lines(records)
    for section in sections:
        lines += [section.rstrip("\n"), ""]
    lines += progress_lines(records)
    lines += ["## Points that did not pass", ""]
    lines += _non_passed_lines(records)
    lines += ["", "## How to reproduce", ""]
    lines += _reproduce_lines(reproduce_items(records, reproduce))
    lines.append("")
    return "\n".join(lines)


def write_markdown(
    path: Path,
    records: Iterable[Record],
    *,
    title: str = DEFAULT_TITLE,
    reproduce: Mapping[str, Any] | None = None,
    plots: Iterable[Path] = (),
    sections: Sequence[str] = (),
) -> Path:
    """Write ``report.md``, linking ``plots`` relative to its folder."""
    path = Path(path)
    links = [Path(os.path.relpath(plot, path.parent)).as_posix() for plot in plots]
    text = render_markdown(
        records, title=title, reproduce=reproduce, plot_links=links, sections=sections
    )
    return write_atomically(path, text)


# --------------------------------------------------------------------------- terminal


def render_terminal_table(records: Iterable[Record]) -> str:
    """The results table with aligned plain-text columns, for the end-of-session summary."""
    return aligned_table(TABLE_COLUMNS, summary_rows(records), text_names=_TEXT_COLUMNS)
