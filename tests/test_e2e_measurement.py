"""The instrument against real vLLM: exact tokens, cold prefills, TTFT growing with length."""

from __future__ import annotations

import statistics

import pytest
from longctx_testing import records_of, run_folder, run_session

pytestmark = pytest.mark.vllm


def test_sweep_1ki_to_4ki_two_repeats(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    result, output = run_session(sweep_dir, "--longctx-to=4Ki", "--longctx-repeats=2", url=vllm_url)
    result.assert_outcomes(passed=6)
    records = records_of(output)
    assert [(r.length, r.repeat) for r in records] == [
        (1024, 0),
        (2048, 0),
        (4096, 0),
        (1024, 1),
        (2048, 1),
        (4096, 1),
    ]
    for record in records:
        assert record.outcome == "passed"
        assert record.prompt_tokens == record.length
        assert record.completion_tokens == 32  # cpu-tiny's decode length, exactly
        assert record.figures["ttft"] > 0
        assert record.figures["decode_throughput"] > 0
        # the server's own view: every prompt token computed, none served from its cache
        assert record.server_metrics["prompt_tokens"] == record.length
        assert record.server_metrics["prefix_cache_hits"] == 0
        assert record.server_metrics["cached_prompt_tokens"] == 0
        assert record.figures["server_prefill"] > 0
        # one token a chunk, counted from the running usage: its gaps are inter-token latencies
        assert record.stream["token_count_source"] == "usage"
        assert record.stream["stream_interval"] == 1
        assert record.stream["tokens_per_chunk"] == [[1, 32]]
        assert record.stream["per_token_gaps"] is True
        assert record.stream["agreement"] == "agrees"
        assert record.figures["itl_median"] > 0 and "chunk_gap_median" not in record.figures
    assert records[0].fingerprint["stream"]["stream_interval"] == 1
    fastest = {n: min(r.figures["ttft"] for r in records if r.length == n) for n in (1024, 4096)}
    assert fastest[4096] > fastest[1024], fastest
    assert run_folder(output).name == records[0].run_id


def test_repeats_of_a_length_are_cold(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """Three repeats of 4Ki: were the prefix cache hit, repeats would be ~10x faster. About
    prefill: a stream that a host busy with other work held back keeps the server's decode
    figure (``--longctx-allow-bursts``) rather than fail a point this test does not judge."""
    result, output = run_session(
        sweep_dir, "-m", "len==4Ki", "--longctx-repeats=3", "--longctx-allow-bursts", url=vllm_url
    )
    result.assert_outcomes(passed=3)
    ttfts = [r.figures["server_prefill"] for r in records_of(output)]
    assert all(r.server_metrics["prefix_cache_hits"] == 0 for r in records_of(output))
    assert min(ttfts) > statistics.median(ttfts) / 3, ttfts
