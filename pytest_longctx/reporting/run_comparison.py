"""Runs side by side: FP8 against BF16 KV cache, two vLLM versions, two nodes.

The gate compares like with like, on purpose; a comparison shows unlike things, on purpose, and
says first what differs between them (their fingerprints). Per length and metric it gives each
run's mean ± std, the ratio to the first run and the gate's one-sided t-test of that change; it
draws the runs over each other (TTFT, decode throughput, and their ratio to the first run).
Records are the only input: run folders, ``results.jsonl`` files or baseline files.
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.core.file_names import COMPARE_CONCURRENCY_PLOT as CONCURRENCY_PLOT
from pytest_longctx.core.file_names import COMPARE_HTML as HTML
from pytest_longctx.core.file_names import COMPARE_INTERFERENCE_PLOT as INTERFERENCE_PLOT
from pytest_longctx.core.file_names import COMPARE_MARKDOWN as MARKDOWN
from pytest_longctx.core.file_names import COMPARE_PLOTS as PLOTS
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record, read_records, results_path
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import format_mean_std, latest_records, summarize_values
from pytest_longctx.gate import DEFAULT_LEVEL, METRICS, welch_test
from pytest_longctx.rendering.axes import length_axis
from pytest_longctx.reporting.html import embedded_image
from pytest_longctx.reporting.view import format_fingerprint_value
from pytest_longctx.workloads.concurrency.concurrency_report import level_rows
from pytest_longctx.workloads.interference.interference_report import chunk_words

#: Fingerprint keys that say nothing about the setup (when, where, how it was invoked).
_NOT_SETUP = {"command_line", "server_url", "kv_cache_check", "server_env"}


@dataclass(frozen=True)
class ComparedRun:
    label: str  # the run ids it holds, or the file's name
    records: tuple[Record, ...]


@dataclass(frozen=True)
class Cell:
    """One run's figure at one length, against the first run's."""

    mean: float
    std: float
    n: int
    ratio: float | None  # mean / the first run's mean
    p_worse: float | None  # the gate's one-sided test of the change (None: n < 2 a side)
    p_better: float | None


@dataclass(frozen=True)
class Comparison:
    runs: tuple[ComparedRun, ...]
    lengths: tuple[int, ...]
    #: metric name -> length -> one cell per run (None where the run has no figure there)
    cells: Mapping[str, Mapping[int, tuple[Cell | None, ...]]]
    #: fingerprint key -> one value per run, for the keys whose values differ
    differences: Mapping[str, tuple[str, ...]]
    level: float


class CompareError(ValueError):
    """A source that holds no records to compare."""


def load_run(path: Path) -> ComparedRun:
    file = results_path(Path(path))
    if not file.is_file():
        raise CompareError(
            f"{path}: no results.jsonl there; expected a run folder, its results.jsonl or a "
            "baseline file"
        )
    result = read_records(file)
    passed = tuple(r for r in latest_records(result.records) if r.outcome == "passed")
    if not passed:
        raise CompareError(f"{path}: no passed record to compare")
    run_ids = list(dict.fromkeys(r.run_id for r in passed))
    label = run_ids[0] if len(run_ids) == 1 else f"{file.name} ({len(run_ids)} runs)"
    return ComparedRun(label, passed)


def compare_runs(runs: Sequence[ComparedRun], level: float = DEFAULT_LEVEL) -> Comparison:
    if len(runs) < 2:
        raise CompareError("compare needs two runs or more")
    lengths = sorted({r.length for run in runs for r in run.records})
    cells: dict[str, dict[int, tuple[Cell | None, ...]]] = {}
    for name, metric in METRICS.items():
        if metric.cache_state == "concurrency":
            continue  # by level, not by length alone: concurrency_rows
        by_length = {}
        for length in lengths:
            values = [
                [
                    r.figures[metric.figure]
                    for r in run.records
                    if r.length == length
                    and r.cache_state == metric.cache_state
                    and metric.figure in r.figures
                ]
                for run in runs
            ]
            by_length[length] = tuple(_cell(values[0], v, metric.higher_is_worse) for v in values)
        if metric.cache_state == "cold" or any(any(c) for c in by_length.values()):
            cells[name] = by_length  # warm TTFT only where a run measured warm points
    return Comparison(tuple(runs), tuple(lengths), cells, _differences(runs), level)


def _cell(first: list[float], values: list[float], higher_is_worse: bool) -> Cell | None:
    if not values:
        return None
    summary = summarize_values("", values)
    base = summarize_values("", first) if first else None
    ratio = summary.mean / base.mean if base and base.mean > 0 else None
    p_worse = p_better = None
    if len(first) >= 2 and len(values) >= 2 and values is not first:
        test = welch_test(first, values, 1.0 if higher_is_worse else -1.0)
        p_worse, p_better = test.p_worse, test.p_better
    return Cell(summary.mean, summary.std, summary.n, ratio, p_worse, p_better)


def _differences(runs: Sequence[ComparedRun]) -> dict[str, tuple[str, ...]]:
    """What the comparison is about: setup keys whose value is not the same in every run."""
    per_run = [_fingerprint(run) for run in runs]
    keys = sorted({key for fingerprint in per_run for key in fingerprint} - _NOT_SETUP)
    found = {}
    for key in keys:
        values = tuple(format_fingerprint_value(fp.get(key)) for fp in per_run)
        if len(set(values)) > 1:
            found[key] = values
    return found


def _fingerprint(run: ComparedRun) -> Mapping[str, object]:
    return run.records[-1].fingerprint if run.records else {}


def run_words(run: ComparedRun) -> str:
    """``run (12 passed points)``, with the effective chunk its interference points ran on."""
    words = f"{len(run.records)} passed points"
    chunks = {chunk_words(r.interference) for r in run.records if r.cache_state == "interference"}
    if chunks:
        words += f"; interference chunk {', '.join(sorted(chunks))} tokens"
    return words


def verdict(cell: Cell | None, level: float) -> str:
    if cell is None or cell.ratio is None:
        return ""
    if cell.p_worse is None:
        return "n=1: no test"
    if cell.p_worse < level:
        return f"worse (p={cell.p_worse:.2g})"
    if cell.p_better is not None and cell.p_better < level:
        return f"better (p={cell.p_better:.2g})"
    return "within noise"


def _format(cell: Cell | None, metric: str) -> str:
    if cell is None:
        return "–"
    digits = 1 if metric == "decode" else 4
    return format_mean_std(cell.mean, cell.std, digits, count=f"n={cell.n}", grouped=False)


def table_rows(comparison: Comparison, metric: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one metric's table: each run's figure, ratio and verdict."""
    header = ["Length"]
    for index, run in enumerate(comparison.runs):
        header.append(run.label)
        if index:
            header += [f"ratio {index + 1}/1", f"verdict {index + 1}"]
    rows = []
    for length in comparison.lengths:
        cells = comparison.cells[metric][length]
        row = [format_size(length)]
        for index, cell in enumerate(cells):
            row.append(_format(cell, metric))
            if index:
                ratio = f"x{cell.ratio:.3f}" if cell is not None and cell.ratio else "–"
                row += [ratio, verdict(cell, comparison.level)]
        rows.append(row)
    return header, rows


