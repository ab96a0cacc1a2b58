"""--longctx-resume refuses what it cannot continue, before anything starts."""

from __future__ import annotations

import pytest
from longctx_testing import NO_PLOTS, SWEEP_TEST

from pytest_longctx.core.records import Record, append_record


@pytest.fixture
def earlier_run(pytester: pytest.Pytester):  # noqa: ANN201
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    run_dir = pytester.path / "reports" / "20260101T000000Z-abcdef"
    append_record(
        run_dir / "results.jsonl",
        Record(
            run_id=run_dir.name,
            nodeid="test_sweep.py::test_prefill_decode[len=1Ki-rep=0]",
            length=1024,
            repeat=0,
            outcome="passed",
            figures={"ttft": 0.1},
            prompt_tokens=1024,
            completion_tokens=32,
            fingerprint={"profile": "kimi-linear-mi355x"},
        ),
    )
    return pytester, run_dir


def usage_error(pytester: pytest.Pytester, *args: str) -> str:
    result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-output=reports", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [line for line in result.errlines if line.startswith("ERROR:")]
    return line


def test_resume_with_another_profile_is_refused(earlier_run) -> None:  # noqa: ANN001
    pytester, run_dir = earlier_run
    line = usage_error(pytester, f"--longctx-resume={run_dir.name}")
    assert "measured profile kimi-linear-mi355x; this session selects cpu-tiny" in line


def test_resume_of_a_run_that_does_not_exist(earlier_run) -> None:  # noqa: ANN001
    pytester, _ = earlier_run
    line = usage_error(pytester, "--longctx-resume=nope")
    assert "--longctx-resume=nope: no run with results at" in line
    assert "expected 'latest' or a run id" in line


def test_resume_with_the_same_profile_reports_from_the_record(earlier_run) -> None:  # noqa: ANN001
    pytester, run_dir = earlier_run
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-output=reports",
        f"--longctx-resume={run_dir.name}",
        "--longctx-profile=kimi-linear-mi355x",
        "-m",
        "len==1Ki",
        NO_PLOTS,  # the reports' words are the subject; their plots are test_reports.py's
    )
    result.assert_outcomes(passed=1)
    # Reported from its record: nothing measured (no server exists for this profile here),
    # nothing appended, and the recorded TTFT is what the reports show.
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 1
    assert "server.log" not in {p.name for p in run_dir.iterdir()}
    assert "| 1Ki | 1,024 | 1 | 0.10 |" in (run_dir / "report.md").read_text()


def test_the_bare_resume_flag_never_takes_the_next_argument(earlier_run) -> None:  # noqa: ANN001
    """``--longctx-resume test_sweep.py``: resume the latest run, collect only that file."""
    pytester, run_dir = earlier_run
    (pytester.path / "reports" / "latest").symlink_to(run_dir.name)
    pytester.makepyfile(test_other="def test_not_selected():\n    assert False\n")
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-output=reports",
        "--longctx-profile=kimi-linear-mi355x",
        "--longctx-to=1Ki",
        NO_PLOTS,
        "--longctx-resume",
        "test_sweep.py",
    )
    result.assert_outcomes(passed=1)  # test_other.py, had it been collected, would fail
