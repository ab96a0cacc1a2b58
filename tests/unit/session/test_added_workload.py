"""A workload added from outside the package: one folder of its own and one registration (an
entry point), no file of the package changed. It is accepted by ``--longctx-workload``, its
points are its own, its records name it and the report shell writes its section. Against the
stand-in server: what is tested is the seam, not a measurement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_vllm import Behaviour, FakeVLLMProcess
from longctx_testing import SWEEP_TEST, fake_session_args, records_of, run_folder

#: The added workload: a cold prefill under a name of its own, with a report section that
#: counts its records.
HOME = '''
from pytest_longctx.measure.measurement import measure_point
from pytest_longctx.workloads.workload import ReportSection, Workload


def _markdown(records):
    mine = [r for r in records if r.cache_state == "echo"]
    return ["## Echo", "", f"{len(mine)} echo points measured"] if mine else []


class EchoWorkload(Workload):
    name = "echo"
    report = ReportSection(
        "echo: a prefill under its own name", _markdown, lambda records: "",
        lambda records: None, (),
    )

    def measure(self, step):
        result = measure_point(
            step.client, step.server, step.point, step.prompt, step.setup.settings, **step.hooks
        )
        step.memory.note_sent(step.point)
        return result
'''


def _added_workload(folder: Path) -> Path:
    """``folder`` on the path holds the workload's module and the one registration that names
    it, as an installed distribution's metadata does."""
    folder.mkdir()
    (folder / "longctx_echo.py").write_text(HOME)
    metadata = folder / "longctx_echo-0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: longctx-echo\nVersion: 0.1\n")
    (metadata / "entry_points.txt").write_text(
        "[pytest_longctx.workloads]\necho = longctx_echo:EchoWorkload\n"
    )
    return folder


def test_a_workload_from_its_own_folder_runs_against_the_stand_in(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _added_workload(pytester.path / "added")
    path = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    root = pytester.path / "reports"
    behaviour = Behaviour(first_token_delay_s=0.05, token_delay_s=0.01)
    with FakeVLLMProcess(behaviour) as fake:
        result = pytester.runpytest_subprocess(
            *fake_session_args(fake.url, root),
            "--longctx-to=2Ki",
            "--longctx-workload=echo",
            "--longctx-progress=off",
            "-p",
            "no:randomly",
            "-v",
        )
    result.assert_outcomes(passed=2)
    records = records_of(root)
    assert [(r.length, r.cache_state, r.outcome) for r in records] == [
        (1024, "echo", "passed"),
        (2048, "echo", "passed"),
    ]
    assert all(r.figures["ttft"] > 0 for r in records)
    report = (run_folder(root) / "report.md").read_text()
    assert "## Echo" in report and "2 echo points measured" in report


def test_without_its_registration_the_workload_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess("--longctx-plan", "--longctx-workload=echo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--longctx-workload=echo: expected a comma-separated list*"])
