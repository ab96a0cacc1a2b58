"""Outcome classes: every point that did not pass says why, from evidence.

The fake server is right here: these tests are about what the plugin makes of a server's
words, its silence and its death, with vLLM 0.32's own error wording (``fake_vllm``'s
``ENGINE_DEAD_MESSAGE`` is ``vllm.v1.engine.exceptions.EngineDeadError``'s). A launched
stand-in (``fake_server_main.py``) dies like a launched vLLM does, with a log to read.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_vllm import ENGINE_DEAD_MESSAGE, Behaviour, FakeVLLM
from longctx_testing import (
    REPO,
    SWEEP_TEST,
    failure_classes,
    launch_fake_conftest,
    records_of,
    run_folder,
    run_session,
)

from pytest_longctx.core.records import FAILURE_CLASSES
from pytest_longctx.measure import outcomes

#: Sessions that launch the stand-in server: run beside the other sessions (make test).
pytestmark = pytest.mark.stand_in


def test_a_broken_contract_is_classed_contract(attached) -> None:  # noqa: ANN001
    result, records = attached("-m", "len==1Ki", cached_prompt_tokens=512)
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["contract"]
    assert "prefix cache served 512" in records[0].reason


def test_a_first_token_budget_that_runs_out_is_a_timeout(attached) -> None:  # noqa: ANN001
    result, records = attached(
        "-m", "len==1Ki", "--longctx-ttft-timeout=0.5", fault="hang_after_headers"
    )
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["timeout"]  # the server still answers /health


def test_a_server_that_stops_answering_is_a_hang(attached) -> None:  # noqa: ANN001
    """Nothing moves and /health gets no answer though the port accepts: hung, not slow."""
    result, records = attached(
        "-m",
        "len==1Ki",
        "--longctx-ttft-timeout=0.5",
        "--longctx-reattach-timeout=0",
        fault="freeze",
    )
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["hang"]
    assert any("connected, no answer" in line for line in records[0].evidence)


def test_vllms_engine_death_frame_is_engine_died(attached) -> None:  # noqa: ANN001
    """An attached server's log is not readable here: the generic frame is engine_died."""
    result, records = attached(
        "-m",
        "len==1Ki",
        fault="error_frame",
        fault_after_tokens=2,
        error_message=ENGINE_DEAD_MESSAGE,
    )
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["engine_died"]
    assert records[0].evidence == (ENGINE_DEAD_MESSAGE,)


def test_vllms_engine_death_500_is_engine_died(attached) -> None:  # noqa: ANN001
    result, records = attached("-m", "len==1Ki", fault="http_500")
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["engine_died"]


def test_a_generation_error_frame_is_an_error(attached) -> None:  # noqa: ANN001
    """vLLM's GenerationError frame ("Internal server error") names no death and no memory."""
    result, records = attached("-m", "len==1Ki", fault="error_frame", fault_after_tokens=2)
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["error"]


def test_a_cut_connection_to_a_live_server_is_apart_from_a_crash(attached) -> None:  # noqa: ANN001
    """The stream breaks, the server still answers: a middlebox cut it, not a crash."""
    result, records = attached("--longctx-to=2Ki", fault="truncate", fault_after_tokens=3)
    result.assert_outcomes(failed=2)
    assert failure_classes(records) == ["connection_cut", "connection_cut"]
    assert "NAT, proxy or load balancer" in records[0].evidence[0]


def test_a_reset_connection_to_a_live_server_is_cut(attached) -> None:  # noqa: ANN001
    result, records = attached("-m", "len==1Ki", fault="reset")
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["connection_cut"]


def test_a_prompt_longer_than_the_server_serves_is_refused(attached) -> None:  # noqa: ANN001
    result, records = attached("-m", "len==1Ki", max_model_len=512)
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["refused"]


