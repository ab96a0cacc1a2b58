"""pip install pytest-longctx, then one command in any repo, on real vLLM: the installed suite
measures the suite's shared cpu-tiny server from an empty folder, and ``calibrate`` runs it
there. The wheel and the plan from an empty folder: tests/unit/project/test_packaging.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from installed_wheel import installed, run_in_empty_folder, wheel  # noqa: F401 - the fixtures
from longctx_testing import ATTACHED_TIMEOUT_S, records_of

from pytest_longctx.core.records import read_records

pytestmark = pytest.mark.vllm

SUITE = "pytest_longctx.suite"


def test_a_real_sweep_from_an_empty_folder(
    installed: Path,  # noqa: F811
    tmp_path: Path,
    vllm_url: str,
) -> None:
    """The installed suite measures real vLLM (the suite's shared server, attached)."""
    folder = tmp_path / "some-serving-repo"
    done = run_in_empty_folder(installed, folder, "--longctx-to=2Ki", f"--longctx-url={vllm_url}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
    records = records_of(folder / "reports")
    assert [(r.length, r.outcome) for r in records] == [(1024, "passed"), (2048, "passed")]
    # the installed suite's items (pytest names them relative to their package folder)
    assert [r.nodeid for r in records] == [
        "test_sweep.py::test_prefill_decode[len=1Ki-rep=0]",
        "test_sweep.py::test_prefill_decode[len=2Ki-rep=0]",
    ]


def test_calibrate_runs_the_shipped_sweep_from_an_empty_folder(
    installed: Path,  # noqa: F811
    tmp_path: Path,
    vllm_url: str,
) -> None:
    folder = tmp_path / "some-serving-repo"
    folder.mkdir()
    stored = tmp_path / "calibrated.jsonl"
    done = subprocess.run(
        [
            str(installed),
            "-m",
            "pytest_longctx",
            "calibrate",
            "--sessions=2",
            f"--output={stored}",
            "--",
            f"--longctx-url={vllm_url}",
            "--longctx-to=1Ki",
            "--longctx-repeats=2",
            "--longctx-progress=off",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=ATTACHED_TIMEOUT_S,
        # the wheel's package, not a checkout on the path
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "session 1/2: " in done.stdout and "session 2/2: " in done.stdout
    assert f"-q --pyargs {SUITE} --longctx-output=" in done.stdout
    assert "calibration over 2 sessions, level 0.01" in done.stdout
    assert "proposed tolerances: " in done.stdout
    assert [r.length for r in read_records(stored).records] == [1024] * 4
    # The runs went to a temporary folder: nothing was written here but the empty folder
    # pytest-benchmark makes in any session.
    assert [path.name for path in folder.iterdir()] in ([], [".benchmarks"])
    saved = folder / ".benchmarks"
    assert not saved.exists() or not any(saved.iterdir())
