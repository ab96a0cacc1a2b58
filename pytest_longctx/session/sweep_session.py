"""The sweep's part of a pytest session: one object, registered only once there is a sweep.

:func:`pytest_longctx.session.activation.activate` registers it (see there for when); its
hooks act on the run it owns, and the plugin's fixtures hand a sweep item what its methods
give (the server, the client, prompts, the measurement).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from pytest_longctx.campaign import (
    budgets,
    dispatch,
    fidelity,
    lifecycle,
    prompting,
    server,
)
from pytest_longctx.campaign.run import Run
from pytest_longctx.campaign.signals import SessionSignals
from pytest_longctx.client import CompletionClient
from pytest_longctx.core.records import Record
from pytest_longctx.measure.measurement import (
    PointMeasurement,
    UnverifiedPoint,
    client_for,
)
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan import capacity_check, versions
from pytest_longctx.plan.points import Point
from pytest_longctx.profiles import hardware
from pytest_longctx.prompts import Prompt, PromptBuilder, PromptError
from pytest_longctx.serving.vllm_command import FlagError
from pytest_longctx.session import items as sweep_items
from pytest_longctx.session import (
    live_progress,
    outputs,
    recorder,
    selection,
    workers,
)
from pytest_longctx.session.hookspecs import campaign_hooks
from pytest_longctx.session.live_progress import ControllerProgress, SessionProgress
from pytest_longctx.session.stash import HEADER_SHOWN_KEY, MEASUREMENT_KEY
from pytest_longctx.workloads import capacity_table, planned, sized_for, workload_of
from pytest_longctx.workloads.concurrency import LevelsMeasured


def skip(exc: lifecycle.PointSkipped) -> BaseException:
    """A point the lifecycle will not measure, as a skip that carries its class to the record
    (and, handed back, the mark the controller reads)."""
    skipped = pytest.skip.Exception(str(exc), _use_item_location=True)
    skipped.failure_class = exc.failure_class  # type: ignore[attr-defined]
    skipped.evidence = exc.evidence  # type: ignore[attr-defined]
    if exc.handed_back:
        skipped.handed_back = True  # type: ignore[attr-defined]
    return skipped


def failed(exc: ServerError) -> BaseException:
    """A fixture's failure (``pytest.fail``) that carries the server error's class."""
    failure = pytest.fail.Exception(str(exc), pytrace=False)
    failure.failure_class = exc.failure_class  # type: ignore[attr-defined]
    failure.evidence = exc.evidence  # type: ignore[attr-defined]
    return failure


def header(config: pytest.Config, run: Run) -> list[str]:
    """The sweep's lines of pytest's header (profile, server, lengths, run), printed once."""
    config.stash[HEADER_SHOWN_KEY] = True
    return outputs.report_header(run.description)


def late_header(config: pytest.Config, run: Run) -> list[str]:
    """The header's lines for a sweep only its collection revealed (``pytest test_sweep.py``,
    no option or ini key named it): once, and only where pytest prints a header at all."""
    if config.stash.get(HEADER_SHOWN_KEY, False):
        return []
    if config.option.verbose < 0 or getattr(config.option, "no_header", False):
        return []
    return header(config, run)


class SweepSession:
    """Settings, plan, records, server and outputs of one session's sweep; the hooks that
    act on them are its methods."""

    def __init__(self, config: pytest.Config, run: Run, chosen: selection.Selection) -> None:
        self.config = config
        self.run = run
        #: The measured server's lifecycle: its one owner from first start to stop.
        self.server = lifecycle.ServerLifecycle(run, campaign_hooks(config))
        #: The concurrency levels measured so far, per length (they outlive a server start).
        self.levels = LevelsMeasured()
        self.selection = chosen
        #: Progress inside points (display, progress.json, the ETA) once the sweep starts,
        #: and on an xdist controller the follower of its workers' progress.
        self.progress: SessionProgress | None = None
        self.follower: ControllerProgress | None = None
        self.session: pytest.Session | None = None
        self.html_columns = False
        #: The item whose point the lifecycle has made measurable: its prompt and its
        #: measurement both need that, once.
        self.ready_item: pytest.Item | None = None

    @property
    def on_controller(self) -> bool:
        return bool(workers.planned_workers(self.config))

    def start(self, session: pytest.Session | None) -> None:
        """The sweep is collected: pytest reads the rewritten ``-m``/``-k`` from here on, and
        points are watched. Signals and the page wait for selected points."""
        self.session = session
        selection.apply_selection(self.config, self.selection)
        self.progress, self.follower = live_progress.start(
            self.config, self.run, self.on_controller
        )
        if self.on_controller and session is not None:  # xdist: the workers collected
            lines = late_header(self.config, self.run)
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                for line in lines:
                    reporter.write_line(line)
            self.points_selected(session)

    def points_selected(self, session: pytest.Session) -> None:
        """Points will be measured: the span of the sweep starts."""
        if not self.run.selected_points or self.run.settings.plan_only:
            return
        outputs.open_html_page(session, self.run.description)
        if self.run.sweep.signals is None:
            self.run.sweep.signals = SessionSignals()
            self.run.sweep.signals.install()

    def stop_signals(self) -> None:
        if self.run.sweep.signals is not None:
            self.run.sweep.signals.restore()

    # -- what the fixtures hand a sweep item (session/fixtures.py) --------------------------

    def start_server(self) -> ServerInfo:
        """The server, launched from the profile or attached by URL, warmed up; a failure
        fails the item that asked for it, with the reason."""
        try:
            info = self.server.start()
            self.server.warm_up(info)
        except FlagError as exc:  # one usage error, not one failure per item
            self.server.stop()
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
        except ServerError as exc:
            self.server.stop()
            raise failed(exc) from None
        return info

    def stop_server(self) -> None:
        self.server.stop()

    def client(self, info: ServerInfo) -> AbstractContextManager[CompletionClient]:
        return client_for(info, self.run.settings.tcp_keepalive_s)

    def prompt_builder(self, info: ServerInfo) -> PromptBuilder:
        builder = self.server.prompt_builder(info)
        if self.run.settings.prompt_format == "text":
            try:
                builder.check_text_prompts()
            except PromptError as exc:  # one usage error, not one failure per item
                pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
        return builder

    def prompt(self, item: pytest.Item, builder: PromptBuilder, point: Point) -> Prompt:
        self.ready(item, point)  # the server may build it
        return prompting.build_prompt(self.run.description, builder, point)

    def ready(self, item: pytest.Item, point: Point) -> None:
        """The lifecycle's :meth:`~lifecycle.ServerLifecycle.before_point`, once per item,
        whichever of its fixtures asks first; a point it will not measure skipped."""
        if self.ready_item is item:
            return
        try:
            self.server.before_point(point)
        except lifecycle.PointSkipped as exc:
            raise skip(exc) from None
        self.ready_item = item

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.ready_item = None  # each setup (a rerun's too) asks the lifecycle again

    def recorded_measurement(self, record: Record) -> Callable[[Prompt], PointMeasurement]:
        """A resumed point's measurement: its record, not a request."""
        return lambda prompt: PointMeasurement.from_record(record)

    def measurement(
        self, item: pytest.Item, point: Point, info: ServerInfo, client: CompletionClient
    ) -> Callable[[Prompt], PointMeasurement]:
        """Measures one prompt of ``point``; what it produced is kept on ``item`` for its
        record, figures included when the point fails."""
        self.ready(item, point)

        def watch() -> Any:
            if not workload_of(point).watched:  # e.g. a level's c requests at once
                return None
            return live_progress.watch(self.progress, info, point)

        def run_measurement(prompt: Prompt) -> PointMeasurement:
            try:
                result = dispatch.measure_judged(
                    self.server, self.levels, client, info, point, prompt, watch
                )
            except (UnverifiedPoint, fidelity.WrongAnswer) as exc:
                item.stash[MEASUREMENT_KEY] = exc.measurement  # figures (and verdict) recorded
                raise
            except lifecycle.PointSkipped as exc:
                raise skip(exc) from None
            item.stash[MEASUREMENT_KEY] = result
            return result

        return run_measurement

    # -- collection ------------------------------------------------------------------------

    def parametrize(self, metafunc: pytest.Metafunc) -> None:
        """A sweep test's items: one per point, or per length for the gate's."""
        sweep_items.parametrize(metafunc, self.run, self.selection.comparisons)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        self.session = session
        sweep_items.arrange(config, self.run, self.selection.comparisons, items)
        self.points_selected(session)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        return late_header(config, self.run)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.run.settings.plan_only:
            print_plan(session, self.run)
            return True
        return None

    # -- items -----------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        recorder.on_item_start(self.run, item)
        result = yield
        recorder.on_item_end(self.run)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = yield
        recorder.on_report(self.run, item, call, report, self.server.history.starts)
        return report

    def pytest_longctx_fingerprint(self, config: pytest.Config, fingerprint: dict) -> None:
        live_progress.add_to_fingerprint(self.progress, fingerprint)

    # -- the end ---------------------------------------------------------------------------

    # Around every other implementation: before pytest-benchmark saves and compares (the
    # sweep's benchmarks are handed to it here) and pytest-html writes the page with the plots.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int):
        recorder.record_interrupted(self.config, self.run, self.server.history.starts)
        live_progress.finish(self.progress, self.follower)
        outputs.finish(self.config, self.run)
        result = yield
        # after pytest-html's page: the index links it
        outputs.write_index(self.run.description, self.run.results)
        return result

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.server.stop()
        self.stop_signals()

    @pytest.hookimpl(wrapper=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config):
        """The sweep's summary after every other one (pytest-benchmark's table included).

        pytest-benchmark's ``--benchmark-compare-fail`` raises out of its summary, which would
        end the session with a traceback and skip what follows (this summary, the index of
        runs); here it is what it means, a failed session, after pytest-benchmark's own lines.
        """
        try:
            return (yield)
        except outputs.BenchmarkRegression:
            if self.session is not None:
                self.session.exitstatus = pytest.ExitCode.TESTS_FAILED
            terminalreporter.write_line(
                "pytest-longctx: --benchmark-compare-fail: performance has regressed "
                "(see above); the session fails",
                red=True,
            )
            return None
        finally:
            outputs.terminal_summary(terminalreporter, self.run, self.server.history.starts)
            live_progress.summary(terminalreporter, self.progress)

    # -- pytest-html, pytest-metadata ------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        outputs.html_table_header(cells)
        self.html_columns = True

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        if self.html_columns:  # a page set up before the sweep was known has no such columns
            outputs.html_table_row(report, cells)

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
    ) -> None:
        outputs.html_summary(self.run, prefix)

    @pytest.hookimpl(optionalhook=True)
    def pytest_metadata(self, metadata: dict, config: pytest.Config) -> None:
        outputs.describe_environment(self.run.description, metadata)


