"""Real vLLM serving: launch from a profile, attach by URL, failures, teardown, secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, records_of, run_folder, run_session

from pytest_longctx.profiles import PROFILE_DIR

pytestmark = pytest.mark.vllm

SECRET = "sk-longctx-test-8c1f3e9a77"

#: Kills the launched server after the first sweep item, and notes its process group.
KILL_AFTER_FIRST = """
import os, signal
from pytest_longctx.stash import RUN_KEY

def pytest_runtest_teardown(item):
    run = item.config.stash[RUN_KEY]
    if item.name.endswith("[len=1Ki-rep=0]") and run.launched is not None:
        pid = run.launched.process.pid
        with open("server.pgid", "w") as handle:
            handle.write(str(pid))
        os.killpg(pid, signal.SIGKILL)
"""

CAPACITY_CHECK_TEST = """
import httpx
from pytest_longctx import capacity_plan
from pytest_longctx.server_metrics import cache_config_labels

def test_capacity_plan_matches_vllm(longctx_server, longctx_run):
    labels = cache_config_labels(httpx.get(longctx_server.base_url + "/metrics").text)
    check = capacity_plan.check_against_server(longctx_run.plan.profile, labels)
    print("CHECK", check.describe())
    assert check.agrees, check.describe()
    assert longctx_run.capacity_check == check
    log = longctx_server.log_path.read_text()
    line = next(l for l in log.splitlines() if "KV cache size:" in l)
    print("LOG", line.strip())
"""


def profile_copy(directory: Path, name: str, **changes: str) -> Path:
    """A user's profile file: a shipped one with some lines replaced."""
    text = (PROFILE_DIR / f"{name}.toml").read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = directory / f"{name}-custom.toml"
    path.write_text(text)
    return path


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_launch_with_api_key_then_the_server_dies(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launch cpu-tiny (API key required), warm up, measure one point; then kill the server:
    the remaining items fail at once with the log tail, and nothing is left running."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(KILL_AFTER_FIRST)
    profile = profile_copy(
        pytester.path,
        "cpu-tiny",
        **{"[serving]\n": '[serving]\napi_key_env = "LONGCTX_TEST_KEY"\n'},
    )
    monkeypatch.setenv("LONGCTX_TEST_KEY", SECRET)
    result, output = run_session(pytester, f"--longctx-profile={profile}", "--longctx-to=4Ki")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        ["*the vLLM server is gone (exit code -9; log *server.log); last lines:*"]
    )
    records = records_of(output)
    assert [r.outcome for r in records] == ["passed", "failed", "failed"]
    assert records[0].prompt_tokens == 1024 and records[0].completion_tokens == 32
    assert all("the vLLM server is gone" in r.reason for r in records[1:])
    fingerprint = records[0].fingerprint
    assert fingerprint["server_mode"] == "launched"
    assert "--kv-cache-memory-bytes" in fingerprint["server_command"]
    assert fingerprint["server_env"]["VLLM_API_KEY"] == "***"
    assert fingerprint["vllm_version"] == "0.32.0"
    # the capacity plan against vLLM's own report of the 1 GiB cache: 2 x 2 x 1 x 64 x 2 B/token
    assert fingerprint["kv_cache_check"]["planned_tokens"] == 2_097_152
    assert fingerprint["kv_cache_check"]["reported_tokens"] == 2_097_152
    log = (run_folder(output) / "server.log").read_text()
    assert "Application startup complete" in log
    assert group_is_gone(int((pytester.path / "server.pgid").read_text()))
    assert files_containing(pytester.path, SECRET.encode()) == []


def test_bad_model_path_fails_every_item_fast(pytester: pytest.Pytester) -> None:
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
    for record in records:  # each item: the reason, then the server log's last lines
        assert "the vLLM server exited while starting" in record.reason
        assert "last lines:" in record.reason and "no-such-model" in record.reason


#: Notes the launched server's process group through the plugin's own hook.
NOTE_SERVER_GROUP = """
from pytest_longctx.stash import RUN_KEY

def pytest_longctx_server_ready(config, base_url, mode):
    with open("server.pgid", "w") as handle:
        handle.write(str(config.stash[RUN_KEY].launched.process.pid))
"""


def test_launch_mla_model_and_check_capacity(pytester: pytest.Pytester) -> None:
    """cpu-tiny-mla: the reference model's 576-element latent cache, served for real, and
    torn down at the end of the session with nothing left running."""
    pytester.makepyfile(test_sweep=SWEEP_TEST, test_capacity_check=CAPACITY_CHECK_TEST)
    pytester.makeconftest(NOTE_SERVER_GROUP)
    result, output = run_session(
        pytester, "-s", "--longctx-profile=cpu-tiny-mla", "-m", "len==1Ki or not longctx"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*CHECK KV cache of 1,073,741,824 B: plan 466,032 tokens, "
            "vLLM 466,032 tokens (block 16)*",
            "LOG *CPU KV cache size: 466,032 tokens*",
        ]
    )
    (record,) = records_of(output)
    assert (record.prompt_tokens, record.completion_tokens) == (1024, 32)
    assert record.server_metrics["prefix_cache_hits"] == 0
    assert group_is_gone(int((pytester.path / "server.pgid").read_text()))


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
    assert [r.prompt_tokens for r in records_of(output)] == [1024, 2048]
    assert records_of(output)[0].fingerprint["server_mode"] == "attached"


def test_text_prompts(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    result, output = run_session(
        sweep_dir, "--longctx-to=2Ki", "--longctx-prompt-format=text", url=vllm_url
    )
    result.assert_outcomes(passed=2)
    assert [r.prompt_tokens for r in records_of(output)] == [1024, 2048]


def test_attach_to_nothing_errors_every_item(sweep_dir: pytest.Pytester) -> None:
    result, output = run_session(sweep_dir, "--longctx-url=http://127.0.0.1:9", "--longctx-to=2Ki")
    result.assert_outcomes(errors=2)
    reasons = [r.reason for r in records_of(output)]
    assert len(reasons) == 2
    assert all("the server at http://127.0.0.1:9 does not answer" in r for r in reasons)


def test_sigterm_stops_the_session_and_the_server(pytester: pytest.Pytester) -> None:
    """Ctrl-C (SIGINT) mid-sweep: the records so far stay, the server's group is ended."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest("""
import os, signal
from pytest_longctx.stash import RUN_KEY

def pytest_runtest_call(item):
    run = item.config.stash[RUN_KEY]
    if item.name.endswith("[len=2Ki-rep=0]"):
        with open("server.pgid", "w") as handle:
            handle.write(str(run.launched.process.pid))
        os.kill(os.getpid(), signal.SIGINT)
""")
    result, output = run_session(pytester, "--longctx-to=4Ki")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert [(r.length, r.outcome) for r in records_of(output)] == [(1024, "passed")]
    assert group_is_gone(int((pytester.path / "server.pgid").read_text()))
    assert (run_folder(output) / "report.md").exists()
