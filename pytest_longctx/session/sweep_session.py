"""The sweep's part of a pytest session: one object, registered only once there is a sweep.

pytest-longctx is a ``pytest11`` plugin, so it loads in every session of its environment.
Until a session collects a sweep item (a test using ``longctx_point`` or the gate's
``longctx_regression_length``), or asks for ``--longctx-plan``, the plugin only adds its
options, markers and fixtures: it installs no signal handler, creates no folder, changes no
option of another plugin and rewrites no ``-m``/``-k``. :func:`activate` is the one switch,
the way pytest-xdist registers its ``DSession`` only when distribution is asked for.

What the options say is still read and checked when the session is configured
(:func:`prepare`), so a bad option stops the session before collection, with or without a sweep;
reading them changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.sweep import PlanError, build_plan
from pytest_longctx.profiles import ProfileError, load_profile
from pytest_longctx.session import (
    gate_items,
    live_progress,
    outputs,
    recorder,
    selection,
    server,
    workers,
)
from pytest_longctx.session import items as sweep_items
from pytest_longctx.session.live_progress import ControllerProgress
from pytest_longctx.session.options import read_settings
from pytest_longctx.session.run import ResumeError, Run
from pytest_longctx.session.signals import SessionSignals
from pytest_longctx.session.stash import COMPARISONS_KEY, RUN_KEY


@dataclass(frozen=True)
class PreparedSweep:
    """What the options describe, read and checked at configure time; nothing started."""

    run: Run
    selection: selection.Selection


PREPARED_KEY = pytest.StashKey[PreparedSweep]()
SESSION_KEY = pytest.StashKey["SweepSession"]()
#: Set once the sweep's header lines are printed (at the start, or after collection).
HEADER_SHOWN_KEY = pytest.StashKey[bool]()


def prepare(config: pytest.Config) -> PreparedSweep:
    """Read the options into a run; a usage error naming the option for anything bad."""
    try:
        chosen = selection.read_selection(config)
        settings = read_settings(config)
        plan = build_plan(settings, load_profile(settings.profile))
        run = Run.create(settings, plan, config.rootpath, workers.run_from_controller(config))
        run.servers = workers.split(config, run)
        run.worker = workers.worker_id(config)
        run.slot = workers.own_slot(config, run)
        run.started_at = workers.session_started_at(config)
        server.check_api_key_env(run)
        gate_items.configure(run)
    except (
        selection.SelectionError,
        ProfileError,
        PlanError,
        ResumeError,
        server.ApiKeyError,
    ) as exc:
        raise pytest.UsageError(str(exc)) from None
    selection.register_markers(config, chosen)
    prepared = PreparedSweep(run, chosen)
    config.stash[PREPARED_KEY] = prepared
    return prepared


def prepared(config: pytest.Config) -> PreparedSweep:
    return config.stash[PREPARED_KEY]


def header(config: pytest.Config) -> list[str]:
    """The sweep's lines of pytest's header (profile, server, lengths, run), printed once."""
    config.stash[HEADER_SHOWN_KEY] = True
    return outputs.report_header(prepared(config).run)


def late_header(config: pytest.Config) -> list[str]:
    """The header's lines for a sweep only its collection revealed (``pytest test_sweep.py``,
    no option or ini key named it): once, and only where pytest prints a header at all."""
    if config.stash.get(HEADER_SHOWN_KEY, False):
        return []
    if config.option.verbose < 0 or getattr(config.option, "no_header", False):
        return []
    return header(config)


def active(config: pytest.Config) -> SweepSession | None:
    return config.stash.get(SESSION_KEY, None)


def activate(config: pytest.Config, session: pytest.Session | None = None) -> SweepSession:
    """Register the sweep's session object (once); from here the plugin acts."""
    current = active(config)
    if current is not None:
        return current
    ready = prepared(config)
    sweep = SweepSession(config, ready.run, ready.selection)
    config.stash[SESSION_KEY] = sweep
    config.stash[RUN_KEY] = ready.run
    config.stash[COMPARISONS_KEY] = ready.selection.comparisons
    config.pluginmanager.register(sweep, "longctx-sweep")
    sweep.start(session)
    return sweep


