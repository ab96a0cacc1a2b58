"""The interference workload against real vLLM: what a 16Ki prefill costs four background
streams, at two chunk sizes, and a server that runs one sequence at a time refused.

Two sessions launch their own server (the interference points' own: room for five
sequences, the chunk asked for, its scheduler config readable), one for each chunk size, and
the tests share them. On two cores only relations hold that no load can turn: the streams
wait longer during the prefill than idle, and a chunk that holds the whole prompt lets fewer
of their tokens through it than a small one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from longctx_testing import (
    SWEEP_TEST,
    Session,
    records_of,
    run_folder,
    run_process,
    run_session,
)

from pytest_longctx.core.records import Record

pytestmark = pytest.mark.vllm

#: 16 prefill steps of a 16Ki prompt, and one step for all of it.
SMALL, WHOLE = 1024, 32768


@pytest.fixture(scope="module")
def chunk_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Session, Path]]:
    """One session of the 16Ki interference point per chunk size, each launching its server."""
    runs = {}
    for chunk in (SMALL, WHOLE):
        folder = tmp_path_factory.mktemp(f"chunk-{chunk}")
        (folder / "test_sweep.py").write_text(SWEEP_TEST)
        session = run_process(
            folder, "-m", "pytest", "-p", "no:cacheprovider", "test_sweep.py", "-m", "len==16Ki",
            "--longctx-workload=interference", f"--longctx-max-num-batched-tokens={chunk}",
            "--longctx-output=reports", "--longctx-progress=off", timeout=900,
        )  # fmt: skip
        runs[chunk] = (session, folder / "reports")
    return runs


def _point(run: tuple[Session, Path]) -> Record:
    session, output = run
    (record,) = records_of(output)
    assert session.returncode == 0 and record.outcome == "passed", (
        session.describe(),
        record.reason,
    )
    return record


@pytest.mark.parametrize("chunk", [SMALL, WHOLE])
def test_background_gaps_during_a_16ki_prefill_are_longer_than_idle_ones(
    chunk_runs: dict[int, tuple[Session, Path]], chunk: int
) -> None:
    record = _point(chunk_runs[chunk])
    figures = record.figures
    assert record.cache_state == "interference" and record.prompt_tokens == 16384
    assert figures["bg_itl_prefill_p99"] > figures["bg_itl_idle_p99"], figures
    assert figures["bg_itl_prefill_max"] > figures["bg_itl_idle_max"], figures
    details = record.interference
    # the chunk as vLLM's scheduler runs it, and room for the load, as the gauges showed it
    assert details["chunk"]["max_num_batched_tokens"] == chunk
    assert details["sequence_limit"]["ran_at_once"] is True
    assert details["server_itl"]["agreement"] == "agrees", details["server_itl"]
    assert details["long_cached_tokens"] == 0 and details["preemptions"] == 0
    command = record.fingerprint["server_command"]
    assert command[command.index("--max-num-seqs") + 1] == "5"
    report = (run_folder(chunk_runs[chunk][1]) / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| 16Ki | 1 | 4 |"))
    assert f"| {chunk:,} |" in row
    gaps = next(
        line for line in report.splitlines() if line.startswith("| 16Ki | ") and " / " in line
    )
    idle, prefill = gaps.split("|")[2:4]  # both windows, median / p99 / max each
    assert idle.count("/") == prefill.count("/") == 2


def test_a_chunk_that_holds_the_whole_prompt_lets_fewer_tokens_through(
    chunk_runs: dict[int, tuple[Session, Path]], tmp_path: Path
) -> None:
    small, whole = _point(chunk_runs[SMALL]), _point(chunk_runs[WHOLE])
    during = "bg_tokens_during_prefill"
    assert whole.figures[during] < small.figures[during], (whole.figures, small.figures)
    runs = [str(run_folder(chunk_runs[chunk][1])) for chunk in (SMALL, WHOLE)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest_longctx", "compare", *runs, "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "compare.md").read_text()
    assert f"interference chunk {SMALL:,} tokens" in text
    assert f"interference chunk {WHOLE:,} tokens" in text
    assert "## background p99 inter-token gap during the prefill (s)" in text
    assert (tmp_path / "compare_interference.png").is_file()


def test_a_server_that_runs_one_sequence_at_a_time_is_refused_with_the_reason(
    sweep_dir: pytest.Pytester, vllm_url: str
) -> None:
    """The shared server is the study's: --max-num-seqs 1."""
    result, output = run_session(
        sweep_dir, "-m", "len==1Ki", "--longctx-workload=interference", url=vllm_url
    )
    result.assert_outcomes(failed=1)
    (record,) = records_of(output)
    assert record.failure_class == "refused"
    assert f"the server at {vllm_url} cannot run 5 requests at once" in record.reason
    assert "at most 1 ran at once" in record.reason
    assert "serve it with --max-num-seqs 5 or more" in record.reason
