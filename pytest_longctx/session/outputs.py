"""Where the records become files and tables during a session.

Every output here is rebuilt from ``results.jsonl`` alone; ``report.md`` after every point,
the plots and ``benchmark.json`` at the end (and by ``python -m pytest_longctx report``).
pytest-html writes ``report.html``: the plugin points it at the run folder, self-contained,
and adds the sweep's columns, table and plots through pytest-html's own hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from pytest_benchmark.session import PerformanceRegression

from pytest_longctx.campaign.run import RecordLog, Run, RunDescription
from pytest_longctx.core.file_names import GATE_PLOT, HTML, MARKDOWN
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import answer_counts, latest_records, unchecked_reasons
from pytest_longctx.reporting import gate_report
from pytest_longctx.reporting import html as html_report
from pytest_longctx.reporting.benchmark_json import sweep_benchmarks
from pytest_longctx.reporting.index import write_index as write_run_index
from pytest_longctx.reporting.markdown import render_terminal_table, write_markdown
from pytest_longctx.reporting.pipeline import write_reports
from pytest_longctx.reporting.view import format_answers
from pytest_longctx.session import gate_items
from pytest_longctx.workloads import planned, report_sections

#: What pytest-benchmark raises from its summary when ``--benchmark-compare-fail`` trips.
BenchmarkRegression = PerformanceRegression

#: The record an item produced (as JSON, so pytest-xdist can ship reports), set on its report
#: for pytest-html's row hook.
REPORT_ATTRIBUTE = "longctx_record"


def _may_run_sweep(config: pytest.Config) -> bool:
    """Whether this session may measure points; whether it does is known after collection."""
    if config.getoption("collectonly") or config.getoption("longctx_plan", False):
        return False
    return not hasattr(config, "workerinput")


def open_html_page(session: pytest.Session, run: RunDescription) -> None:
    """pytest-html's page of the sweep in the run folder, unless the user chose a path.

    pytest-html makes its page object in its own ``pytest_configure``, and only for
    ``--html``; whether a session measures a sweep is known only once it is collected. So the
    page is made here, once points are selected, by pytest-html's own ``pytest_configure``
    given the run folder's path, and handed the session start it missed. This is the one seam
    into pytest-html; ``tests/unit/reporting/test_browser.py`` renders the page it makes.
    """
    config = session.config
    _add_to_metadata_table(config, run)
    if not _may_run_sweep(config) or not config.pluginmanager.hasplugin("html"):
        return
    if getattr(config.option, "htmlpath", None) is None:
        from pytest_html import plugin as html_plugin
        from pytest_html.basereport import BaseReport

        config.option.htmlpath = str(run.run_dir / HTML)
        config.option.self_contained_html = True
        before = {id(plugin) for _, plugin in config.pluginmanager.list_name_plugin()}
        config.pluginmanager.register(HtmlTitle(_title(run)), "longctx-html-title")
        html_plugin.pytest_configure(config)
        for _, plugin in config.pluginmanager.list_name_plugin():
            if isinstance(plugin, BaseReport) and id(plugin) not in before:
                plugin.pytest_sessionstart(session)


def _add_to_metadata_table(config: pytest.Config, run: RunDescription) -> None:
    """pytest-metadata fills its table when it is configured, before a sweep is known: the
    sweep's setup is added to it when the sweep starts."""
    with contextlib.suppress(ImportError):
        from pytest_metadata.plugin import metadata_key

        if metadata_key in config.stash:
            describe_environment(run, config.stash[metadata_key])


def describe_environment(run: RunDescription, metadata: dict) -> None:
    """The sweep's setup in pytest-metadata's table (pytest-html's Environment section)."""
    metadata["longctx run"] = run.run_id
    for name, words in describe_sweep(run).items():
        metadata[f"longctx {name}"] = words


def describe_sweep(run: RunDescription) -> dict[str, str]:
    """What the sweep measures, in the words the page's table and the report header share."""
    profile = run.plan.profile
    revision = f" @ {profile.model.revision}" if profile.model.revision else ""
    return {
        "profile": f"{profile.name}: {profile.description}",
        "model": (
            f"as {run.settings.url} serves it (see the sweep summary)"
            if run.settings.url
            else profile.model.source + revision
        ),
        "server": ", ".join(run.settings.urls) or "launched from the profile",
        "points": (
            f"{format_size(run.plan.lengths[0])}..{format_size(run.plan.lengths[-1])}, "
            f"{run.plan.repeats} repeat(s), {run.plan.decode_tokens} decode tokens"
            + (
                f"; workload {','.join(run.plan.workloads)}"
                + "".join(workload.header_words(run.plan) for workload in planned(run.plan))
                if run.plan.workloads != ("cold",)
                else ""
            )
        ),
    }


def report_header(run: RunDescription) -> list[str]:
    """pytest's header lines for a session that asks for the sweep."""
    lines = [f"longctx {name}: {words}" for name, words in describe_sweep(run).items()]
    return [*lines, f"longctx run: {run.run_id} in {run.output_root}"]


def after_record(run: RunDescription, results: RecordLog) -> None:
    """The Markdown report after every record (a crash leaves the points measured so far)."""
    if run.placement.worker is not None:  # under xdist the controller writes the reports
        return
    write_markdown(run.run_dir / MARKDOWN, results.all_records(), title=_title(run))


def _title(run: RunDescription) -> str:
    return f"Long-context sweep {run.run_id} ({run.plan.profile.name})"


