"""The session's own relaunch bookkeeping: retries, limits, and what the points it could not
measure say.

These are about the session, not vLLM, so the stand-in (``fake_server_main.py``) is
launched and dies where a test tells it to; the device-memory wait is checked on readings a
test hands it (this host has no GPU).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, launch_fake_conftest, records_of, run_folder, run_session

from pytest_longctx.campaign import lifecycle
from pytest_longctx.progress import telemetry
from pytest_longctx.serving import process
from pytest_longctx.serving.process import is_alive, wait_group_gone

#: Sessions that launch the stand-in server: run beside the other sessions (make test).
pytestmark = pytest.mark.stand_in

GIB = 1024**3


def _launched(pytester: pytest.Pytester, *extra: str) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(launch_fake_conftest(*extra))


@pytest.mark.parametrize("relaunches", [2, 1])
def test_a_relaunch_whose_start_fails_counts_and_is_tried_again(
    pytester: pytest.Pytester, relaunches: int
) -> None:
    """The server dies during 2Ki and its first start after that fails: with two relaunches
    the second start serves 4Ki and names the failed one in its cause; with one, the failed
    start spent it, and 4Ki is never sent, saying both."""
    died = pytester.path / "died"
    _launched(
        pytester, "--die-at=5", "--exit-code=-9", f"--once={died}", f"--fail-start-once={died}"
    )
    result, output = run_session(
        pytester, "--longctx-to=4Ki", f"--longctx-max-relaunches={relaunches}"
    )
    records = records_of(output)
    assert [(r.length, r.failure_class) for r in records[:2]] == [
        (1024, None),
        (2048, "engine_died"),
    ]
    last = records[2]
    if relaunches == 2:
        result.assert_outcomes(passed=2, failed=1)
        assert (last.outcome, last.server_start["index"]) == ("passed", 1)
        cause = last.server_start["cause"]
        assert cause.startswith("engine_died: the vLLM server is gone (exit code -9")
        assert "; 1 start(s) failed before it, the last: the vLLM server exited while starting" in (
            cause
        )
    else:
        result.assert_outcomes(passed=1, failed=1, errors=1)
        assert (last.outcome, last.failure_class) == ("error", "start_failed")
        assert "relaunching the server after engine_died" in last.reason
        assert "the stand-in fails this start (--fail-start-once)" in last.reason
        assert "never sent" in last.reason
        assert "relaunches are spent (1 of --longctx-max-relaunches=1)" in last.reason


def test_points_never_sent_once_relaunches_are_spent_count_no_crash(
    pytester: pytest.Pytester,
) -> None:
    """No relaunches: 2Ki crashes, and 4Ki and 8Ki are never sent. They are start_failed,
    saying so, and the per-length counts show a crash at 2Ki only."""
    _launched(pytester, "--die-at=5", "--exit-code=-9")
    result, output = run_session(pytester, "--longctx-to=8Ki", "--longctx-max-relaunches=0")
    result.assert_outcomes(passed=1, failed=1, errors=2)
    records = records_of(output)
    assert [(r.length, r.outcome, r.failure_class) for r in records] == [
        (1024, "passed", None),
        (2048, "failed", "engine_died"),
        (4096, "error", "start_failed"),
        (8192, "error", "start_failed"),
    ]
    for record in records[2:]:
        assert "never sent: the server is down and not started again" in record.reason
        assert "the server exited with code -9" in record.evidence
    report = (run_folder(output) / "report.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")
    }
    assert "1 engine_died" in rows["2Ki"]
    assert "1 start_failed" in rows["4Ki"] and "engine_died" not in rows["4Ki"]


def test_a_length_skipped_for_its_crashes_carries_their_class(pytester: pytest.Pytester) -> None:
    """One crash allowed per length: 2Ki's second repeat is skipped with the class of the
    crash that caused it, and counted as a skip of that class, not as a second crash."""
    died = pytester.path / "died"
    _launched(pytester, "--die-at=5", "--exit-code=-9", f"--once={died}")
    args = ("--longctx-to=2Ki", "--longctx-repeats=2", "--longctx-max-crashes-per-length=1")
    result, output = run_session(pytester, *args)
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    records = records_of(output)
    assert [(r.length, r.repeat, r.outcome, r.failure_class) for r in records] == [
        (1024, 0, "passed", None),
        (2048, 0, "failed", "engine_died"),
        (1024, 1, "passed", None),
        (2048, 1, "skipped", "engine_died"),
    ]
    assert records[3].evidence == ("2Ki took the server down once in this session (engine_died)",)
    report = (run_folder(output) / "report.md").read_text()
    assert "1 engine_died, 1 skipped (engine_died) |" in report
    result.stdout.fnmatch_lines(["2Ki *1 engine_died, 1 skipped (engine_died)*"])


# -- the dead server's process group, gone before a relaunch --------------------------------


def _stat_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0]


def _zombie_group() -> tuple[int, int]:
    """A process group of two children of this process that have exited and are not reaped,
    as a killed server's workers are when pytest is PID 1: (leader, worker)."""
    leader = os.fork()
    if leader == 0:
        os.setpgid(0, 0)
        os._exit(0)
    with contextlib.suppress(OSError):  # both sides set it: whichever runs first
        os.setpgid(leader, leader)
    worker = os.fork()
    if worker == 0:
        os.setpgid(0, leader)
        os._exit(0)
    with contextlib.suppress(OSError):
        os.setpgid(worker, leader)
    deadline = time.monotonic() + 10
    while {_stat_state(leader), _stat_state(worker)} != {"Z"}:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return leader, worker


