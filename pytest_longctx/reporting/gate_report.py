"""The regression gate in a report: the baseline beside this run, per length, as a table and a
chart (``gate.png``), with the failing lengths and why.

Built from records only: the baseline file's passed records and this run's, judged with the
gate's own rule (:func:`pytest_longctx.gate.compare_length`, what each ``test_regression[len=N]``
item runs), so the report and the items agree on every length.
"""

from __future__ import annotations

import dataclasses
import html
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx import gate
from pytest_longctx.core.file_names import GATE_PLOT
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import format_mean_std, latest_records
from pytest_longctx.rendering.axes import length_axis
from pytest_longctx.reporting.html import embedded_image

#: Length statuses that fail the length's ``test_regression`` item.
FAILING_STATUSES = frozenset({"regressed", "missing_in_current", "insufficient", "refused"})
#: What the reports call each status.
STATUS_WORDS: Mapping[str, str] = {
    "ok": "passed",
    "improved": "improved",
    "regressed": "regressed",
    "insufficient": "not compared",
    "missing_in_current": "no passed point now",
    "missing_in_baseline": "not in baseline",
    "refused": "refused: another setup",
}
#: What a report calls the lines that say whose figures a verdict compared where they were
#: not all the streams' own (the server's decode or mean ITL, background figures set aside).
REMARKS_HEADING = "Where the figures came from"
#: The figures drawn in ``gate.png``: (metric name, log y axis).
PLOTTED_METRICS: tuple[tuple[str, bool], ...] = (("ttft", True), ("decode", False))


@dataclass(frozen=True)
class MetricRow:
    """One metric at one length: each side's figure and the change of the mean."""

    baseline: gate.Stats | None
    current: gate.Stats | None
    status: str | None  # the metric's verdict, None where it was not judged

    @property
    def change_pct(self) -> float | None:
        if self.baseline is None or self.current is None or self.baseline.mean <= 0:
            return None
        return 100.0 * (self.current.mean - self.baseline.mean) / self.baseline.mean


@dataclass(frozen=True)
class GateRow:
    length: int
    status: str  # one of gate.LENGTH_STATUSES, or "refused"
    metrics: Mapping[str, MetricRow]  # by metric name, in gate.METRICS order
    #: What the length's item says: every non-ok verdict, or the note of a one-sided length.
    messages: tuple[str, ...]
    #: What a passing length says too: whose figures were compared where not all were the
    #: streams' own (the server's decode or mean ITL), and background figures set aside.
    remarks: tuple[str, ...] = ()

    @property
    def failing(self) -> bool:
        return self.status in FAILING_STATUSES


