"""The plugin as pip installs it: its wheel, built from a copy of the tracked sources, and a
fresh venv holding that wheel; the shipped sweep run there from an empty folder. Import the
fixtures into a test module to use them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from longctx_testing import ATTACHED_TIMEOUT_S, REPO, SHIPPED_SWEEP


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
