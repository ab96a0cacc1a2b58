"""pytest-longctx: hooks and options only; behaviour lives in the modules they call."""

from __future__ import annotations

import pytest

from pytest_longctx.plan.sweep import SLOW_MARK, VERY_SLOW_MARK, PlanError, build_plan
from pytest_longctx.profiles import ProfileError, load_profile
from pytest_longctx.session import gate_items, hookspecs, recorder, selection, workers
from pytest_longctx.session import items as sweep
from pytest_longctx.session import outputs as reporting
from pytest_longctx.session import server as serving
from pytest_longctx.session.options import OPTIONS, attach_resume_value, read_settings
from pytest_longctx.session.run import ResumeError, Run
from pytest_longctx.session.signals import SessionSignals
from pytest_longctx.session.stash import COMPARISONS_KEY, RUN_KEY

pytest_plugins = ("pytest_longctx.session.live_progress", "pytest_longctx.session.fixtures")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("longctx", "long-context serving sweep (pytest-longctx)")
    for spec in OPTIONS:
        if spec.flag:
            group.addoption(
                f"--{spec.name}",
                action="store_true",
                default=False,
                dest=spec.dest,
                help=spec.help.replace("%", "%%"),
            )
        else:
            group.addoption(
                f"--{spec.name}",
                action="append" if spec.multiple else "store",
                default=None,
                dest=spec.dest,
                metavar=spec.metavar,
                help=spec.help.replace("%", "%%"),
            )
        if spec.ini:
            parser.addini(spec.dest, spec.help, type="bool" if spec.flag else "string")
    group.addoption(
        "--longctx-resume",
        nargs="?",
        const="latest",
        default=None,
        dest="longctx_resume",
        metavar="RUN_ID",
        help="continue a run: the latest, or RUN_ID given attached (--longctx-resume=RUN_ID); "
        "points with a passed record are reported from it, everything else is measured",
    )


def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    attach_resume_value(args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "longctx(len, rep): a sweep point (prompt length, pass)")
    config.addinivalue_line("markers", f"{SLOW_MARK}: a length the profile calls slow (minutes)")
    config.addinivalue_line("markers", f"{VERY_SLOW_MARK}: a length the profile calls very slow")
    config.addinivalue_line("markers", "longctx_regression(len): a baseline comparison item")
    try:
        comparisons = selection.translate_options(config)
        settings = read_settings(config)
        plan = build_plan(settings, load_profile(settings.profile))
        run = Run.create(settings, plan, config.rootpath, workers.run_from_controller(config))
        run.servers = workers.split(config, run)
        run.worker = workers.worker_id(config)
        run.slot = workers.own_slot(config, run)
        run.started_at = workers.session_started_at(config)
        serving.check_api_key_env(run)
        gate_items.configure(run)
    except (
        selection.SelectionError,
        ProfileError,
        PlanError,
        ResumeError,
        serving.ApiKeyError,
    ) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[COMPARISONS_KEY] = comparisons
    config.stash[RUN_KEY] = run
    reporting.configure_outputs(config, run)
    if settings.plan_only:
        workers.keep_plan_serial(config)
    elif workers.planned_workers(config):
        config.pluginmanager.register(workers.Controller(config, run), "longctx-controller")
    if not settings.plan_only:
        run.signals = SessionSignals()
        run.signals.install()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    sweep.parametrize(metafunc)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    sweep.arrange(config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    if RUN_KEY in session.config.stash and session.config.stash[RUN_KEY].settings.plan_only:
        sweep.print_plan(session)
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    recorder.on_item_start(item)
    result = yield
    recorder.on_item_end(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    recorder.on_report(item, call, report)
    return report


# Around every other implementation: before pytest-benchmark saves its JSON (the sweep's
# points go into the user's --benchmark-json) and pytest-html writes the page with the plots.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    recorder.record_interrupted(session.config)
    reporting.finish(session.config)
    result = yield
    reporting.write_index(session.config)  # after pytest-html's page: the index links it
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    sweep.shutdown(config)
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.signals is not None:
        run.signals.restore()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    reporting.terminal_summary(terminalreporter, config)


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_header(cells: list[str]) -> None:
    reporting.html_table_header(cells)


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_row(report: pytest.TestReport, cells: list[str]) -> None:
    reporting.html_table_row(report, cells)


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(
    prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
) -> None:
    reporting.html_summary(session.config, prefix)


@pytest.hookimpl(optionalhook=True)
def pytest_metadata(metadata: dict, config: pytest.Config) -> None:
    reporting.describe_environment(config, metadata)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: list, output_json: dict
) -> None:
    reporting.extend_benchmark_json(config, output_json)
