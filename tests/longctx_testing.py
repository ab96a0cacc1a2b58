"""Helpers shared by the plugin's own tests."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_longctx.records import Record, read_records

REPO = Path(__file__).resolve().parents[1]
SWEEP_TEST = (REPO / "tests" / "test_sweep.py").read_text(encoding="utf-8")


def run_folder(output: Path) -> Path:
    latest = output / "latest"
    assert latest.is_symlink(), f"no run folder under {output}"
    return latest.resolve()


def records_of(output: Path) -> list[Record]:
    result = read_records(run_folder(output) / "results.jsonl")
    assert not result.problems, result.problems
    return list(result.records)


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_session(pytester, *args: str, url: str | None = None, timeout: float = 600):  # noqa: ANN001, ANN201
    """A pytest session in its own process, as a user runs one, writing under ``reports/``.

    Returns the run result and the output root. With ``url`` it attaches to that server.
    """
    output = pytester.path / "reports"
    attach = [f"--longctx-url={url}"] if url else []
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--longctx-output={output}", *attach, *args, timeout=timeout
    )
    return result, output
