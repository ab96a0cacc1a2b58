"""Tables as text: aligned plain-text columns for a terminal, and a report section's
Markdown and HTML tables (first column text, the others numbers)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from pytest_longctx.core.stats import FigureSummary, format_mean_std

#: A cell with no figure.
MISSING = "–"


def aligned_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    text_columns: int = 1,
    text_names: Iterable[str] = (),
) -> str:
    """Plain-text columns: the first ``text_columns`` and those named ``text_names``
    left-aligned, the numbers right."""
    table = [list(columns), *rows]
    widths = [max(len(row[index]) for row in table) for index in range(len(columns))]
    text = {c for i, c in enumerate(columns) if i < text_columns} | (set(text_names) & set(columns))

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.ljust(width) if column in text else cell.rjust(width)
            for cell, width, column in zip(cells, widths, columns, strict=True)
        ]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(columns), rule, *(line(row) for row in rows)])


def markdown_table_lines(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the first column left-aligned, the others right."""
    return [
        "| " + " | ".join(columns) + " |",
        "|---|" + "---:|" * (len(columns) - 1),
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
    ]


def html_table(columns: Sequence[str], rows: Sequence[Sequence[str]], css_class: str) -> str:
    """An HTML table, every cell escaped."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def format_summary(summary: FigureSummary | None, decimals: int) -> str:
    """``mean ± std``; a single value prints alone, since one sample has no spread."""
    if summary is None:
        return MISSING
    return format_mean_std(summary.mean, summary.std if summary.n >= 2 else None, decimals)