def concurrency_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Each run's aggregate decode throughput per length and concurrency level (and whether
    the level ran at once there); empty rows when no run measured concurrency."""
    per_run = [
        {(row.length, row.level): row for row in level_rows(run.records)} for run in comparison.runs
    ]
    keys = sorted({key for rows in per_run for key in rows})
    header = ["Length", "Level"]
    for index, run in enumerate(comparison.runs):
        header.append(run.label)
        if index:
            header.append(f"ratio {index + 1}/1")
    rows = []
    for length, level in keys:
        row = [format_size(length), str(level)]
        first = per_run[0].get((length, level))
        base = first.mean("aggregate_decode_throughput") if first else None
        for index, runs in enumerate(per_run):
            found = runs.get((length, level))
            value = found.mean("aggregate_decode_throughput") if found else None
            once = "" if found is None or found.ran_at_once else " (not at once)"
            row.append("–" if value is None else f"{value:,.1f}{once}")
            if index:
                row.append(f"x{value / base:.3f}" if value and base else "–")
        rows.append(row)
    return header, rows


def render_markdown(comparison: Comparison, plot_names: Sequence[str]) -> str:
    lines = ["# Runs compared", ""]
    for index, run in enumerate(comparison.runs, start=1):
        lines.append(f"{index}. `{run.label}` ({run_words(run)})")
    lines += ["", "## What differs", ""]
    if comparison.differences:
        for key, values in comparison.differences.items():
            shown = " | ".join(f"{i}: {v}" for i, v in enumerate(values, start=1))
            lines.append(f"- `{key}`: {shown}")
    else:
        lines.append("Nothing in the fingerprints: the same setup, measured again.")
    for name, metric in METRICS.items():
        if name not in comparison.cells:
            continue
        header, rows = table_rows(comparison, name)
        lines += ["", f"## {metric.label} ({metric.unit})", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    header, rows = concurrency_rows(comparison)
    if rows:
        lines += ["", "## Aggregate decode throughput by concurrency level (tok/s)", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"Verdicts: the gate's one-sided t-test at level {comparison.level:g}.", ""]
    lines += [f"![{Path(name).stem}]({name})\n" for name in plot_names]
    return "\n".join(lines)


def render_html(comparison: Comparison, plots: Sequence[Path]) -> str:
    parts = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        "<title>Runs compared</title><style>body{font-family:sans-serif;margin:2em;}"
        "table{border-collapse:collapse;margin:1em 0;}td,th{border:1px solid #ccc;"
        "padding:.3em .6em;text-align:right;}td:first-child,th:first-child{text-align:left;}"
        "</style></head><body><h1>Runs compared</h1><ol>",
    ]
    parts += [
        f"<li><code>{html.escape(run.label)}</code> ({html.escape(run_words(run))})</li>"
        for run in comparison.runs
    ]
    parts.append("</ol><h2>What differs</h2>")
    if comparison.differences:
        parts.append("<table class='longctx-compare-differences'><tr><th>key</th>")
        parts += [f"<th>{i}</th>" for i in range(1, len(comparison.runs) + 1)]
        parts.append("</tr>")
        for key, values in comparison.differences.items():
            cells = "".join(f"<td>{html.escape(v)}</td>" for v in values)
            parts.append(f"<tr><td>{html.escape(key)}</td>{cells}</tr>")
        parts.append("</table>")
    else:
        parts.append("<p>Nothing in the fingerprints: the same setup, measured again.</p>")
    for name, metric in METRICS.items():
        if name not in comparison.cells:
            continue
        header, rows = table_rows(comparison, name)
        parts.append(f"<h2>{html.escape(metric.label)} ({html.escape(metric.unit)})</h2>")
        parts.append(f"<table class='longctx-compare-{name}'><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    header, rows = concurrency_rows(comparison)
    if rows:
        parts.append("<h2>Aggregate decode throughput by concurrency level (tok/s)</h2>")
        parts.append("<table class='longctx-compare-concurrency'><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    parts += [f"<figure>{embedded_image(path)}</figure>" for path in plots]
    parts.append("</body></html>\n")
    return "".join(parts)


def draw_plots(comparison: Comparison, out_dir: Path) -> list[Path]:
    """TTFT and decode throughput of every run over each other, and their ratio to run 1
    (where a run has cold points); with interference points, their trade."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    specs = (
        (PLOTS[0], "ttft", "Time to first token (s)", True, False),
        (PLOTS[1], "decode", "Decode throughput (tok/s)", False, False),
        (PLOTS[2], "ttft", "Ratio to run 1 (TTFT solid, decode dashed)", False, True),
    )
    for filename, metric, ylabel, log_y, ratio in specs:
        if not any(any(cells) for cells in comparison.cells[metric].values()):
            continue  # no run has a cold point: runs of the interference points alone
        figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for index, run in enumerate(comparison.runs):
            for name, style in ((metric, "-"), ("decode", "--")) if ratio else ((metric, "-"),):
                points = [
                    (length, cell)
                    for length in comparison.lengths
                    if (cell := comparison.cells[name][length][index]) is not None
                ]
                if ratio:
                    xs = [n for n, c in points if c.ratio is not None]
                    ys = [c.ratio for _, c in points if c.ratio is not None]
                    axes.plot(xs, ys, style, marker="o", label=f"{index + 1}: {run.label} {name}")
                else:
                    xs, cells = [n for n, _ in points], [c for _, c in points]
                    axes.errorbar(
                        xs,
                        [c.mean for c in cells],
                        yerr=[c.std for c in cells],
                        marker="o",
                        capsize=3,
                        label=f"{index + 1}: {run.label}",
                    )
        length_axis(axes, comparison.lengths, log_y=log_y, pad=False)
        axes.set_xlabel("Prompt length (tokens)")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        written.append(write_atomically(out_dir / filename, buffer.getvalue()))
    if "load_ttft" in comparison.cells and "stall" in comparison.cells:
        written.append(_draw_interference(comparison, out_dir))
    if concurrency_rows(comparison)[1]:
        written.append(_draw_concurrency(comparison, out_dir))
    return written