def test_an_attached_server_that_is_gone_fails_fast_as_server_gone(attached) -> None:  # noqa: ANN001
    result, records = attached("--longctx-to=2Ki", "--longctx-reattach-timeout=0", stop_server=True)
    result.assert_outcomes(failed=1, errors=1)  # the second point is never sent
    assert failure_classes(records) == ["server_gone", "server_gone"]
    assert "did not answer again within 0 s" in records[1].reason


def test_a_malformed_stream_is_an_error(attached) -> None:  # noqa: ANN001
    result, records = attached("-m", "len==1Ki", fault="malformed_chunk")
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["error"]


def test_an_interrupted_point_is_classed_interrupted(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest("def pytest_runtest_call(item):\n    raise KeyboardInterrupt\n")
    output = pytester.path / "reports"
    pytester.runpytest_subprocess(  # in its own process: the interrupt must not reach this one
        f"--longctx-url={fake_vllm.url}", f"--longctx-output={output}", "-m", "len==1Ki"
    )
    records = records_of(output)
    assert [(r.outcome, r.failure_class) for r in records] == [("interrupted", "interrupted")]


def test_the_report_counts_classes_per_length(attached, pytester: pytest.Pytester) -> None:  # noqa: ANN001
    result, _ = attached("--longctx-to=2Ki", fault="truncate", fault_after_tokens=3)
    report = (run_folder(pytester.path / "reports") / "report.md").read_text()
    assert "1 connection_cut |" in report
    assert "**failed (connection_cut)**" in report
    page = (run_folder(pytester.path / "reports") / "report.html").read_text()
    assert "1 connection_cut" in page  # pytest-html's page: the same summary
    result.stdout.fnmatch_lines(["*1Ki*1 connection_cut*"])


# -- a launched server's death, read from its log and exit ---------------------------------


def launched(pytester: pytest.Pytester, *extra: str) -> None:
    """Sessions here launch the stand-in with ``extra`` arguments."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(launch_fake_conftest(*extra))


#: Notes which SIGTERM handler is installed as each point runs.
NOTE_SIGTERM_HANDLER = """
import signal

def pytest_runtest_call(item):
    handler = signal.getsignal(signal.SIGTERM)
    with open("handlers", "a") as out:
        out.write(getattr(handler, "__qualname__", repr(handler)) + "\\n")
"""


def test_an_oom_named_in_the_log_is_oom_and_the_session_relaunches(
    pytester: pytest.Pytester,
) -> None:
    """The server prints torch's out-of-memory and exits during the 2Ki point: that point is
    oom with the log line kept, the server is started again and 4Ki passes on start #1."""
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 139.72 GiB of which 1.06 GiB is free."
    )
    once = pytester.path / "died"
    launched(pytester, "--die-at=5", f"--die-line={line}", f"--once={once}")
    (pytester.path / "conftest.py").write_text(
        (pytester.path / "conftest.py").read_text() + NOTE_SIGTERM_HANDLER
    )
    result, output = run_session(pytester, "--longctx-to=4Ki")
    result.assert_outcomes(passed=2, failed=1)
    # SIGTERM still ends the session the way Ctrl-C does, before and after the relaunch
    handlers = (pytester.path / "handlers").read_text().split()
    assert handlers == ["SessionSignals._interrupt"] * 3
    records = records_of(output)
    assert [(r.length, r.outcome, r.failure_class) for r in records] == [
        (1024, "passed", None),
        (2048, "failed", "oom"),
        (4096, "passed", None),
    ]
    assert line in records[1].evidence
    assert [r.server_start["index"] for r in records] == [0, 0, 1]
    assert records[2].server_start["cause"].startswith("oom: the vLLM server is gone (exit code 1;")
    assert records[2].server_start["startup_s"] > 0
    report = (run_folder(output) / "report.md").read_text()
    assert "Server starts" in report and "#1 up in" in report
    assert "1 oom" in report


