"""What the installed plugin costs a pytest session that has no sweep.

The plugin is a ``pytest11`` entry point, so every pytest session of its environment loads it.
In a temporary project of two ordinary tests, this times ``pytest --co -q`` with the plugin
and with it disabled (``-p no:pytest_longctx``), each in a fresh process, and prints the
medians, their difference, and which heavy modules each session imported. It also prints
``python -X importtime``'s cumulative figure for ``import pytest_longctx.plugin`` alone.

    .venv/bin/python benchmarks/bench_plugin_import.py              # 7 sessions each
    .venv/bin/python benchmarks/bench_plugin_import.py --runs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WITH, WITHOUT = "with the plugin", "without (-p no:pytest_longctx)"
HEAVY = ("numpy", "httpx", "httpcore", "matplotlib", "pytest_benchmark", "pytest_html")

ORDINARY = f"""
import sys


def test_one():
    assert 1 + 1 == 2


def test_two():
    print("IMPORTED", sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def session_seconds(project: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", *args],
        cwd=project,
        env=_env(),
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def imported(project: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", *args],
        cwd=project,
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.split("IMPORTED ", 1)[1].splitlines()[0]


def plugin_import_us() -> int:
    """``-X importtime``'s cumulative microseconds of ``pytest_longctx.plugin`` (pytest first,
    so its own import is not counted)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import pytest; import pytest_longctx.plugin"],
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    for line in done.stderr.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) == 3 and parts[2] == "pytest_longctx.plugin":
            return int(parts[1])
    raise RuntimeError("pytest_longctx.plugin not in -X importtime's output")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="sessions of each kind (default 7)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        (project / "test_ordinary.py").write_text(ORDINARY)
        (project / "pytest.ini").write_text("[pytest]\n")
        kinds = {WITH: (), WITHOUT: ("-p", "no:pytest_longctx")}
        for args in kinds.values():  # warm the file cache and the bytecode once
            session_seconds(project, *args)
        times: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(options.runs):  # interleaved, so a busy host's swings hit both alike
            for name, args in kinds.items():
                times[name].append(session_seconds(project, *args))
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, args in kinds.items():
            print(
                f"{name:<32} median {medians[name]:.3f} s over {options.runs} sessions "
                f"(min {min(times[name]):.3f}, max {max(times[name]):.3f}); "
                f"imports {imported(project, *args)}"
            )
        difference = medians[WITH] - medians[WITHOUT]
        print(f"{'the plugin adds':<32} {difference * 1000:+.0f} ms per session without a sweep")
    alone = plugin_import_us() / 1000
    print(f"{'import pytest_longctx.plugin':<32} {alone:.0f} ms (-X importtime, after pytest)")


if __name__ == "__main__":
    main(sys.argv[1:])
