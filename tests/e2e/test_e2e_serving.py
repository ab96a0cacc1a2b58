"""Real vLLM serving: launch from a profile, attach by URL, failures, teardown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from longctx_testing import (
    SWEEP_TEST,
    launch_fake_conftest,
    profile_copy,
    records_of,
    run_folder,
    run_session,
    wait_until_group_is_gone,
)

from pytest_longctx.capacity import GIB, cache_layout, token_capacity
from pytest_longctx.profiles.embedded_models import get_spec

pytestmark = pytest.mark.vllm

CAPACITY_CHECK_TEST = """
import re
import httpx
from pytest_longctx.plan import capacity_check
from pytest_longctx.measure.server_metrics import cache_config_labels

def test_capacity_plan_matches_vllm(longctx_server, longctx_run):
    labels = cache_config_labels(httpx.get(longctx_server.base_url + "/metrics").text)
    check = capacity_check.check_against_server(longctx_run.plan.profile, labels)
    assert check.agrees, check.describe()
    assert longctx_run.findings.capacity_check == check
    log = longctx_server.log_path.read_text()
    printed = re.search(r"KV cache size: ([0-9,]+) tokens", log).group(1).replace(",", "")
    print(f"SERVED block={check.block_size} reported={check.reported_tokens} "
          f"planned={check.planned_tokens} logged={printed} "
          f"max_model_len={longctx_server.max_model_len}")
"""


def test_bad_model_path_fails_every_item_fast(pytester: pytest.Pytester) -> None:
    """Starts its own server: a start vLLM refuses is the subject."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    profile = profile_copy(
        pytester.path,
        "cpu-tiny",
        **{
            'source = "embedded:tiny-llama"': f'source = "{pytester.path / "no-such-model"}"',
        },
    )
    result, output = run_session(pytester, f"--longctx-profile={profile}", "--longctx-to=4Ki")
    result.assert_outcomes(errors=3)
    records = records_of(output)
    assert [r.outcome for r in records] == ["error"] * 3
    for record in records:  # each item: the reason, in one line naming the cause
        assert "the vLLM server exited while starting" in record.reason
        assert "no-such-model" in record.reason.splitlines()[0], record.reason
        assert record.failure_class == "start_failed"


#: Notes the launched server's process group through the plugin's own hook.
NOTE_SERVER_GROUP = """
def pytest_longctx_server_ready(config, base_url, mode, launched):
    with open("server.pgid", "w") as handle:
        handle.write(str(launched.pgid))
"""


def test_launch_mla_model_and_check_capacity(pytester: pytest.Pytester) -> None:
    """cpu-tiny-mla: the reference model's 576-element latent cache, served for real, and
    torn down at the end of the session with nothing left running. Starts its own server:
    the MLA layout is served by no shared one.

    vLLM picks the block size by CPU (16 on AVX2's MLA kernel, 128 on AMX's): the plan is
    checked against whichever it reports, and vLLM's own log line is derived from it."""
    pytester.makepyfile(test_sweep=SWEEP_TEST, test_capacity_check=CAPACITY_CHECK_TEST)
    pytester.makeconftest(NOTE_SERVER_GROUP)
    result, output = run_session(  # random weights: the probe's answer recorded, not checked
        pytester,
        "-s",
        "--longctx-profile=cpu-tiny-mla",
        "--longctx-fidelity=record",
        "-m",
        "len==1Ki or not longctx",
    )
    result.assert_outcomes(passed=2)
    (line,) = [ln for ln in result.outlines if "SERVED " in ln]  # -s: after the file's name
    served = dict(part.split("=") for part in line.split("SERVED ", 1)[1].split())
    block, reported = int(served["block"]), int(served["reported"])
    layout = cache_layout(get_spec("tiny-mla").model_config())
    assert layout.kv_bytes_per_token == 2 * 576 * 2  # 2 layers x (512 + 64) x bf16
    assert reported == token_capacity(layout, GIB, block) == int(served["planned"])
    # vLLM's log line scales the blocks by the session's --max-model-len
    logged = token_capacity(layout, GIB, block, max_model_len=int(served["max_model_len"]))
    assert int(served["logged"]) == logged
    (record,) = records_of(output)
    assert (record.prompt_tokens, record.completion_tokens) == (1024, 32)
    assert record.server_metrics["prefix_cache_hits"] == 0
    assert wait_until_group_is_gone(int((pytester.path / "server.pgid").read_text()))