def test_a_bare_sigkill_is_engine_died_not_oom(pytester: pytest.Pytester) -> None:
    """Exit -9 without a line naming memory, and no OOM kill in memory.events: engine_died."""
    once = pytester.path / "died"
    launched(pytester, "--die-at=4", "--exit-code=-9", f"--once={once}")
    result, output = run_session(pytester, "--longctx-to=2Ki")
    result.assert_outcomes(passed=1, failed=1)
    records = records_of(output)
    assert [(r.outcome, r.failure_class) for r in records] == [
        ("failed", "engine_died"),
        ("passed", None),
    ]
    assert "the server exited with code -9" in records[0].evidence


#: A "server" that fails as vLLM does when it cannot fetch a model: thirty traceback frames,
#: the cause, then vLLM's wrapper around it.
FAILING_SERVER = """
import sys
for n in range(30):
    print(f'  File "engine.py", line {n}, in start')
print("OSError: We could not connect to huggingface.co to load the files")
print("RuntimeError: Engine core initialization failed. See root cause above.")
sys.exit(1)
"""

FAIL_TO_START = """
import sys
from pytest_longctx.serving.vllm_command import ServerCommand

def pytest_longctx_server_command(config, plan, command):
    argv = (sys.executable, "failing_server.py", "--host", "127.0.0.1", "--port", "1")
    return ServerCommand(argv, {})
"""


def test_a_server_that_cannot_start_names_its_cause_in_one_line(pytester: pytest.Pytester) -> None:
    """Thirty traceback frames, the cause, vLLM's wrapper: the reason names the cause."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(FAIL_TO_START)
    (pytester.path / "failing_server.py").write_text(FAILING_SERVER)
    result, output = run_session(pytester, "--longctx-to=2Ki")
    result.assert_outcomes(errors=2)
    records = records_of(output)
    assert failure_classes(records) == ["start_failed", "start_failed"]
    (line,) = records[0].reason.splitlines()
    assert line.endswith(": OSError: We could not connect to huggingface.co to load the files")


DOCS = REPO / "docs"


def test_every_class_is_documented() -> None:
    guide = (DOCS / "guides" / "campaigns.md").read_text()
    for name in FAILURE_CLASSES:
        assert f"`{name}`" in guide, name


def test_the_contract_class_names_every_check_of_the_sweep_items_contract() -> None:
    """The docs spell the contract out in bold (exact, cold, alone, streamed as decoded); the
    class's description, in the records' module and in the docs' table of classes, names each."""
    page = (DOCS / "concepts" / "measurement.md").read_text()
    contract = page[page.index("The sweep item's contract") :].split("\n\n")[0]
    checks = re.findall(r"\*\*([^*]+)\*\*", contract)
    assert len(checks) >= 4 and "streamed as decoded" in checks, checks
    classes = (DOCS / "guides" / "campaigns.md").read_text()
    row = next(line for line in classes.splitlines() if line.startswith("| `contract` |"))
    for check in checks:
        assert check in FAILURE_CLASSES["contract"], check
        assert check in row, check


