"""The instrument against real vLLM: exact tokens, cold prefills, TTFT growing with length."""

from __future__ import annotations

import pytest
from longctx_testing import (
    WARMUP_OPTION,
    assert_bursts_kept_with_the_servers_figure,
    chunk_counts,
    records_of,
    run_folder,
    run_session,
)

pytestmark = pytest.mark.vllm


def test_sweep_1ki_to_4ki_two_repeats(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """On this repository's 2-core host, shared with other work, a point in six or so has its
    stream held back; it is kept with the server's decode figure (the default), and which
    figure each point has is checked."""
    # the profile's three warm-ups: the stream interval is read from them together (a lone
    # one a busy host merged whole after its first token read as an interval of 23)
    result, output = run_session(
        sweep_dir, "--longctx-to=4Ki", "--longctx-repeats=2", f"{WARMUP_OPTION}=3", url=vllm_url
    )
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
        # (a host busy enough can hold back every chunk of a point: none is then one token)
        assert sum(k * n for k, n in stream["tokens_per_chunk"]) == 32
        prefix = "stream_" if stream["decode_source"] == "server" else ""
        # an inter-token latency wherever a chunk after the first carried one token (a busy
        # host's API server can merge a whole point's decode into one or two chunks)
        counts = chunk_counts(stream)
        if 1 in counts[1:]:
            assert record.figures[f"{prefix}itl_median"] > 0
        else:
            assert f"{prefix}itl_median" not in record.figures
        chunk_gaps = f"{prefix}chunk_gap_median" in record.figures
        # chunk gaps only where a chunk after the first carried several tokens (a first
        # chunk of two, which a busy host makes, leaves every gap one token's)
        if stream["tokens_per_chunk"] == [[1, 32]]:
            assert not chunk_gaps
        if chunk_gaps:
            assert any(tokens > 1 for tokens, _ in stream["tokens_per_chunk"])
    assert records[0].fingerprint["stream"]["stream_interval"] == 1
    report = (run_folder(output) / "report.md").read_text()
    assert "- Streaming:" not in report  # one token a chunk: nothing to say
    # the server computed four times the prompt at 4Ki: its own prefill time says so however
    # busy the host (the client's TTFT of one point can carry a stall of its own)
    prefill = {
        n: sum(r.figures["server_prefill"] for r in records if r.length == n) for n in (1024, 4096)
    }
    assert prefill[4096] > prefill[1024], prefill
    assert run_folder(output).name == records[0].run_id

    # each point kept the stream's figure or, where the record shows a burst or a rate
    # beyond the tolerance (a busy host held the stream back), the server's
    assert_bursts_kept_with_the_servers_figure(records, report)


def test_repeats_of_a_length_are_cold(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """Three repeats of 4Ki, each cold by the server's own count: its prefix cache was asked
    for every prompt token and found none, and it computed them all. (Their prefill times say
    the same on an idle host, ~10x apart from a cached repeat, but a busy one moves them by 4x:
    the counters are the evidence.) About prefill: a stream that a host busy with other work
    held back keeps the server's decode figure (the default)."""
    result, output = run_session(sweep_dir, "-m", "len==4Ki", "--longctx-repeats=3", url=vllm_url)
    result.assert_outcomes(passed=3)
    counted = [r.server_metrics for r in records_of(output)]
    assert len(counted) == 3
    for metrics in counted:
        assert metrics["requests"] == 1, metrics
        assert metrics["prompt_tokens"] == 4096, metrics
        assert metrics["prefix_cache_queries"] == 4096, metrics
        assert metrics["prefix_cache_hits"] == 0, metrics
        assert metrics["cached_prompt_tokens"] == 0, metrics