def _draw_concurrency(comparison: Comparison, out_dir: Path) -> Path:
    """Aggregate decode throughput against the level, one panel per length, a line per run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    per_run = [level_rows(run.records) for run in comparison.runs]
    lengths = sorted({row.length for rows in per_run for row in rows})
    figure = Figure(figsize=(8, 3.5 * len(lengths)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(lengths), 1, squeeze=False)[:, 0]
    for axes, length in zip(panels, lengths, strict=True):
        for index, (run, rows) in enumerate(zip(comparison.runs, per_run, strict=True)):
            here = [r for r in rows if r.length == length and r.mean("aggregate_decode_throughput")]
            if here:
                axes.plot(
                    [r.level for r in here],
                    [r.mean("aggregate_decode_throughput") for r in here],
                    marker="o",
                    label=f"{index + 1}: {run.label}",
                )
        axes.set_title(f"{format_size(length)} prompts")
        axes.set_ylabel("Aggregate decode (tok/s)")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
    panels[-1].set_xlabel("Requests sent at once (level)")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(out_dir / CONCURRENCY_PLOT, buffer.getvalue())


def _draw_interference(comparison: Comparison, out_dir: Path) -> Path:
    """TTFT under load (top) and the background's p99 gap during the prefill (bottom) of
    every run: larger chunks, shorter TTFT under load, longer stalls for the others."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 7), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True)
    for axes, metric, label in (
        (top, "load_ttft", "TTFT under load (s)"),
        (bottom, "stall", "Background p99 gap during prefill (s)"),
    ):
        for index, run in enumerate(comparison.runs):
            points = [
                (length, cell)
                for length in comparison.lengths
                if (cell := comparison.cells[metric][length][index]) is not None
            ]
            if points:
                axes.errorbar(
                    [n for n, _ in points],
                    [c.mean for _, c in points],
                    yerr=[c.std for _, c in points],
                    marker="o",
                    capsize=3,
                    label=f"{index + 1}: {run.label} ({run_words(run)})",
                )
        length_axis(axes, comparison.lengths, log_y=True, pad=False)
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    bottom.set_xlabel("Prompt length (tokens)")
    top.legend(fontsize=7)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(out_dir / INTERFERENCE_PLOT, buffer.getvalue())


def write_comparison(
    sources: Sequence[Path], out_dir: Path, level: float = DEFAULT_LEVEL
) -> list[Path]:
    """``compare.md``, ``compare.html`` and the overlay plots in ``out_dir``."""
    comparison = compare_runs([load_run(Path(source)) for source in sources], level)
    out_dir = Path(out_dir)
    plots = draw_plots(comparison, out_dir)
    markdown = write_atomically(
        out_dir / MARKDOWN, render_markdown(comparison, [p.name for p in plots])
    )
    page = write_atomically(out_dir / HTML, render_html(comparison, plots))
    return [markdown, page, *plots]
