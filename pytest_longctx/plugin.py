"""pytest-longctx: options and the hooks that decide whether a session has a sweep at all.

Everything a sweep does lives in :class:`~pytest_longctx.session.sweep_session.SweepSession`,
registered only once the session collects a sweep item or asks for ``--longctx-plan``; under
pytest-xdist the controller's part is registered when distribution is asked for and starts the
sweep when the workers' collections hold its points. A session with neither is left as it was,
and imports only what reads and checks the options: the modules that measure and report (the
HTTP client, numpy, pytest-benchmark's session) load with the sweep, as pytest-xdist imports
its ``DSession`` only when distribution is asked for.
"""

from __future__ import annotations

from typing import Literal

import pytest

from pytest_longctx.plan.points import SLOW_MARK, VERY_SLOW_MARK
from pytest_longctx.session import activation, hookspecs, workers
from pytest_longctx.session.option_parsing import OPTIONS, asks_for_sweep
from pytest_longctx.workloads import REGISTERED

pytest_plugins = ("pytest_longctx.session.fixtures",)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("longctx", "long-context serving sweep (pytest-longctx)")
    for spec in OPTIONS:
        if spec.flag:
            switches = [(spec.name, "store_true", spec.help)]
            if spec.negation:
                off = f"turn --{spec.name} off where the ini file turns it on"
                switches.append((spec.negation, "store_false", off))
            for name, action, text in switches:
                group.addoption(
                    f"--{name}",
                    action=action,
                    default=spec.default,
                    dest=spec.dest,
                    help=text.replace("%", "%%"),
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
            # default None: getini tells a key the project set from one it did not
            ini_type: Literal["bool", "linelist", "string"] = (
                "bool" if spec.flag else "linelist" if spec.multiple else "string"
            )
            parser.addini(spec.dest, spec.help, type=ini_type, default=None)
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


RESUME_FLAG = "--longctx-resume"


def attach_resume_value(args: list[str]) -> None:
    """Give a bare ``--longctx-resume`` its value, ``latest``, in place.

    The option takes an optional run id, and argparse would read the next argument as that
    id: ``--longctx-resume tests/test_sweep.py`` would resume a run named after the test
    file and collect everything else. A run id is only ever given attached (``=RUN_ID``).
    """
    for index, arg in enumerate(args):
        if arg == "--":
            return
        if arg == RESUME_FLAG:
            args[index] = f"{RESUME_FLAG}=latest"


def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    attach_resume_value(args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "longctx(len, rep[, warm][, interference][, conc]): a sweep point (prompt length, "
        "pass, follow-up question, background streams, requests sent at once)",
    )
    for workload in REGISTERED:
        if workload.mark is not None:
            config.addinivalue_line("markers", f"{workload.mark}: {workload.mark_help}")
    config.addinivalue_line("markers", f"{SLOW_MARK}: a length the profile calls slow (minutes)")
    config.addinivalue_line("markers", f"{VERY_SLOW_MARK}: a length the profile calls very slow")
    config.addinivalue_line("markers", "longctx_regression(len): a baseline comparison item")
    prepared = activation.prepare(config)
    if prepared.run.settings.plan_only:
        workers.keep_plan_serial(config)
        activation.activate(config)
    elif workers.planned_workers(config):
        from pytest_longctx.session.controller import Controller  # the sweep's weight, with it

        config.pluginmanager.register(Controller(config, prepared.run), "longctx-controller")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Profile, server and lengths, where the session asks for the sweep by name or option:
    the header is printed before collection, when whether a sweep runs is not yet known."""
    if not asks_for_sweep(config):
        return None  # a sweep collected later prints it after collection (late_header)
    from pytest_longctx.session import sweep_session  # a session that names the sweep

    return sweep_session.header(config, activation.prepared(config).run)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if activation.uses_the_sweep(metafunc.fixturenames):
        activation.activate(metafunc.config).parametrize(metafunc)
