"""Which sessions write a run folder: those that select sweep points, and only those."""

from __future__ import annotations

import pytest
from longctx_testing import SWEEP_TEST, records_of, run_folder

#: Launch mode without vLLM: the launch command is swapped, through the plugin's own hook, for
#: a process that exits at once, so every item errors in well under a second.
SERVER_THAT_EXITS = """
import sys
from pytest_longctx.serving.vllm_command import ServerCommand

def pytest_longctx_server_command(config, plan, command):
    argv = list(command.argv)
    where = argv.index("--host")
    return ServerCommand(
        (sys.executable, "-c", "import sys; sys.exit(3)", *argv[where:]), command.env
    )
"""


def test_a_session_without_sweep_points_writes_no_run_folder(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nlongctx_profile = cpu-tiny\n")
    pytester.makepyfile(test_plain="def test_nothing_to_measure():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "reports").exists() or not any(
        (pytester.path / "reports").iterdir()
    )
    assert "Generated html report" not in result.stdout.str()


def test_a_sweep_without_ini_keys_gets_its_html_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(SERVER_THAT_EXITS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-to=2Ki")
    result.assert_outcomes(errors=2)
    records = records_of(pytester.path / "reports")
    assert [r.outcome for r in records] == ["error", "error"]
    assert "exited while starting (exit code 3" in records[0].reason
    page = run_folder(pytester.path / "reports") / "report.html"
    assert page.is_file()
    assert "test_prefill_decode[len=2Ki-rep=0]" in page.read_text()


def test_a_server_left_by_an_earlier_run_is_named(pytester: pytest.Pytester) -> None:
    """A server that outlived its session (its run folder says so) is named with its pid."""
    import json
    import subprocess
    import sys

    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "vllm.entrypoints.openai"],
        start_new_session=True,
    )
    try:
        earlier = pytester.path / "reports" / "20260101T000000Z-abcdef"
        earlier.mkdir(parents=True)
        (earlier / "server.json").write_text(
            json.dumps({"pid": leftover.pid, "pgid": leftover.pid, "started_at": 1.0})
        )
        pytester.makepyfile(test_sweep=SWEEP_TEST)
        pytester.makeconftest(SERVER_THAT_EXITS)
        result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-to=1Ki")
        result.assert_outcomes(errors=1)
        (record,) = records_of(pytester.path / "reports")
        expected = (
            f"a vLLM server launched by run {earlier.name} is still running (pid "
            f"{leftover.pid}, process group {leftover.pid})"
        )
        assert expected in record.reason
        assert f"kill -- -{leftover.pid}" in record.reason
        result.stdout.fnmatch_lines([f"*pytest-longctx: {expected}*"])
    finally:
        leftover.kill()
        leftover.wait()


@pytest.mark.parametrize("plots", ["on", "off"])
def test_plots_off_leaves_the_reports_without_figures(
    pytester: pytest.Pytester,
    fake_vllm,
    plots: str,  # noqa: ANN001
) -> None:
    """``--longctx-plots=off``: the same records and reports, no PNG drawn and none named."""
    from longctx_testing import fake_session_args

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    args = fake_session_args(fake_vllm.url, output)
    result = pytester.runpytest(*args, "--longctx-to=2Ki", f"--longctx-plots={plots}")
    result.assert_outcomes(passed=2)
    folder = run_folder(output)
    assert len(records_of(output)) == 2
    drawn = sorted(p.name for p in folder.glob("*.png"))
    markdown = (folder / "report.md").read_text()
    page = (folder / "report.html").read_text()
    assert (folder / "benchmark.json").is_file()
    if plots == "on":
        assert {"ttft.png", "decode.png"} <= set(drawn)
        assert "![ttft](ttft.png)" in markdown
    else:
        assert drawn == []
        assert ".png" not in markdown and "ttft.png" not in page