def print_plan(session: pytest.Session, run: Run) -> None:
    """``--longctx-plan``: the points, the server command and the capacity table."""
    config = session.config
    write = config.get_terminal_writer().line
    profile = run.plan.profile
    write("")
    write(f"pytest-longctx plan: profile {profile.name} ({profile.description})")
    write(
        f"model {profile.model.source}"
        + (f" @ {profile.model.revision}" if profile.model.revision else "")
    )
    if not run.settings.url:
        write(capacity_check.planned_release(profile).describe())
        lengths = sorted({p.length for p in run.selected_points})
        for line in versions.version_findings(profile, lengths, hardware.node_versions()):
            write(line)
    write(
        f"{len(session.items)} item(s), decode {run.plan.decode_tokens} tokens per request, "
        f"order {run.plan.order}"
    )
    sized = sized_for(run.plan, run.selected_points)
    for workload in planned(run.plan):
        for line in workload.plan_lines(run.description, sized):
            write(line)
    for line in fidelity.plan_lines(run.description, run.selected_points):
        write(line)
    for line in budgets.plan_lines(run.description, run.sizing()):
        write(line)
    for item in session.items:
        point = sweep_items.point_of(item)
        length = point.length if point else sweep_items.regression_length_of(item)
        bands = run.plan.band_marks(length) if length else ()
        skip = next((m.kwargs.get("reason") for m in item.iter_markers("skip")), None)
        label = point.id if point else item.name
        extra = (f" [{bands[0]}]" if bands else "") + (f" SKIP: {skip}" if skip else "")
        write(f"  {label}{extra}")
    write("")
    write(server.describe_server(campaign_hooks(config), run.description, run.sizing()))
    table = capacity_table(sized, sorted({p.length for p in run.selected_points}))
    if table:
        write("")
        write(table)