def test_a_group_of_zombies_is_not_alive_and_its_workers_are_reaped() -> None:
    leader, worker = _zombie_group()
    try:
        os.killpg(leader, 0)  # what the liveness check used to rely on: it still succeeds
        started = time.monotonic()
        assert not is_alive(leader, group=True)
        assert wait_group_gone(leader, timeout_s=30)
        assert time.monotonic() - started < 5
        with pytest.raises(ChildProcessError):  # the worker was reaped
            os.waitpid(worker, os.WNOHANG)
        assert _stat_state(leader) == "Z"  # the leader is left to its Popen's wait
    finally:
        os.waitpid(leader, 0)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker, 0)


def test_a_group_with_one_running_process_is_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
    try:
        assert is_alive(child.pid, group=True)
        assert not wait_group_gone(child.pid, timeout_s=0.2, poll_s=0.05)
    finally:
        child.kill()
        child.wait()
    assert not is_alive(child.pid, group=True)


# -- a GPU server's memory, released before a relaunch -------------------------------------


@pytest.mark.parametrize(
    ("ids", "expected"),
    [(("1",), {1: 512}), (("GPU-5e2f",), {0: 81920}), ((), {0: 81920, 1: 512})],
    ids=["index", "uuid", "every-device"],
)
def test_device_memory_is_read_for_the_servers_own_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ids: tuple[str, ...], expected: dict
) -> None:
    """The progress telemetry's own reader, on nvidia-smi's documented output: the devices
    the server was given (by index or by UUID), not its neighbours' on the same node."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        "echo '0, 00000000:1B:00.0, GPU-5e2f, 81920, 143771, 50, 300.5'\n"
        "echo '1, 00000000:3B:00.0, GPU-77aa, 512, 143771, 0, 70.1'\n"
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    scope = telemetry.DeviceScope(ids, "CUDA_VISIBLE_DEVICES")
    assert telemetry.memory_used(scope) == {i: mib * 1024**2 for i, mib in expected.items()}
    assert telemetry.memory_used(scope, telemetry.DeviceTelemetry(tool=None)) is None


def test_a_relaunch_waits_for_the_devices_memory_to_fall_back() -> None:
    before = {0: GIB // 2, 1: GIB // 2}
    readings = iter([{0: 80 * GIB, 1: GIB // 2}, {0: 40 * GIB, 1: GIB // 2}, {0: GIB, 1: GIB}])
    seen = []

    def read() -> dict[int, int]:
        seen.append(next(readings))
        return seen[-1]

    assert process.wait_device_memory(before, read, 30, poll_s=0.01) == {}
    assert len(seen) == 3  # within the margin of its level before the first start


def test_device_memory_that_is_not_released_stops_the_relaunch_saying_where() -> None:
    before = {0: GIB // 2, 1: GIB // 2}
    held = process.wait_device_memory(before, lambda: {0: GIB // 2, 1: 80 * GIB}, 0.05, 0.01)
    assert held == {1: 80 * GIB}
    message = lifecycle.memory_not_released(before, held, 0.05)
    assert "device memory is not released after 0.05 s" in message
    assert "device 1: 80.0 GiB used, 512.0 MiB before the first start" in message
    assert "device 0" not in message


def test_a_device_reading_that_fails_is_not_waited_on() -> None:
    assert process.wait_device_memory({0: 0}, lambda: None, 30, poll_s=10) == {}
