"""Tables of aligned plain-text columns, for a terminal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
