"""The concurrency question: how many long requests fit at once, and what each decodes.

Per length, the fit: the largest level that ran at once below the first that did not
(measured), the plan's fit, vLLM's own figure and the verdict. Per length and level (mean
over the passed repeats): the aggregate decode throughput of the c requests together, the
median and slowest request's own decode rate, the TTFT of the last request to start (its
queueing shows there), the peaks of the scheduler's waiting gauge (all reasons and
``capacity``) and of the KV usage, the preemptions, and whether every repeat ran at once.
One plot: the aggregate decode throughput against the level, a line per length.
"""

from __future__ import annotations

import html
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.capacity import FitVerdict, fit_verdict
from pytest_longctx.core.file_names import CONCURRENCY_PLOT
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records
from pytest_longctx.rendering.text_table import aligned_table, html_table, markdown_table_lines

STATE = "concurrency"
_MISSING = "–"

FIT_COLUMNS = ("Prompt", "Levels measured", "Fit measured", "Fit planned", "vLLM", "Verdict")
LEVEL_COLUMNS = (
    "Prompt",
    "Level",
    "n",
    "Aggregate decode (tok/s)",
    "Per request: median / slowest (tok/s)",
    "Last to start: TTFT (s)",
    "Waiting peak (capacity)",
    "KV usage peak",
    "Preemptions",
    "At once",
)
INTRO = (
    "Each level sends c distinct cold prompts of the length at once, each decoding the "
    "plan's decode tokens. A level ran at once when the last request had its first token "
    "before the first finished and nothing was preempted; the measured fit is the largest "
    "level that ran at once below the first that did not. The plan's fit is the KV cache's "
    "blocks (less vLLM's null block) over one request's; vLLM's figure is its "
    "kv_cache_max_concurrency at that request size."
)


@dataclass(frozen=True)
class LevelRow:
    length: int
    level: int
    records: tuple[Record, ...]

    def mean(self, figure: str) -> float | None:
        values = [r.figures[figure] for r in self.records if figure in r.figures]
        return statistics.fmean(values) if values else None

    def peak(self, key: str) -> float | None:
        values = [r.concurrency.get(key) for r in self.records]
        known = [float(v) for v in values if v is not None]
        return max(known) if known else None

    @property
    def ran_at_once(self) -> bool:
        return all(r.concurrency.get("ran_at_once") for r in self.records)


def level_rows(records: Sequence[Record]) -> list[LevelRow]:
    """The passed concurrency points by length and level."""
    grouped: dict[tuple[int, int], list[Record]] = {}
    for record in latest_records(records):
        if record.cache_state == STATE and record.outcome == "passed":
            grouped.setdefault((record.length, record.concurrency_level), []).append(record)
    return [LevelRow(n, c, tuple(group)) for (n, c), group in sorted(grouped.items())]


def fit_rows(records: Sequence[Record]) -> list[FitVerdict]:
    """Each length's measured fit beside the plan's and vLLM's (its newest record's)."""
    rows = level_rows(records)
    verdicts = []
    for length in sorted({row.length for row in rows}):
        here = [row for row in rows if row.length == length]
        newest = max((r for row in here for r in row.records), key=lambda r: r.started_at or 0)
        planned, vllm = newest.concurrency.get("fit_planned"), newest.concurrency.get("fit_vllm")
        ran = {row.level: row.ran_at_once for row in here}
        verdicts.append(fit_verdict(length, ran, planned, vllm))
    return verdicts


def _number(value: float | None, digits: int = 1) -> str:
    return _MISSING if value is None else f"{value:,.{digits}f}"


def _fit_cells(verdict: FitVerdict, levels: str) -> list[str]:
    if verdict.exact:
        measured = str(verdict.measured)
    elif verdict.measured is None:
        measured = _MISSING
    else:
        upper = "" if verdict.measured_upper is None else str(verdict.measured_upper)
        measured = f"{verdict.measured}..{upper}" if upper else f">= {verdict.measured}"
    return [
        format_size(verdict.length),
        levels,
        measured,
        _MISSING if verdict.planned is None else str(verdict.planned),
        _MISSING if verdict.vllm is None else f"{verdict.vllm:.2f}x",
        verdict.verdict,
    ]