def test_the_exception_ending_a_log_is_the_root_cause_not_the_wrapper() -> None:
    log = [
        "(EngineCore pid=7) ERROR 12-01 09:18:46 [core.py:1510] ValueError: To serve at least one "
        "request with the model's max seq len (16416), (0.01 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (0.0 GiB). Based on the available memory, the "
        "estimated maximum model length is 10112. Try increasing `gpu_memory_utilization`",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert outcomes.final_exception(log).startswith("ValueError: To serve at least one request")
    assert outcomes.estimated_max_model_len("\n".join(log)) == 10112
    assert outcomes.death(log, 1).failure_class == "oom"
    assert outcomes.death(["Killed"], -9).failure_class == "engine_died"
    assert outcomes.death(["Killed"], -9, oom_kills=1).failure_class == "oom"


def test_resume_measures_the_points_a_crash_cost(pytester: pytest.Pytester) -> None:
    """No relaunches: the crash fails 2Ki as engine_died and 4Ki is never sent (start_failed);
    a resume measures both, like any failure."""
    once = pytester.path / "died"
    launched(pytester, "--die-at=5", "--exit-code=-9", f"--once={once}")
    result, output = run_session(pytester, "--longctx-to=4Ki", "--longctx-max-relaunches=0")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    assert failure_classes(records_of(output)) == [None, "engine_died", "start_failed"]
    assert "relaunches are spent (0 of --longctx-max-relaunches=0)" in records_of(output)[2].reason
    result, output = run_session(pytester, "--longctx-to=4Ki", "--longctx-resume")
    result.assert_outcomes(passed=3)
    records = records_of(output)
    assert [(r.length, r.outcome) for r in records[3:]] == [(2048, "passed"), (4096, "passed")]


def test_under_xdist_a_worker_relaunches_its_own_server(pytester: pytest.Pytester) -> None:
    """One of two workers' servers dies during a point: that worker starts its own again, the
    other's server is untouched, and every other point passes."""
    once = pytester.path / "died"
    launched(pytester, "--die-at=4", "--exit-code=-9", f"--once={once}")
    result, output = run_session(pytester, "-n", "2", "--longctx-to=4Ki", "--longctx-repeats=2")
    result.assert_outcomes(passed=5, failed=1)
    records = records_of(output)
    (crashed,) = [r for r in records if r.outcome == "failed"]
    assert crashed.failure_class == "engine_died"
    worker = crashed.fingerprint["server"]["worker"]
    starts = {(r.fingerprint["server"]["worker"], r.server_start["index"]) for r in records}
    assert (worker, 1) in starts
    assert all(index == 0 for name, index in starts if name != worker)


def test_a_profile_whose_devices_are_absent_is_refused_before_a_launch(
    pytester: pytest.Pytester,
) -> None:
    """MI355X profile, no ROCm device here: refused at once, in one line, nothing started;
    its plan stays available."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    args = ("--longctx-profile=kimi-linear-mi355x", "--longctx-to=2Ki")
    result, output = run_session(pytester, *args, timeout=120)
    result.assert_outcomes(errors=2)
    records = records_of(output)
    assert failure_classes(records) == ["start_failed", "start_failed"]
    (line,) = records[0].reason.splitlines()
    assert line.startswith("Failed: profile kimi-linear-mi355x cannot be launched here: it serves")
    assert "8 ROCM device(s) and amd-smi or rocm-smi finds none on this machine" in line
    assert not list(run_folder(output).glob("server*.log"))
    result, _ = run_session(pytester, *args, "--longctx-plan", timeout=120)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*server command*"])


@pytest.mark.parametrize(
    ("version", "name"), [("v2", "memory.events"), ("v1", "memory.oom_control")]
)
def test_the_oom_killers_count_is_read_from_the_servers_cgroup(
    tmp_path: Path, version: str, name: str
) -> None:
    """The kernel counts OOM kills per cgroup; a kill during the server's life is oom."""
    import os

    from pytest_longctx.serving.process import memory_events_path, oom_kill_count

    line, folder = {
        "v2": ("0::/session", tmp_path / "session"),
        "v1": ("4:memory:/session", tmp_path / "memory" / "session"),
    }[version]
    folder.mkdir(parents=True)
    events = folder / name
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    proc = tmp_path / "cgroup"
    proc.write_text(line + "\n")
    real = Path.read_text

    def read(path: Path, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return (
            real(proc)
            if str(path) == f"/proc/{os.getpid()}/cgroup"
            else real(path, *args, **kwargs)
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", read)
        found = memory_events_path(os.getpid(), root=tmp_path)
    assert found is not None and found.name == name
    assert oom_kill_count(found) == 0
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\n")
    assert oom_kill_count(found) == 1


def test_a_relaunch_rewrites_server_json_as_running(tmp_path: Path) -> None:
    """The next session names a server left running by its ``server.json``; a relaunch must
    not leave the earlier start's ``stopped_at`` on the running one."""
    import json
    import sys

    from pytest_longctx.serving.process import LaunchedServer
    from pytest_longctx.serving.vllm_command import ServerCommand

    argv = (sys.executable, "-c", "import time; time.sleep(60)", "--host", "127.0.0.1")
    command = ServerCommand((*argv, "--port", "1"))
    first = LaunchedServer(command, tmp_path / "server.log", 5, grace_s=1)
    first.start()
    first.stop()
    assert json.loads((tmp_path / "server.json").read_text())["stopped_at"]
    second = LaunchedServer(command, tmp_path / "server.log", 5, grace_s=1)
    second.start()
    try:
        data = json.loads((tmp_path / "server.json").read_text())
        assert (data["pid"], data["stopped_at"]) == (second.process.pid, None)
    finally:
        second.stop()


@dataclass
class _ComesBack:
    """Stops the fake server as the first point runs, and starts one on the same port as a
    supervisor restarting it would: a second later (``at_once`` False: the next point waits
    for it) or as soon as the failed point ends (it answers before the next point asks)."""

    fake: FakeVLLM
    model: str
    started: list[FakeVLLM]
    at_once: bool = False

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if self.started:
            return
        port = int(self.fake.url.rsplit(":", 1)[1])
        self.fake.stop()
        again = FakeVLLM(Behaviour(model=self.model), port=port)
        self.started.append(again)
        if not self.at_once:
            threading.Timer(1.0, again.start).start()

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self.at_once and len(self.started) == 1:
            self.started.append(self.started[0].start())


@pytest.mark.parametrize("at_once", [False, True], ids=["back-later", "back-at-once"])
@pytest.mark.parametrize("model", ["fake-model", "another-model"])
def test_an_attached_server_that_answers_again_is_checked_and_measured(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM, model: str, at_once: bool
) -> None:
    """The same server back within the wait: the next point is measured; another model on
    that port is not the server this run measured, and its points fail as server_gone. Back
    before the next point asks, it is checked all the same (a busy host ends the failed point
    late)."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    started: list[FakeVLLM] = []
    try:
        result = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            f"--longctx-url={fake_vllm.url}",
            f"--longctx-output={output}",
            "--longctx-decode-tokens=8",
            "--longctx-to=2Ki",
            "--longctx-reattach-timeout=30s",
            plugins=[_ComesBack(fake_vllm, model, started, at_once)],
        )
    finally:
        for server in started:
            server.stop()
    records = records_of(output)
    assert records[0].failure_class == "server_gone"
    if model == "fake-model":
        result.assert_outcomes(passed=1, failed=1)
        assert records[1].outcome == "passed"
        assert records[1].server_start["index"] == 1
        assert "answered again after" in records[1].server_start["cause"]
    else:
        result.assert_outcomes(failed=1, errors=1)
        assert records[1].failure_class == "server_gone"
        assert "not the server this run measured" in records[1].reason
        assert "'another-model' != 'fake-model'" in records[1].reason


KILL_AS_2KI_RUNS = """
import os, signal

#: Each server the session started, as it became ready; None for an attached one.
servers = []

def pytest_longctx_server_ready(config, base_url, mode, launched):
    servers.append(launched)

def pytest_runtest_call(item):
    if "len=2Ki" in item.name and len(servers) == 1:
        os.killpg(servers[0].pgid, signal.SIGKILL)
        servers[0].process.wait()
"""


def test_a_point_never_sent_because_the_server_died_is_measured_after_the_relaunch(
    pytester: pytest.Pytester,
) -> None:
    """The server dies after 2Ki's setup found it alive, before its request: not a failure,
    the point is measured on the relaunched server."""
    launched(pytester)
    (pytester.path / "conftest.py").write_text(
        (pytester.path / "conftest.py").read_text() + KILL_AS_2KI_RUNS
    )
    result, output = run_session(pytester, "--longctx-to=4Ki")
    result.assert_outcomes(passed=3)
    records = records_of(output)
    assert [(r.length, r.server_start["index"]) for r in records] == [
        (1024, 0),
        (2048, 1),
        (4096, 1),
    ]
    assert records[1].server_start["cause"].startswith("engine_died: the vLLM server is gone")


@pytest.mark.parametrize(
    ("stuck", "evidence"),
    [
        ("--freeze-at=5", "did not answer /health within 10 s after the budget ran out"),
        ("--stick-at=5", "vllm:num_requests_running was 1 "),
    ],
    ids=["server-frozen", "engine-stuck"],
)
def test_a_launched_server_that_hangs_is_classed_hang_stopped_and_relaunched(
    pytester: pytest.Pytester, stuck: str, evidence: str
) -> None:
    """During 2Ki the whole server freezes (/health gets no answer), or only its engine
    sticks (/health answers, the abandoned request stays running, as it would for every later
    point): the budget runs out and the point is a hang; the server is stopped and started
    again for that cause, and 4Ki passes on the new start instead of waiting its budget."""
    once = pytester.path / "froze"
    launched(pytester, stuck, f"--once={once}")
    result, output = run_session(pytester, "--longctx-to=4Ki", "--longctx-ttft-timeout=1")
    result.assert_outcomes(passed=2, failed=1)
    records = records_of(output)
    assert [(r.outcome, r.failure_class, r.server_start["index"]) for r in records] == [
        ("passed", None, 0),
        ("failed", "hang", 0),
        ("passed", None, 1),
    ]
    assert "FirstTokenTimeoutError" in records[1].reason
    (line,) = records[1].evidence  # launched: nothing said about not restarting
    assert evidence in line
    cause = records[2].server_start["cause"]
    assert cause.startswith("hang: the server hung during len=2Ki") and evidence in cause


def test_a_budget_that_runs_out_on_an_engine_still_stepping_is_a_timeout_and_the_server_kept(
    pytester: pytest.Pytester,
) -> None:
    """2Ki's prefill takes 10 s in steps of 1.25 s, and the engine notices its client gone
    only at the first token: the 2 s budget runs out, the request stays running 8 s after
    it, but the KV gauge keeps rising meanwhile. A stepping engine is not stuck: the point is
    a timeout, the server is not restarted, and 4Ki passes on the same start."""
    once = pytester.path / "slowed"
    slow = '{"first_token_delay_s": 10, "prefill_chunk_tokens": 256}'
    launched(pytester, "--slow-at=5", f"--slow={slow}", f"--once={once}")
    result, output = run_session(pytester, "--longctx-to=4Ki", "--longctx-ttft-timeout=2")
    result.assert_outcomes(passed=2, failed=1)
    records = records_of(output)
    assert [(r.outcome, r.failure_class, r.server_start["index"]) for r in records] == [
        ("passed", None, 0),
        ("failed", "timeout", 0),
        ("passed", None, 0),
    ]
    assert "FirstTokenTimeoutError" in records[1].reason
    (line,) = records[1].evidence
    assert "stepping meanwhile (vllm:kv_cache_usage_perc" in line
    assert "a slow step, not a stuck engine; the server is kept" in line


#: gw0's server dies during gw0's first point (its fourth request, after the warm-ups); gw1
#: measures its first point only once that crash is recorded, and gw0 starts its next point
#: (where it finds its server lost and hands the point back) only once gw1 has taken the last
#: pending point and started its second: a worker told to finish then could take nothing.
GW0_LOST_AS_GW1_RUNS_OUT = """
import os, sys, time

import pytest

from pytest_longctx.serving.vllm_command import ServerCommand

calls = []


def pytest_longctx_server_command(config, plan, command):
    argv = list(command.argv)
    port = argv[argv.index("--port") + 1]
    dies = ["--die-at=4", "--exit-code=-9"] if config.workerinput["workerid"] == "gw0" else []
    return ServerCommand(
        (sys.executable, {main!r}, "--host", "127.0.0.1", "--port", port,
         "--served-model-name", "tiny-llama", *dies),
        {{}},
    )


def wait_for(done):
    deadline = time.monotonic() + 120
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def crash_recorded():
    import glob
    for path in glob.glob("reports/*/results.jsonl"):
        with open(path) as results:
            if '"outcome": "failed"' in results.read():
                return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    worker = item.config.workerinput["workerid"]
    calls.append(item.nodeid)
    if worker == "gw0" and len(calls) == 2:
        wait_for(lambda: os.path.exists("gw1-second"))


def pytest_runtest_call(item):
    worker = item.config.workerinput["workerid"]
    if worker == "gw1" and len(calls) == 1:
        wait_for(crash_recorded)
    if worker == "gw1" and len(calls) == 2:
        open("gw1-second", "w").close()
"""


def test_under_xdist_a_worker_whose_server_is_lost_hands_its_points_to_the_others(
    pytester: pytest.Pytester,
) -> None:
    """No relaunches: gw0's server dies during its first point; gw0 takes no more points and
    hands back those it holds, and gw1 measures every one: gw1 is not told to finish from
    the crash on (it would take nothing more) until gw0 has handed back what it held."""
    from longctx_testing import FAKE_MAIN

    from pytest_longctx.core.stats import latest_records

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(GW0_LOST_AS_GW1_RUNS_OUT.format(main=str(FAKE_MAIN)))
    args = ("-n", "2", "--longctx-to=4Ki", "--longctx-repeats=2", "--longctx-max-relaunches=0")
    result, output = run_session(pytester, *args)
    records = records_of(output)
    (crashed,) = [r for r in records if r.outcome == "failed"]
    lost = crashed.fingerprint["server"]["worker"]
    assert lost == "gw0"
    handed = [r for r in records if r.outcome == "skipped"]
    assert handed and all("takes no more points" in r.reason for r in handed)
    # the class of what caused it: the lost server, never started again
    assert {r.failure_class for r in handed} == {"start_failed"}
    latest = [r for r in latest_records(records) if r is not crashed]
    assert sorted((r.length, r.repeat) for r in latest) == sorted(
        (length, repeat)
        for length in (1024, 2048, 4096)
        for repeat in (0, 1)
        if (length, repeat) != (crashed.length, crashed.repeat)
    )
    # the other worker measured every point handed back
    assert all(r.outcome == "passed" for r in latest), [(r.outcome, r.reason) for r in latest]
    assert all(r.fingerprint["server"]["worker"] != lost for r in latest)
    assert result.ret == 1  # the crashed point failed the session


def test_under_xdist_points_no_worker_is_left_to_take_are_recorded_as_not_measured(
    pytester: pytest.Pytester,
) -> None:
    """One worker, its server lost for good during its first point: nobody is left to take
    the points it holds nor those still pending. Each gets a record saying it was not
    measured and why (never "handed to the other workers"), the session ends as any does, and
    a resumed session measures them."""
    from pytest_longctx.core.stats import latest_records

    once = pytester.path / "died"
    launched(pytester, "--die-at=4", "--exit-code=-9", f"--once={once}")
    args = ("-n", "1", "--longctx-to=4Ki", "--longctx-repeats=2", "--longctx-max-relaunches=0")
    result, output = run_session(pytester, *args, "-rs")
    assert result.ret == 1, result.stdout.str()  # the crashed point failed the session
    records = records_of(output)
    (crashed,) = [r for r in records if r.outcome == "failed"]
    latest = [r for r in latest_records(records) if r is not crashed]
    assert sorted((r.length, r.repeat) for r in latest) == sorted(
        (length, repeat)
        for length in (1024, 2048, 4096)
        for repeat in (0, 1)
        if (length, repeat) != (crashed.length, crashed.repeat)
    )
    assert all(r.outcome == "skipped" for r in latest), [(r.outcome, r.reason) for r in latest]
    assert all(
        r.reason.endswith(
            "gw0 takes no more points, and no other worker was left to take this one: "
            "not measured (a resumed session measures it)"
        )
        and "vLLM server is gone" in r.reason
        for r in latest
    ), [r.reason for r in latest]
    result.stdout.fnmatch_lines(["*no other worker was left to take this one: not measured*"])
    result, output = run_session(pytester, *args, "--longctx-resume")  # the server lives now
    result.assert_outcomes(passed=6)