@dataclass(frozen=True)
class GateView:
    """Everything a report shows about the gate of one run."""

    rows: tuple[GateRow, ...]
    tolerances: gate.Tolerances
    level: float
    baseline_sessions: int
    baseline_label: str
    tolerance_source: str
    #: Fingerprint differences the gate refused to compare across (empty when it compared).
    refused: tuple[str, ...] = ()
    #: Baseline lengths this run did not measure (not gated, not failing).
    unmeasured: tuple[int, ...] = ()
    plot: Path | None = None

    @property
    def failing(self) -> tuple[GateRow, ...]:
        return tuple(row for row in self.rows if row.failing)

    def remarks(self) -> list[tuple[int, str]]:
        """(length, remark) of every verdict whose figures were not all the streams' own."""
        return [(row.length, remark) for row in self.rows for remark in row.remarks]

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics its table shows: warm TTFT only where a side measured warm points."""
        return tuple(
            name
            for name, metric in gate.METRICS.items()
            if metric.cache_state == "cold"
            or any(r.metrics[name].baseline or r.metrics[name].current for r in self.rows)
        )

    def with_plot(self, plot: Path | None) -> GateView:
        return dataclasses.replace(self, plot=plot)

    def headline(self) -> str:
        failing = self.failing
        if self.refused:
            return f"refused: the baseline measured another setup ({len(self.rows)} lengths)"
        if failing:
            sizes = ", ".join(format_size(row.length) for row in failing)
            return f"{len(failing)} of {len(self.rows)} lengths failed ({sizes})"
        return f"no regression over {len(self.rows)} lengths"

    def settings(self) -> str:
        return (
            f"Baseline: {self.baseline_label} ({gate.noise_model_words(self.baseline_sessions)})"
            f"; tolerances {self.tolerances.describe()} (from {self.tolerance_source}), "
            f"level {self.level:g}"
        )


def build_view(
    baseline: Iterable[Record],
    current: Iterable[Record],
    tolerances: gate.Tolerances | None = None,
    *,
    level: float = gate.DEFAULT_LEVEL,
    lengths: Iterable[int] | None = None,
    force: bool = False,
    baseline_label: str = "baseline",
    tolerance_source: str = "built-in defaults",
) -> GateView:
    """The gate's verdict at each of ``lengths`` (default: every length this run recorded).

    Like the session's items, it refuses to compare when the passed records of this run were
    measured on another setup than the baseline's, unless ``force``.
    """
    baseline = [record for record in latest_records(baseline) if record.outcome == "passed"]
    current = latest_records(current)
    tolerances = tolerances or gate.Tolerances()
    if lengths is None:
        lengths = {record.length for record in current}
    lengths = sorted(set(lengths))
    refused: tuple[str, ...] = ()
    if not force:
        measured = [record for record in current if record.outcome == "passed"]
        refused = tuple(gate.fingerprint_differences(baseline, measured))
    rows = []
    for length in lengths:
        verdict = gate.compare_length(baseline, current, length, tolerances, level=level)
        judged = {v.metric: v for v in verdict.verdicts}
        # The verdicts carry the statistics they were judged on; a metric the gate did not
        # judge here (off, or a side without figures) still shows what the records hold.
        metrics = {
            name: (
                MetricRow(judged[name].baseline, judged[name].current, judged[name].status)
                if name in judged
                else MetricRow(
                    _baseline_stats(
                        [r for r in baseline if r.cache_state == metric.cache_state],
                        length,
                        metric.figure,
                    ),
                    _current_stats(
                        [r for r in current if r.cache_state == metric.cache_state],
                        length,
                        metric.figure,
                    ),
                    None,
                )
            )
            for name, metric in gate.METRICS.items()
        }
        messages: tuple[str, ...]
        if refused:
            status, messages = "refused", ()
        else:
            status = verdict.status
            messages = tuple(v.message for v in verdict.verdicts if v.status != "ok") or (
                (verdict.note,) if verdict.note and verdict.status != "ok" else ()
            )
        remarks = tuple(
            f"{gate.METRICS[v.metric].label}: {v.sources}" for v in verdict.verdicts if v.sources
        )
        rows.append(GateRow(length, status, metrics, messages, () if refused else remarks))
    measured_lengths = set(lengths)
    return GateView(
        rows=tuple(rows),
        tolerances=tolerances,
        level=level,
        baseline_sessions=gate.session_count(baseline),
        baseline_label=baseline_label,
        tolerance_source=tolerance_source,
        refused=refused,
        unmeasured=tuple(sorted({r.length for r in baseline} - measured_lengths)),
    )


def _values(records: Iterable[Record], figure: str) -> list[float]:
    values = (record.figure(figure) for record in records)
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _baseline_stats(records: Sequence[Record], length: int, figure: str) -> gate.Stats | None:
    """As the gate sees the baseline: over its repeats, or the spread of session means."""
    by_session: dict[tuple[str, int], list[Record]] = {}
    for record in records:
        if record.length == length:
            by_session.setdefault(gate.session_key(record), []).append(record)
    groups = [values for group in by_session.values() if (values := _values(group, figure))]
    return gate.Stats.of_sessions(groups) if groups else None


def _current_stats(records: Sequence[Record], length: int, figure: str) -> gate.Stats | None:
    here = [r for r in records if r.length == length and r.outcome == "passed"]
    values = _values(here, figure)
    return gate.Stats.of(figure, values) if values else None


# --------------------------------------------------------------------------- cells


def format_stats(stats: gate.Stats | None, metric: str) -> str:
    """``0.0700 ± 0.0014 (n=3)``; a history: ``0.0875 ± 0.0065 (4 sessions, n=12)``."""
    if stats is None:
        return "–"
    count = f"{stats.sessions} sessions, n={stats.n}" if stats.sessions > 1 else f"n={stats.n}"
    return format_mean_std(stats.mean, stats.std, _digits(stats.mean, metric), count=count)


def _digits(mean: float, metric: str) -> int:
    """Three significant digits, at least one decimal for throughput."""
    if mean <= 0 or not math.isfinite(mean):
        return 1 if metric == "decode" else 4
    return max(1 if metric == "decode" else 0, 2 - math.floor(math.log10(mean)))


def format_change(row: MetricRow) -> str:
    change = row.change_pct
    if change is None:
        return "–"
    mark = {"regressed": " worse", "improved": " better"}.get(row.status or "", "")
    return f"{change:+.1f}%{mark}"


#: Short column names of the gated metrics.
_COLUMN_NAMES = {"ttft": "TTFT", "decode": "Decode", "itl": "ITL", "warm_ttft": "Warm TTFT"}


def table_header(view: GateView) -> list[str]:
    header = ["Length", "Gate"]
    for name in view.metric_names:
        metric = gate.METRICS[name]
        short = _COLUMN_NAMES.get(name, metric.label)
        header += [
            f"{short} baseline ({metric.unit})",
            f"{short} now ({metric.unit})",
            f"{short} change",
        ]
    return header


def table_rows(view: GateView) -> list[list[str]]:
    rows = []
    for row in view.rows:
        cells = [format_size(row.length), STATUS_WORDS.get(row.status, row.status)]
        for name in view.metric_names:
            metric = row.metrics[name]
            cells += [
                format_stats(metric.baseline, name),
                format_stats(metric.current, name),
                format_change(metric),
            ]
        rows.append(cells)
    return rows


# --------------------------------------------------------------------------- Markdown


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_section(view: GateView, report_path: Path | None = None) -> str:
    """``## Regression gate``: settings, headline, table, chart and the failing lengths.

    The chart is linked relative to ``report_path``, the Markdown file it goes into.
    """
    plot_link = markdown_plot_link(view, report_path) if report_path is not None else None
    header = table_header(view)
    lines = ["## Regression gate", "", f"**{_md(view.headline())}**", ""]
    lines += [_md(view.settings()), ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in table_rows(view)]
    lines.append("")
    lines.append(
        "Baseline and now: mean ± std of the passed repeats (a baseline of several sessions: "
        "mean and spread of its session means); change: now against the baseline's mean."
    )
    lines.append("")
    if plot_link:
        lines += [f"![gate]({plot_link})", ""]
    lines += _failing_markdown(view)
    if view.remarks():
        lines += [f"{REMARKS_HEADING}:", ""]
        lines += [f"- {format_size(n)}: {_md(remark)}" for n, remark in view.remarks()]
        lines.append("")
    if view.unmeasured:
        sizes = ", ".join(format_size(n) for n in view.unmeasured)
        lines += [f"Baseline lengths not measured in this run: {sizes}.", ""]
    return "\n".join(lines)


def _failing_markdown(view: GateView) -> list[str]:
    if view.refused:
        lines = ["The gate refused to compare unlike with unlike:", ""]
        return lines + [f"- {_md(difference)}" for difference in view.refused] + [""]
    failing = view.failing
    if not failing:
        return ["Every gated length passed.", ""]
    lines = ["Failing lengths:", ""]
    for row in failing:
        for message in row.messages or (STATUS_WORDS[row.status],):
            lines.append(f"- {format_size(row.length)}: {_md(message)}")
    return [*lines, ""]


def markdown_plot_link(view: GateView, report_path: Path) -> str | None:
    """The chart's path relative to the Markdown report, when the chart exists."""
    if view.plot is None or not Path(view.plot).is_file():
        return None
    return Path(os.path.relpath(view.plot, Path(report_path).parent)).as_posix()