def finish(config: pytest.Config, run: Run) -> None:
    """Runs before pytest-benchmark saves and before pytest-html writes its page."""
    if run.worker is not None or not (run.results.written or run.results.resumed):
        return
    records = run.results.all_records()
    written = write_reports(
        records,
        run.run_dir,
        title=_title(run.description),
        gate=gate_report_view(run, records),
        html=False,  # pytest-html writes report.html, with its table of the session's tests
        plots=run.settings.plots,
    )
    run.reports.plot_paths = [
        path for path in written if path.suffix == ".png" and path.name != GATE_PLOT
    ]
    hand_to_pytest_benchmark(config, records)


def gate_report_view(run: Run, records: list[Record]) -> gate_report.GateView | None:
    """The gate as the session's reports show it: the lengths this session selected."""
    state = run.reports.gate
    if state is None:
        return None
    return gate_report.build_view(
        state.baseline,
        records,
        state.tolerances,
        level=state.level,
        lengths={point.length for point in run.selected_points},
        force=run.settings.baseline_force,
        baseline_label=str(run.settings.baseline),
        tolerance_source=state.tolerance_source,
    )


def _gate_view(run: Run, records: list[Record]) -> gate_report.GateView | None:
    """The gate with the chart :func:`finish` drew, for pytest-html's summary."""
    gate = gate_report_view(run, records)
    chart = run.run_dir / GATE_PLOT
    if gate is None or not chart.is_file():
        return gate
    return gate.with_plot(chart)


def write_index(run: RunDescription, results: RecordLog) -> None:
    """After the pages are written: the output root's list of runs, this one included."""
    if run.placement.worker is None and (results.written or results.resumed):
        write_run_index(run.output_root)


def hand_to_pytest_benchmark(config: pytest.Config, records: list[Record]) -> None:
    """The sweep's benchmarks into pytest-benchmark's session, before it saves and compares.

    pytest-benchmark writes ``--benchmark-json``, stores ``--benchmark-save``/``-autosave``,
    compares (``--benchmark-compare``, ``--benchmark-compare-fail``) and prints its table only
    for the benchmarks its session holds; a sweep times none through its fixture, and there is
    no public hook to add one. This is the one seam: the sweep's benchmarks are appended to
    ``BenchmarkSession.benchmarks`` as the fixture would append them, as pytest-benchmark's own
    ``Metadata`` (``tests/e2e/test_benchmark_history.py`` holds it to the installed version).
    Under pytest-xdist pytest-benchmark disables its fixture everywhere; the controller, the
    one process that holds every worker's records, hands them over, and it saves them as usual.
    ``--benchmark-disable`` keeps them out.
    """
    session = getattr(config, "_benchmarksession", None)
    if session is None or not isinstance(getattr(session, "benchmarks", None), list):
        return
    if config.getoption("benchmark_disable", False) and not config.getoption(
        "benchmark_enable", False
    ):
        return
    session.benchmarks.extend(benchmark.metadata() for benchmark in sweep_benchmarks(records))


def terminal_summary(terminalreporter, run: Run, starts: Sequence[dict]) -> None:  # noqa: ANN001
    """The sweep's lines after pytest's own: problems, the capacity check, the server's
    starts (``starts``, the lifecycle's), the gate, and the results table."""
    for problem in run.reports.problems + run.findings.problems:
        terminalreporter.write_line(f"pytest-longctx: {problem}", yellow=True)
    if run.findings.capacity_check is not None:
        terminalreporter.write_line(
            f"pytest-longctx capacity: {run.findings.capacity_check.describe()}",
            red=not run.findings.capacity_check.agrees,
        )
    if len(starts) > 1:
        causes = "; ".join(
            f"#{start['index']} after {start['cause']}" for start in starts if start.get("cause")
        )
        terminalreporter.write_line(
            f"pytest-longctx: the server was started {len(starts)} times: {causes}",
            yellow=True,
        )
    for line in gate_items.summary_lines(run, starts):
        terminalreporter.write_line(f"pytest-longctx gate: {line}", yellow=True)
    if not run.results.written and not run.results.resumed:
        return
    terminalreporter.section("long-context sweep")
    records = run.results.all_records()
    if any(record.cache_state == "cold" for record in records):
        terminalreporter.write_line(render_terminal_table(records))
    for workload in report_sections():
        table = workload.terminal_table(records)
        if table is not None:
            terminalreporter.write_line("")
            terminalreporter.write_line(workload.title)
            terminalreporter.write_line(table)
    answers = answer_counts(latest_records(records))
    if answers:
        wrong = answers.get("wrong", 0)
        terminalreporter.write_line(
            f"fidelity: {wrong} wrong answer(s) of {sum(answers.values())} point(s) "
            f"({format_answers(answers)})",
            red=bool(wrong),
        )
    for reason, count in unchecked_reasons(latest_records(records)).items():
        terminalreporter.write_line(f"fidelity not checked at {count} point(s): {reason}")
    terminalreporter.write_line(f"results: {run.results.path}")
    terminalreporter.write_line(
        f"reports: {run.run_dir} (report.md, report.html, benchmark.json, plots)"
    )


@dataclass(frozen=True)
class HtmlTitle:
    """Registered per session: pytest-html's title hook gets no config to find the run by."""

    title: str

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_report_title(self, report) -> None:  # noqa: ANN001 - pytest-html's
        report.title = self.title


def html_table_header(cells: list[str]) -> None:
    cells[2:2] = html_report.table_header_cells()


def html_table_row(report: pytest.TestReport, cells: list[str]) -> None:
    data = getattr(report, REPORT_ATTRIBUTE, None)
    cells[2:2] = html_report.table_row_cells(Record.from_json(data) if data else None)


def html_summary(run: Run, prefix: list[str]) -> None:
    if not (run.results.written or run.results.resumed):
        return
    records = run.results.all_records()
    prefix.append(html_report.summary_fragment(records, run.reports.plot_paths))
    gate = _gate_view(run, records)
    if gate is not None:
        prefix.append(gate_report.html_fragment(gate))
