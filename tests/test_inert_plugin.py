"""Installed, the plugin loads in every pytest session of its environment; a session that
collects no sweep item must be exactly what it would be without it."""

from __future__ import annotations

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


def test_the_sweep_holds_the_signals_only_while_it_runs(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """SIGTERM ends a sweep like Ctrl-C; before the sweep and after it, Python's own."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(
        """
import signal

import pytest

seen = {}


def pytest_collection_finish(session):
    seen["collected"] = signal.getsignal(signal.SIGTERM)


def pytest_runtest_call(item):
    seen["during"] = signal.getsignal(signal.SIGTERM)


def pytest_unconfigure(config):
    after = signal.getsignal(signal.SIGTERM)
    print("SIGNALS", seen["during"] is not signal.SIG_DFL, after is signal.SIG_DFL)
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-s", f"--longctx-url={fake_vllm.url}", "--longctx-to=1Ki"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*SIGNALS True True*"])
    assert (pytester.path / "reports").is_dir()
