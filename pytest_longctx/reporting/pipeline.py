"""Records in, report files out: the one pipeline behind a session's reports and the CLI's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import BENCHMARK as BENCHMARK_FILENAME
from pytest_longctx.core.file_names import HTML as HTML_FILENAME
from pytest_longctx.core.file_names import MARKDOWN as MARKDOWN_FILENAME
from pytest_longctx.core.records import Record
from pytest_longctx.reporting import gate_report
from pytest_longctx.reporting.benchmark_json import write_benchmark_json
from pytest_longctx.reporting.gate_report import GateView
from pytest_longctx.reporting.html import write_standalone_html
from pytest_longctx.reporting.kv_plot import draw_kv_cache_plot
from pytest_longctx.reporting.markdown import write_markdown
from pytest_longctx.reporting.plots import ExtraPlot, write_plots
from pytest_longctx.reporting.prefill_plot import draw_prefill_rate_plot
from pytest_longctx.reporting.view import DEFAULT_TITLE
from pytest_longctx.workloads import report_sections


def write_reports(
    records: Iterable[Record],
    out_dir: Path,
    *,
    extra_plots: Iterable[ExtraPlot] = (),
    title: str = DEFAULT_TITLE,
    reproduce: Mapping[str, Any] | None = None,
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
    gate: GateView | None = None,
    html: bool = True,
    plots: bool = True,
) -> list[Path]:
    """Write report.md, the plots, report.html and benchmark.json; return the paths written.

    The one way records become report files: the session calls it after its points (with
    ``html=False``: there pytest-html writes report.html with its test table), and
    ``python -m pytest_longctx report`` calls it with a standalone page.

    With ``gate`` (:func:`pytest_longctx.reporting.gate_report.build_view`), both reports get
    the regression gate's section and ``gate.png``. Each file is replaced atomically, so this
    can run after every sweep point while the reports are open. With ``plots=False`` no figure
    is drawn (matplotlib's rendering is most of a short session's reports) and the reports
    name none.
    """
    records = list(records)
    out_dir = Path(out_dir)
    drawn = (
        write_plots(
            out_dir,
            records,
            [
                draw_kv_cache_plot,
                draw_prefill_rate_plot,
                *(plot for workload in report_sections() for plot in workload.plots),
                *extra_plots,
            ],
        )
        if plots
        else []
    )
    markdown_path = out_dir / MARKDOWN_FILENAME
    if gate is not None and plots:
        gate = gate_report.write_gate_plot(gate, out_dir)
    markdown = write_markdown(
        markdown_path,
        records,
        title=title,
        reproduce=reproduce,
        plots=drawn,
        sections=[gate_report.markdown_section(gate, markdown_path)] if gate else [],
    )
    page = (
        write_standalone_html(
            out_dir / HTML_FILENAME,
            records,
            drawn,
            title,
            reproduce=reproduce,
            sections=[gate_report.html_fragment(gate)] if gate else [],
        )
        if html
        else None
    )
    benchmark = write_benchmark_json(
        out_dir / BENCHMARK_FILENAME, records, machine_info, commit_info
    )
    if gate is not None and gate.plot is not None:
        drawn.append(gate.plot)
    return [markdown, *drawn, *([page] if page else []), benchmark]
