"""The interference workload against real vLLM: what a 16Ki prefill costs four background
streams, at two chunk sizes (a server that runs one sequence at a time refused:
test_e2e_interference_session.py).

Two sessions attach to the suite's loaded servers (room for five sequences, the chunk given,
the scheduler config readable through the development endpoints), one for each chunk size, and
the tests share them. On two cores only relations hold that no load can turn: the streams
wait longer during the prefill than idle, and a chunk that holds the whole prompt stalls them
longer than a small one (one step of the whole prefill against one of its eight). They are
read only from gaps the server's own figures confirmed: a point whose gaps a busy host made
(the server's histogram or its timing of each request refutes them) has its background
figures set aside, and the tests hold it to that, the product's answer to such a point,
rather than run its session again until one is confirmed. A launched
session's own interference server (its ``--max-num-seqs`` and chunk) is shown by its plan, in
``test_interference_session.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from longctx_testing import (
    SHARED_SERVERS_PROFILE,
    SWEEP_TEST,
    Session,
    records_of,
    run_folder,
    run_process,
)
from server_pool import SMALL_CHUNK, WHOLE_CHUNK

from pytest_longctx.core.records import Record
from pytest_longctx.workloads.interference.under_load import SET_ASIDE

#: Timing relations a loaded host disturbs: ``make test`` runs them alone (the Makefile).
pytestmark = [pytest.mark.vllm, pytest.mark.host_timing]

#: Eight prefill steps of a 16Ki prompt, and one step for all of it.
SMALL, WHOLE = SMALL_CHUNK, WHOLE_CHUNK


def _refuted(run: tuple[Session, Path]) -> bool:
    """Whether the server's own figures refuted the point's background gaps; where they did,
    the point is held to what the product does with such a point: its background figures set
    aside, out of the figures and the gate, and the report says why."""
    record = _point(run)
    details = record.interference
    verdict = details["background_gaps"]
    if verdict["verdict"] != "refuted":
        return False
    assert verdict["why"] and verdict["figures"] == SET_ASIDE, verdict
    set_aside = details["unconfirmed_figures"]
    assert "bg_itl_prefill_max" in set_aside, set_aside
    assert not [name for name in record.figures if name.startswith("bg_")], record.figures
    report = (run_folder(run[1]) / "report.md").read_text()
    assert f"16Ki repeat 0 ({verdict['why']})" in report
    return True


@pytest.fixture(scope="module")
def chunk_runs(
    tmp_path_factory: pytest.TempPathFactory, loaded_url: str, whole_chunk_url: str
) -> dict[int, tuple[Session, Path]]:
    """One session of the 16Ki interference point per chunk size, each on its server."""
    runs = {}
    for chunk, url in ((SMALL, loaded_url), (WHOLE, whole_chunk_url)):
        folder = tmp_path_factory.mktemp(f"chunk-{chunk}")
        (folder / "test_sweep.py").write_text(SWEEP_TEST)
        session = run_process(
            folder, "-m", "pytest", "-p", "no:cacheprovider", "test_sweep.py", "-m",
            "len==16Ki", "--longctx-workload=interference", f"--longctx-url={url}",
            SHARED_SERVERS_PROFILE, "--longctx-output=reports", "--longctx-progress=off",
            timeout=300,
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
    details = record.interference
    # the chunk as vLLM's scheduler runs it, and room for the load, as the gauges showed it
    assert details["chunk"]["max_num_batched_tokens"] == chunk
    assert details["sequence_limit"]["ran_at_once"] is True
    assert details["long_cached_tokens"] == 0 and details["preemptions"] == 0
    if _refuted(chunk_runs[chunk]):
        return  # the gaps were the host's, by the server's own figures: set aside, as they must
    # the gaps read below are the server's: its histogram and its timing of each background
    # request confirm them
    assert details["background_gaps"]["verdict"] == "confirmed", details["background_gaps"]
    assert details["server_itl"]["agreement"] == "agrees", details["server_itl"]
    assert details["background_timing"]["agreement"] == "agrees", details["background_timing"]
    assert "unconfirmed_figures" not in details
    # a step that carries a prefill chunk holds every stream's next token for the step: the
    # longest gap beside the prefill is several typical idle gaps (the idle window's tail is
    # not compared: a host busy with other work stalls a stream now and then, 0.28 s once,
    # longer than a 2,048-token step; nor the prefill window's median: a whole-prompt step
    # leaves one long gap among the short ones of the streams' catching up)
    assert figures["bg_itl_prefill_max"] > 2 * figures["bg_itl_idle_median"], figures
    assert figures["bg_itl_prefill_p99"] > figures["bg_itl_idle_median"], figures
    limit = details["sequence_limit"]
    assert limit["most_running"] >= limit["wanted"] == 5, limit
    report = (run_folder(chunk_runs[chunk][1]) / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| 16Ki | 1 | 4 |"))
    assert f"| {chunk:,} |" in row
    gaps = next(
        line for line in report.splitlines() if line.startswith("| 16Ki | ") and " / " in line
    )
    idle, prefill = gaps.split("|")[2:4]  # both windows, median / p99 / max each
    assert idle.count("/") == prefill.count("/") == 2


def test_a_chunk_that_holds_the_whole_prompt_stalls_the_streams_longer(
    chunk_runs: dict[int, tuple[Session, Path]], tmp_path: Path
) -> None:
    small, whole = _point(chunk_runs[SMALL]), _point(chunk_runs[WHOLE])
    refuted = [chunk for chunk in (SMALL, WHOLE) if _refuted(chunk_runs[chunk])]
    if refuted:  # no gaps of the server's to compare (each set aside, as it must be)
        return
    # The streams' longest wait beside the prefill: one step of the whole prompt against one
    # of its eight. (Not the tokens let through the TTFT window: it opens when the request is
    # sent, and a busy host's API server took seconds before the step began once, the streams
    # decoding all along: 83 tokens against the small chunk's 28.)
    longest = "bg_itl_prefill_max"
    assert whole.figures[longest] > small.figures[longest], (whole.figures, small.figures)
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