class SweepSession:
    """Settings, plan, records, server and outputs of one session's sweep; the hooks that
    act on them are its methods."""

    def __init__(self, config: pytest.Config, run: Run, chosen: selection.Selection) -> None:
        self.config = config
        self.run = run
        self.selection = chosen
        self.follower: ControllerProgress | None = None
        self.session: pytest.Session | None = None
        self.html_columns = False

    @property
    def on_controller(self) -> bool:
        return bool(workers.planned_workers(self.config))

    def start(self, session: pytest.Session | None) -> None:
        """The sweep is collected: pytest reads the rewritten ``-m``/``-k`` from here on, and
        points are watched. Signals and the page wait for selected points."""
        self.session = session
        selection.apply_selection(self.config, self.selection)
        self.follower = live_progress.start(self.config, self.run, self.on_controller)
        if self.on_controller and session is not None:  # xdist: the workers collected
            lines = late_header(self.config)
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                for line in lines:
                    reporter.write_line(line)
            self.points_selected(session)

    def points_selected(self, session: pytest.Session) -> None:
        """Points will be measured: the span of the sweep starts."""
        if not self.run.selected_points or self.run.settings.plan_only:
            return
        outputs.open_html_page(session, self.run)
        if self.run.signals is None:
            self.run.signals = SessionSignals()
            self.run.signals.install()

    def stop_signals(self) -> None:
        if self.run.signals is not None:
            self.run.signals.restore()

    # -- collection ------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        self.session = session
        sweep_items.arrange(config, self.run, self.selection.comparisons, items)
        self.points_selected(session)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        return late_header(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.run.settings.plan_only:
            print_plan(session, self.run)
            return True
        return None

    # -- items -----------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        recorder.on_item_start(item)
        result = yield
        recorder.on_item_end(item)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = yield
        recorder.on_report(item, call, report)
        return report

    def pytest_longctx_fingerprint(self, config: pytest.Config, fingerprint: dict) -> None:
        live_progress.add_to_fingerprint(self.run, fingerprint)

    # -- the end ---------------------------------------------------------------------------

    # Around every other implementation: before pytest-benchmark saves and compares (the
    # sweep's benchmarks are handed to it here) and pytest-html writes the page with the plots.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int):
        recorder.record_interrupted(self.config)
        live_progress.finish(self.run, self.follower)
        outputs.finish(self.config)
        result = yield
        outputs.write_index(self.config)  # after pytest-html's page: the index links it
        return result

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        server.stop(config)
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
            outputs.terminal_summary(terminalreporter, config)
            live_progress.summary(terminalreporter, self.run)

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
        outputs.html_summary(session.config, prefix)

    @pytest.hookimpl(optionalhook=True)
    def pytest_metadata(self, metadata: dict, config: pytest.Config) -> None:
        outputs.describe_environment(config, metadata)


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
    write(
        f"{len(session.items)} item(s), decode {run.plan.decode_tokens} tokens per request, "
        f"order {run.plan.order}"
    )
    if run.plan.warm:
        write(
            f"workload cold,warm: {run.plan.warm_questions} follow-up(s) after each cold point, "
            f"each its prompt exactly + {run.plan.suffix_tokens} new tokens, the prefix served "
            f"from the cache; --max-model-len and the capacity plan count length + "
            f"{run.plan.suffix_tokens} + {run.plan.decode_tokens} decode"
        )
    if run.plan.interference:
        requests, each = run.plan.background_load
        write(
            f"workload interference: each length again beside {requests} background streams "
            f"(requests of {each} tokens each, re-issued as they end), on a server of its own "
            f"with room for {requests + 1} sequences; the capacity plan counts them"
        )
    for item in session.items:
        point = sweep_items.point_of(item)
        length = point.length if point else sweep_items.regression_length_of(item)
        bands = run.plan.band_marks(length) if length else ()
        skip = next((m.kwargs.get("reason") for m in item.iter_markers("skip")), None)
        label = point.id if point else item.name
        extra = (f" [{bands[0]}]" if bands else "") + (f" SKIP: {skip}" if skip else "")
        write(f"  {label}{extra}")
    write("")
    write(server.describe_server(config, run))
    table = capacity_check.render_table(run.plan, sorted({p.length for p in run.selected_points}))
    if table:
        write("")
        write(table)
