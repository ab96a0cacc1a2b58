"""The ETA model's predictions against the measurements, and each point's energy, for the
reports: from records alone (``predicted_ttft`` and the energy figures; records written before
them simply have no such section)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records
from pytest_longctx.reporting.view import workload_words

COLUMNS = (
    "Prompt",
    "Repeat",
    "TTFT (s)",
    "Predicted TTFT (s)",
    "Prediction error",
    "Energy (J)",
    "J / prompt token",
    "J / generated token",
)
_MISSING = "–"
_STYLE = """
.longctx-progress-table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
.longctx-progress-table th, .longctx-progress-table td {
  border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; color: #222; }
.longctx-progress-table th { background: #f3f3f3; }
"""


def _watched(records: Iterable[Record]) -> list[Record]:
    return sorted(
        (
            r
            for r in latest_records(records)
            if r.outcome == "passed" and ("predicted_ttft" in r.figures or "energy" in r.figures)
        ),
        key=lambda r: (r.length, r.run_id, r.repeat),
    )


def _number(value: float | None, spec: str) -> str:
    return _MISSING if value is None else format(value, spec)


def rows(records: Iterable[Record]) -> list[list[str]]:
    """One row per passed point with a prediction or an energy figure."""
    table = []
    for record in _watched(records):
        figures = record.figures
        ttft, predicted = figures.get("ttft"), figures.get("predicted_ttft")
        error = (predicted - ttft) / ttft * 100 if predicted is not None and ttft else None
        table.append(
            [
                format_size(record.length),
                f"{record.repeat}{workload_words(record)}",
                _number(ttft, ",.3f"),
                _number(predicted, ",.3f"),
                _MISSING if error is None else f"{error:+.1f}%",
                _number(figures.get("energy"), ",.1f"),
                _number(figures.get("energy_per_prompt_token"), ".3g"),
                _number(figures.get("energy_per_generated_token"), ".3g"),
            ]
        )
    return table


def telemetry_note(records: Sequence[Record]) -> str | None:
    """Why the points carry no energy, when the records say no device tool was there; what
    the energy covers of a server over several nodes; the points whose energy was not
    measured (shorter than the power tool's averaging window), with why."""
    notes = []
    covered = next((r.energy["coverage"] for r in records if r.energy.get("coverage")), None)
    if covered:
        notes.append(f"Energy covers {covered}.")
    unmeasured = [r for r in records if r.energy.get("not_measured")]
    if unmeasured:
        first = unmeasured[0].energy["not_measured"]
        why = first.get("prefill_energy") or first.get("decode_energy") or first.get("energy")
        notes.append(
            f"Energy of {len(unmeasured)} point(s) not measured in full: {why} "
            f"({format_size(unmeasured[0].length)} rep {unmeasured[0].repeat})."
        )
    if not any("energy" in r.figures for r in records) and not unmeasured:
        for record in reversed(records):
            info = record.fingerprint.get("device_telemetry")
            if isinstance(info, Mapping) and info.get("tool") is None and info.get("missing"):
                notes.append(f"Energy not measured: {info['missing']}.")
                break
    return " ".join(notes) or None


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Prediction and energy`` section; empty for records without either."""
    table, note = rows(records), telemetry_note(records)
    if not table and not note:
        return []
    lines = [
        "## Prediction and energy",
        "",
        "The TTFT the ETA model predicted before each point (fitted to the points measured "
        "before it), and the devices' energy: prefill energy per prompt token, decode energy "
        "per token decoded after the first.",
        "",
    ]
    if table:
        lines.append("| " + " | ".join(COLUMNS) + " |")
        lines.append("|---|---:|" + "---:|" * (len(COLUMNS) - 2))
        lines += ["| " + " | ".join(row) + " |" for row in table]
        lines.append("")
    if note:
        lines += [note, ""]
    return lines


def html_fragment(records: Sequence[Record]) -> str:
    table, note = rows(records), telemetry_note(records)
    if not table and not note:
        return ""
    parts: list[Any] = ["<h3>Prediction and energy</h3>"]
    if table:
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in table
        )
        parts.append(
            f"<style>{_STYLE}</style>"
            f'<table class="longctx-progress-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )
    if note:
        parts.append(f'<p class="longctx-note">{html.escape(note)}</p>')
    return "".join(parts)