def test_attach_without_local_tokenizer_uses_the_servers(
    sweep_dir: pytest.Pytester, vllm_url: str
) -> None:
    """A profile naming another model: prompts are built and checked through /tokenize."""
    profile = profile_copy(
        sweep_dir.path, "cpu-tiny", **{'served_name = "tiny-llama"': 'served_name = "elsewhere"'}
    )
    result, output = run_session(
        sweep_dir, f"--longctx-profile={profile}", "--longctx-to=2Ki", url=vllm_url
    )
    result.assert_outcomes(passed=2)
    records = records_of(output)
    assert [r.prompt_tokens for r in records] == [1024, 2048]
    # the probe rides the text too, and the embedded model answers it
    assert [r.fidelity["verdict"] for r in records] == ["correct", "correct"], records
    assert records_of(output)[0].fingerprint["server_mode"] == "attached"


def test_text_prompts(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    result, output = run_session(
        sweep_dir, "--longctx-to=2Ki", "--longctx-prompt-format=text", url=vllm_url
    )
    result.assert_outcomes(passed=2)
    records = records_of(output)
    assert [r.prompt_tokens for r in records] == [1024, 2048]
    # the probe rides the text too, and the embedded model answers it
    assert [r.fidelity["verdict"] for r in records] == ["correct", "correct"], records


def test_attach_to_nothing_errors_every_item(sweep_dir: pytest.Pytester) -> None:
    result, output = run_session(sweep_dir, "--longctx-url=http://127.0.0.1:9", "--longctx-to=2Ki")
    result.assert_outcomes(errors=2)
    reasons = [r.reason for r in records_of(output)]
    assert len(reasons) == 2
    assert all("the server at http://127.0.0.1:9 does not answer" in r for r in reasons)


#: Holds the 2Ki item in flight: notes the server's group, then waits to be signalled.
HOLD_THE_SECOND_POINT = """
import time

#: Each server the session started, as it became ready; None for an attached one.
servers = []

def pytest_longctx_server_ready(config, base_url, mode, launched):
    servers.append(launched)

def pytest_runtest_call(item):
    if item.name.endswith("[len=2Ki-rep=0]"):
        with open("server.pgid", "w") as handle:
            handle.write(str(servers[-1].pgid))
        time.sleep(600)
"""


def start_session(
    pytester: pytest.Pytester, *args: str, stand_in: bool = False
) -> subprocess.Popen[bytes]:
    """A sweep session in its own process, as a terminal, CI or a batch scheduler runs one;
    ``stand_in`` launches the fake server instead of vLLM."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    launch = launch_fake_conftest() if stand_in else ""
    pytester.makeconftest(HOLD_THE_SECOND_POINT + launch)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--longctx-output=reports",
            "--longctx-to=4Ki",
            *args,
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for_file(path: Path, process: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()[0].decode()[-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


@pytest.mark.usefixtures("default_signals")
@pytest.mark.parametrize(
    ("signum", "stand_in"),
    [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGHUP, True)],
    ids=["SIGTERM-vllm", "SIGINT-stand-in", "SIGHUP-stand-in"],
)
def test_a_stop_signal_mid_sweep_ends_the_server_and_keeps_the_records(
    pytester: pytest.Pytester, signum: signal.Signals, stand_in: bool
) -> None:
    """Ctrl-C, CI's cancel (SIGTERM) and a closed terminal (SIGHUP) alike: the finished point
    stays, the one in flight is recorded as interrupted, the reports are written, the exit
    status is pytest's "interrupted", and no process of the server remains. SIGTERM stops a
    real vLLM (its engine process included): it starts its own server, since the stop is the
    subject; the other two take the same path through the session, shown on the stand-in."""
    session = start_session(pytester, stand_in=stand_in)
    wait_for_file(pytester.path / "server.pgid", session)
    group = int((pytester.path / "server.pgid").read_text())
    session.send_signal(signum)
    output = session.communicate(timeout=120)[0].decode()
    assert session.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    records = records_of(pytester.path / "reports")
    assert [(r.length, r.outcome) for r in records] == [(1024, "passed"), (2048, "interrupted")]
    assert signum.name in records[1].reason or signum == signal.SIGINT
    run_dir = run_folder(pytester.path / "reports")
    assert "interrupted" in (run_dir / "report.md").read_text()
    assert (run_dir / "report.html").is_file()
    assert wait_until_group_is_gone(group)
    server = json.loads((run_dir / "server.json").read_text())
    assert (server["pgid"], bool(server["stopped_at"])) == (group, True)


def test_a_killed_session_takes_its_server_with_it(pytester: pytest.Pytester) -> None:
    """SIGKILL runs no teardown: the guard process ends the server's group. The guard does
    not know what the group runs, so the launched stand-in shows it without a vLLM start."""
    session = start_session(pytester, stand_in=True)
    wait_for_file(pytester.path / "server.pgid", session)
    group = int((pytester.path / "server.pgid").read_text())
    session.kill()
    session.communicate(timeout=60)
    assert wait_until_group_is_gone(group, timeout_s=60)
    records = records_of(pytester.path / "reports")
    assert [(r.length, r.outcome) for r in records] == [(1024, "passed")]
