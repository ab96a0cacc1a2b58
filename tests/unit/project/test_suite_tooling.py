"""The test suite's own tooling: what its sessions import to collect, and the census of the
vLLM servers a run started (``tests/support/server_census.py``), whose figures each CI log
carries."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from longctx_testing import REPO, assert_bursts_kept_with_the_servers_figure
from server_census import READY_LINE, Census

from pytest_longctx.core.records import Record

HEAVY = ("vllm", "torch", "transformers")

COLLECT = """
import json, sys, pytest
code = pytest.main(["-p", "no:cacheprovider", "--collect-only", "-q", "-m", sys.argv[1], "tests"])
print(json.dumps([int(code), sorted(m for m in sys.argv[2:] if m in sys.modules)]))
"""


def test_collecting_every_test_file_imports_no_heavy_package() -> None:
    """`make test` runs three sessions and each collects every test file: an import at the top
    of one file is paid by all three (vLLM, torch and transformers: about 17 CPU-s of
    collection a session)."""
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, "own_server or stand_in", *HEAVY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert imported == [], f"collection imported {imported}: use deferred_import"


#: A server's stand-in for the census: it writes ``line`` to its log and exits a moment later.
LOOKALIKE = "import sys, time; print(sys.argv[1], flush=True); time.sleep(float(sys.argv[2]))"
#: What names it in its command line (not a vLLM server: the session's own census skips it).
LOOKALIKE_MARKER = b"census-lookalike-api-server"


def _lookalike(log: Path, line: str, stay_s: float, exec_after_s: float = 0.0) -> subprocess.Popen:
    """Started; with ``exec_after_s``, the child waits that long between its fork and exec."""
    with log.open("w") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                LOOKALIKE,
                line,
                str(stay_s),
                LOOKALIKE_MARKER.decode(),
                "--port",
                "1",
            ],  # fmt: skip
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: time.sleep(exec_after_s)) if exec_after_s else None,
        )


def test_a_server_stopped_before_the_census_asked_is_ready_by_its_log(tmp_path: Path) -> None:
    """A test that stops its server within a look of its start-up (a layer-kinds server, read
    and stopped at once) left the census no time to ask ``/health``: its log says whether it
    served. One that exits without that line never was ready."""
    census = Census(markers=(LOOKALIKE_MARKER,))
    served = _lookalike(tmp_path / "served.log", READY_LINE.decode(), 1.0)
    refused = _lookalike(tmp_path / "refused.log", "ValueError: not enough KV cache", 1.0)
    deadline = time.monotonic() + 30
    while len(census.starts) < 2 and time.monotonic() < deadline:
        census.look()
        time.sleep(0.05)
    assert set(census.starts) == {served.pid, refused.pid}
    served.wait(30)
    refused.wait(30)
    census.look()
    assert census.starts[served.pid].ready_by_log
    assert census.starts[refused.pid].ready_s is None
    lines = census.summary()
    assert lines[0].startswith("vLLM servers started by this run: 2 (1 ready, 1 never ready)")
    assert any(f"pid {served.pid}: ready in at most" in line for line in lines), lines


def test_a_server_looked_at_before_its_exec_is_counted_once_it_runs(tmp_path: Path) -> None:
    """Between its fork and its exec a child carries its parent's command line: a look in
    that moment must not settle what the process is."""
    census = Census(markers=(LOOKALIKE_MARKER,))
    started: list[subprocess.Popen] = []

    def start() -> None:
        started.append(_lookalike(tmp_path / "late.log", READY_LINE.decode(), 1.0, 1.0))

    starting = threading.Thread(target=start)
    starting.start()
    looks_before_exec = 0
    while starting.is_alive():  # Popen returns once the child has exec'd
        census.look()
        looks_before_exec += 1
        time.sleep(0.05)
    starting.join()
    census.look()
    assert looks_before_exec >= 5
    assert list(census.starts) == [started[0].pid]
    started[0].wait(30)


def _point(repeat: int, agrees: bool, burst: float = 31.0) -> Record:
    """A 1Ki point of a real session at stream interval 1: its stream agreed with the
    server's own decode, or arrived in a burst of ``burst`` tokens and kept the server's
    figure."""
    stream: dict = {"decode_source": "stream", "agreement": "agrees", "chunks": 32}
    stream["server_decode_throughput"] = 300.0
    figures = {"decode_throughput": 300.0, "server_decode_throughput": 300.0}
    if not agrees:
        stream = {**stream, "decode_source": "server", "agreement": "the stream delivered 31"}
        stream["largest_burst"] = {"tokens": burst, "chunks": 2, "span_s": 0.0}
        figures["stream_decode_throughput"] = 300.0 if burst < 31 else 60_000.0
    return Record(
        run_id="r",
        nodeid=f"test_sweep.py::test_prefill_decode[len=1Ki-rep={repeat}]",
        length=1024,
        repeat=repeat,
        outcome="passed",
        figures=figures,
        completion_tokens=32,
        fingerprint={"stream": {"bursts_allowed": True, "tolerance": 0.5}},
        stream=stream,
    )


def _report(records: list[Record]) -> str:
    kept = sum(r.stream["decode_source"] == "server" for r in records)
    if not kept:
        return ""
    return f"Decode figures: {kept} point{'s' if kept != 1 else ''} kept the server's"


def test_a_point_kept_on_the_servers_figure_shows_the_disagreement_in_its_record() -> None:
    """A real server's points are kept on its figure as a busy host bursts them, however
    many (never rerun until enough agree): each such point's own record shows why, a burst
    beyond the tolerance's share or a rate beyond the tolerance; one whose stream neither
    burst nor strayed was kept for nothing and fails the rule."""
    late = [_point(repeat, agrees=False) for repeat in range(6)]
    assert_bursts_kept_with_the_servers_figure(late, _report(late))
    half = [_point(repeat, agrees=repeat % 2 == 0) for repeat in range(6)]
    assert_bursts_kept_with_the_servers_figure(half, _report(half))
    unexplained = [*half[:5], _point(5, agrees=False, burst=10.0)]  # 10 of 31, at its rate
    with pytest.raises(AssertionError):
        assert_bursts_kept_with_the_servers_figure(unexplained, _report(unexplained))