def _level_cells(row: LevelRow) -> list[str]:
    waiting, capacity = row.peak("waiting_peak"), row.peak("waiting_capacity_peak")
    waits = _number(waiting, 0) + ("" if capacity is None else f" ({capacity:,.0f})")
    usage = row.peak("kv_usage_peak")
    return [
        format_size(row.length),
        str(row.level),
        str(len(row.records)),
        _number(row.mean("aggregate_decode_throughput")),
        f"{_number(row.mean('decode_throughput'))} / "
        f"{_number(row.mean('min_request_decode_throughput'))}",
        _number(row.mean("ttft"), 3),
        waits,
        _MISSING if usage is None else f"{usage:.0%}",
        _number(row.peak("preemptions"), 0),
        "yes" if row.ran_at_once else "no",
    ]


def _tables(records: Sequence[Record]) -> tuple[list[list[str]], list[list[str]]] | None:
    rows = level_rows(records)
    if not rows:
        return None
    fits = []
    for verdict in fit_rows(records):
        levels = ", ".join(str(r.level) for r in rows if r.length == verdict.length)
        fits.append(_fit_cells(verdict, levels))
    return fits, [_level_cells(row) for row in rows]


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Concurrency`` section; empty without concurrency points."""
    tables = _tables(records)
    if tables is None:
        return []
    fits, levels = tables
    lines = ["## Concurrency: how many long requests fit at once", "", INTRO, ""]
    lines += markdown_table_lines(FIT_COLUMNS, fits)
    lines += [""]
    lines += markdown_table_lines(LEVEL_COLUMNS, levels)
    lines.append("")
    return lines


def terminal_table(records: Sequence[Record]) -> str | None:
    tables = _tables(records)
    if tables is None:
        return None
    fits, levels = tables
    return aligned_table(FIT_COLUMNS, fits) + "\n\n" + aligned_table(LEVEL_COLUMNS, levels)


def html_fragment(records: Sequence[Record]) -> str:
    tables = _tables(records)
    if tables is None:
        return ""
    fits, levels = tables
    css = "longctx-summary-table longctx-concurrency-table"
    return (
        "<h3>Concurrency: how many long requests fit at once</h3>"
        f"<p>{html.escape(INTRO)}</p>"
        + html_table(FIT_COLUMNS, fits, css)
        + html_table(LEVEL_COLUMNS, levels, css)
    )


def draw_plot(records: Sequence[Record], run_dir: Path) -> Path | None:
    """``concurrency_decode.png``: the aggregate decode throughput against the level, one
    line per length; levels that did not run at once are hollow."""
    rows = [
        (row, throughput)
        for row in level_rows(records)
        if (throughput := row.mean("aggregate_decode_throughput"))
    ]
    if not rows:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for length in sorted({r.length for r, _ in rows}):
        here = [(r, throughput) for r, throughput in rows if r.length == length]
        line = axes.plot(
            [r.level for r, _ in here],
            [throughput for _, throughput in here],
            marker="o",
            label=format_size(length),
        )[0]
        hollow = [(r, throughput) for r, throughput in here if not r.ran_at_once]
        if hollow:
            axes.scatter(
                [r.level for r, _ in hollow],
                [throughput for _, throughput in hollow],
                s=90,
                facecolors="white",
                edgecolors=line.get_color(),
                zorder=3,
            )
    axes.set_xlabel("Requests sent at once (level)")
    axes.set_ylabel("Aggregate decode throughput (tok/s)")
    axes.set_title("Concurrency: decode throughput against level (hollow: did not run at once)")
    axes.set_xticks(sorted({r.level for r, _ in rows}))
    axes.grid(True, alpha=0.3)
    axes.legend(title="prompt")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(Path(run_dir) / CONCURRENCY_PLOT, buffer.getvalue())