# --------------------------------------------------------------------------- HTML


_STYLE = """
.longctx-gate h3 { color: #222; }
.longctx-gate-table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
.longctx-gate-table th, .longctx-gate-table td {
  border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; color: #222; }
.longctx-gate-table th { background: #f3f3f3; }
.longctx-gate-table td:nth-child(-n+2), .longctx-gate-table th:nth-child(-n+2) {
  text-align: left; }
.longctx-gate-table tr.longctx-gate-failing td { background: #fde8e8; }
.longctx-gate-table tr.longctx-gate-failing td:nth-child(2) { color: #a00; font-weight: bold; }
.longctx-gate-headline.failing { color: #a00; }
.longctx-gate figure { margin: 0.8em 0; }
"""


def html_fragment(view: GateView) -> str:
    """The gate section for pytest-html's summary or the standalone page; self-contained."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in table_header(view))
    body = []
    for row, cells in zip(view.rows, table_rows(view), strict=True):
        css = ' class="longctx-gate-failing"' if row.failing else ""
        tds = "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        body.append(f'<tr{css} data-length="{row.length}">{tds}</tr>')
    table = (
        f'<table class="longctx-gate-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    failing_class = "failing" if view.failing or view.refused else "passing"
    parts = [
        f'<section class="longctx-gate"><style>{_STYLE}</style>',
        "<h3>Regression gate: baseline against this run</h3>",
        f'<p class="longctx-gate-headline {failing_class}"><b>{html.escape(view.headline())}'
        "</b></p>",
        f"<p>{html.escape(view.settings())}</p>",
        table,
    ]
    if view.plot is not None and Path(view.plot).is_file():
        parts.append(f"<figure>{embedded_image(Path(view.plot))}</figure>")
    if view.refused:
        items = "".join(f"<li>{html.escape(d)}</li>" for d in view.refused)
        parts.append(f"<p>The gate refused to compare unlike with unlike:</p><ul>{items}</ul>")
    elif view.failing:
        items = "".join(
            f"<li><b>{html.escape(format_size(row.length))}</b>: {html.escape(message)}</li>"
            for row in view.failing
            for message in row.messages or (STATUS_WORDS[row.status],)
        )
        parts.append(f'<ul class="longctx-gate-failures">{items}</ul>')
    if view.remarks():
        items = "".join(
            f"<li><b>{html.escape(format_size(n))}</b>: {html.escape(remark)}</li>"
            for n, remark in view.remarks()
        )
        parts.append(f'<p>{REMARKS_HEADING}:</p><ul class="longctx-gate-remarks">{items}</ul>')
    if view.unmeasured:
        sizes = ", ".join(format_size(n) for n in view.unmeasured)
        parts.append(f"<p>Baseline lengths not measured in this run: {html.escape(sizes)}.</p>")
    parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------- chart


def draw_gate_plot(view: GateView, path: Path) -> Path | None:
    """Baseline and this run, mean ± std per length: TTFT (log-log) above decode throughput
    (log x); failing lengths shaded red. None (and no file) when neither side has a figure."""
    panels = [
        (name, log_y)
        for name, log_y in PLOTTED_METRICS
        if any(
            (m := row.metrics[name]).baseline is not None or m.current is not None
            for row in view.rows
        )
    ]
    if not panels:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    figure = Figure(figsize=(8, 3.6 * len(panels) + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    lengths = [row.length for row in view.rows]
    failing = [row.length for row in view.failing]
    for index, (name, log_y) in enumerate(panels):
        metric = gate.METRICS[name]
        axes = figure.add_subplot(len(panels), 1, index + 1)
        for length in failing:
            axes.axvspan(length / 2**0.4, length * 2**0.4, color="#d62728", alpha=0.15, lw=0)
        for side, color, marker, label in (
            ("baseline", "#7f7f7f", "s", _baseline_legend(view)),
            ("current", "#1f77b4", "o", "this run"),
        ):
            points = [
                (row.length, stats)
                for row in view.rows
                if (stats := getattr(row.metrics[name], side)) is not None
                and (stats.mean > 0 or not log_y)
            ]
            if not points:
                continue
            axes.errorbar(
                [n for n, _ in points],
                [s.mean for _, s in points],
                yerr=[s.std or 0.0 for _, s in points],
                color=color,
                marker=marker,
                markersize=5,
                capsize=3,
                linewidth=1.5,
                label=label,
            )
        regressed = [
            (row.length, m.current.mean)
            for row in view.rows
            if (m := row.metrics[name]).status == "regressed" and m.current is not None
        ]
        if regressed:
            axes.scatter(
                [n for n, _ in regressed],
                [y for _, y in regressed],
                s=140,
                facecolors="none",
                edgecolors="#d62728",
                linewidths=2,
                zorder=5,
                label=f"{metric.label} {metric.worse_verb}",
            )
        length_axis(axes, lengths, log_y=log_y)
        axes.set_ylabel(f"{metric.label[0].upper()}{metric.label[1:]} ({metric.unit})")
        axes.grid(True, which="major", alpha=0.3)
        handles, labels = axes.get_legend_handles_labels()
        if failing:
            handles.append(Patch(color="#d62728", alpha=0.15))
            labels.append("failing length")
        axes.legend(handles, labels, fontsize=8)
    figure.axes[-1].set_xlabel("Prompt length (tokens)")
    figure.suptitle(f"Regression gate: baseline and this run (mean ± std); {view.headline()}")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(Path(path), buffer.getvalue())


def _baseline_legend(view: GateView) -> str:
    if view.baseline_sessions > 1:
        return f"baseline ({view.baseline_sessions} sessions)"
    return "baseline"


def write_gate_plot(view: GateView, folder: Path) -> GateView:
    """Draw ``gate.png`` in ``folder``; the view, with the chart when one was drawn."""
    return view.with_plot(draw_gate_plot(view, Path(folder) / GATE_PLOT))
