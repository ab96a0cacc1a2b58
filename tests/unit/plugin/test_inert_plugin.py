"""Installed, the plugin loads in every pytest session of its environment; a session that
collects no sweep item must be exactly what it would be without it."""

from __future__ import annotations

import ast
import re

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import SWEEP_TEST

#: An ordinary project's tests, which look at what a plugin could have changed.
ORDINARY = """
import signal

import pytest


def test_signals_are_pythons_own(pytestconfig):
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


def test_no_other_plugins_option_was_set(pytestconfig):
    assert getattr(pytestconfig.option, "htmlpath", None) is None
    assert not any(
        type(plugin).__name__.endswith("Report") and hasattr(plugin, "_report_path")
        for _, plugin in pytestconfig.pluginmanager.list_name_plugin()
    )


@pytest.mark.slowish
def test_marked():
    pass
"""

INI = "[pytest]\nmarkers =\n    slowish: a mark of the project's own\n"


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("seconds",)}


def test_a_session_without_a_sweep_is_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ordinary=ORDINARY)
    pytester.makeini(INI)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert not (pytester.path / "reports").exists()
    said = [line for line in result.outlines if "longctx" in line]
    assert [line for line in said if not line.startswith("plugins:")] == []


def test_mark_and_keyword_expressions_are_not_rewritten(pytester: pytest.Pytester) -> None:
    """The same -m/-k select the same tests with the plugin as without it."""
    pytester.makepyfile(test_ordinary=ORDINARY)
    pytester.makeini(INI)
    for args in (("-m", "slowish"), ("-k", "marked or signals"), ("-m", "not slowish")):
        with_plugin = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        without = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "no:pytest_longctx", *args
        )
        assert _outcomes(with_plugin) == _outcomes(without), args
    # A sweep comparison means nothing to a session without a sweep: pytest's own answer.
    with_plugin = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "len<=1Ki")
    without = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:pytest_longctx", "-m", "len<=1Ki"
    )
    assert with_plugin.ret == without.ret != 0
    assert not (pytester.path / "reports").exists()


def test_under_xdist_a_session_without_a_sweep_is_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ordinary=ORDINARY)
    pytester.makeini(INI)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=3)
    assert not (pytester.path / "reports").exists()


#: Prints which heavy modules the session imported: the measurement's HTTP client and numpy,
#: the reports' plotting, and the sweep's own session modules.
IMPORTS = """
import sys

WATCHED = (
    "numpy", "httpx", "httpcore", "matplotlib",
    "pytest_longctx.session.sweep_session",
    "pytest_longctx.measure.measurement", "pytest_longctx.client", "pytest_longctx.reporting",
)


def test_imports():
    print("IMPORTED", sorted(name for name in WATCHED if name in sys.modules))
"""


def test_a_session_without_a_sweep_imports_no_measurement(pytester: pytest.Pytester) -> None:
    """The plugin loads in every session: without a sweep it adds none of the modules that
    measure and report (what other installed plugins import is theirs, and the same both
    ways)."""
    pytester.makepyfile(test_ordinary=IMPORTS)
    pytester.makeini(INI)

    def imported(*args: str) -> list[str]:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *args)
        said = result.stdout.str()
        assert result.ret == 0, said + result.stderr.str()
        return ast.literal_eval(said.split("IMPORTED ", 1)[1].splitlines()[0])

    with_plugin = imported()
    assert "numpy" not in with_plugin and "httpx" not in with_plugin, with_plugin
    assert with_plugin == imported("-p", "no:pytest_longctx"), with_plugin
    # the fixtures are there all the same (a test of the user's own may ask for them)
    listed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    assert "longctx_measure" in listed.stdout.str()


#: Each phase's SIGTERM, SIGHUP and SIGINT handlers, as whether each is Python's own (SIG_DFL;
#: ``default_int_handler`` for SIGINT, which pytest leaves alone).
SIGNALS_CONFTEST = """
import signal

import pytest

OWN = {
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGINT: signal.default_int_handler,
}


def state():
    return " ".join(f"{s.name}={signal.getsignal(s) is own}" for s, own in OWN.items())


def pytest_sessionstart(session):
    print("SIGNALS sessionstart", state())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    print("SIGNALS collected", state())  # the sweep's items are known, not yet arranged


def pytest_runtest_call(item):
    print("SIGNALS during", state())


def pytest_unconfigure(config):
    print("SIGNALS after", state())
"""


@pytest.mark.usefixtures("default_signals")
def test_the_sweep_holds_the_signals_only_while_it_runs(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """SIGTERM ends a sweep like Ctrl-C; before the sweep and after it, Python's own."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(SIGNALS_CONFTEST)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-s",
        f"--longctx-url={fake_vllm.url}",
        "--longctx-to=1Ki",
    )
    said = result.stdout.str() + result.stderr.str()
    outcomes = _outcomes(result)
    outcomes.pop("deselected", None)  # the gate's item, without a baseline
    assert outcomes == {"passed": 1}, said
    phases = dict(re.findall(r"SIGNALS (\w+) (.*)", result.stdout.str()))
    own = "SIGTERM=True SIGHUP=True SIGINT=True"
    assert phases == {
        "sessionstart": own,
        "collected": own,
        "during": "SIGTERM=False SIGHUP=False SIGINT=True",
        "after": own,
    }, said
    assert (pytester.path / "reports").is_dir(), said
