"""The instrument against real vLLM: exact tokens, cold prefills, TTFT growing with length."""

from __future__ import annotations

import statistics

import pytest
from longctx_testing import (
    assert_bursts_kept_with_the_servers_figure,
    records_of,
    run_folder,
    run_session,
)

pytestmark = pytest.mark.vllm


def test_sweep_1ki_to_4ki_two_repeats(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """On this repository's 2-core host, shared with other work, a point in six or so has its
    stream held back; it is kept with the server's decode figure (the default), and which
    figure each point has is checked."""
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
        # one token a chunk (but for any the server coalesced while the stream fell behind),
        # counted from the running usage: the one-token chunks' gaps are inter-token latencies
        stream = record.stream
        assert stream["token_count_source"] == "usage"
        assert stream["stream_interval"] == 1 and stream["per_token_gaps"] is True
        assert sum(k * n for k, n in stream["tokens_per_chunk"]) == 32
        assert stream["tokens_per_chunk"][0][0] == 1
        prefix = "stream_" if stream["decode_source"] == "server" else ""
        assert record.figures[f"{prefix}itl_median"] > 0
        chunk_gaps = f"{prefix}chunk_gap_median" in record.figures
        assert chunk_gaps == (stream["tokens_per_chunk"] != [[1, 32]])
    assert records[0].fingerprint["stream"]["stream_interval"] == 1
    report = (run_folder(output) / "report.md").read_text()
    assert_bursts_kept_with_the_servers_figure(records, report)
    assert "- Streaming:" not in report  # one token a chunk: nothing to say
    # the server computed four times the prompt at 4Ki: its own prefill time says so however
    # busy the host (the client's TTFT of one point can carry a stall of its own)
    prefill = {
        n: sum(r.figures["server_prefill"] for r in records if r.length == n) for n in (1024, 4096)
    }
    assert prefill[4096] > prefill[1024], prefill
    assert run_folder(output).name == records[0].run_id


def test_repeats_of_a_length_are_cold(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """Three repeats of 4Ki: were the prefix cache hit, repeats would be ~10x faster. About
    prefill: a stream that a host busy with other work held back keeps the server's decode
    figure (the default) rather than fail a point this test does not judge."""
    result, output = run_session(sweep_dir, "-m", "len==4Ki", "--longctx-repeats=3", url=vllm_url)
    result.assert_outcomes(passed=3)
    ttfts = [r.figures["server_prefill"] for r in records_of(output)]
    assert all(r.server_metrics["prefix_cache_hits"] == 0 for r in records_of(output))
    assert min(ttfts) > statistics.median(ttfts) / 3, ttfts
