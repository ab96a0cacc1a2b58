"""The stream against the server's own decode: bursts judged chunk by chunk, and the rate."""

from __future__ import annotations

import itertools

import pytest

from pytest_longctx.measure.agreement import Burst, judge_stream, largest_burst

TAU = 0.0022  # the server's per-token time: 2.2 ms, as cpu-tiny decodes on a quiet host


def steady(counts: list[int], tau: float = TAU, start: float = 0.5) -> list[float]:
    """Arrivals of chunks streamed as decoded: each ``k`` tokens ``k * tau`` after the last."""
    return [start + tau * total for total in itertools.accumulate([0, *counts[1:]])]


def rate(times: list[float], counts: list[int], tokens: int) -> float:
    return (tokens - counts[0]) / (times[-1] - times[0])


def test_a_stream_flushed_at_once_is_a_burst_with_both_figures() -> None:
    counts = [1] * 32
    times = [0.5 + index * 2e-6 for index in range(32)]  # 31 gaps of 2 us
    verdict = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU)
    assert verdict is not None and verdict.problem is not None
    assert verdict.burst is not None and verdict.burst.tokens == 31
    assert verdict.server_rate == pytest.approx(1 / TAU)
    assert "the stream delivered 31 tokens within 0.062 ms" in verdict.problem
    assert "the server decoded them at 455 tok/s (in 68 ms)" in verdict.problem
    assert "the stream's decode rate, 500,000.0 tok/s" in verdict.problem
    assert "455" in verdict.problem and "--longctx-strict-stream" in verdict.problem


@pytest.mark.parametrize("interval", [1, 8, 32])
def test_chunks_of_the_stream_interval_streamed_as_decoded_agree(interval: int) -> None:
    tokens = 65
    counts = [1] + [interval] * ((tokens - 1) // interval)
    counts += [tokens - sum(counts)] if sum(counts) < tokens else []
    times = steady(counts)
    verdict = judge_stream(times, counts, tokens, rate(times, counts, tokens), (tokens - 1) * TAU)
    assert verdict is not None and verdict.problem is None
    assert verdict.burst is None


def test_an_uneven_decode_is_not_a_burst() -> None:
    """A busy host: steps alternately three times faster and slower than the mean."""
    gaps = [TAU * (0.3 if index % 2 else 1.7) for index in range(31)]
    times = list(itertools.accumulate([0.5, *gaps]))
    counts = [1] * 32
    verdict = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU)
    assert verdict is not None and verdict.problem is None and verdict.burst is None


def test_a_stall_flushed_mid_stream_is_a_burst_though_the_rate_agrees() -> None:
    # 20 tokens as decoded, then 11 held back and handed over 10 us apart
    times = steady([1] * 21)
    times += [times[-1] + 11 * TAU + index * 1e-5 for index in range(11)]
    counts = [1] * 32
    client = rate(times, counts, 32)
    assert client == pytest.approx(1 / TAU, rel=0.01)  # the rate alone would pass it
    verdict = judge_stream(times, counts, 32, client, 31 * TAU, tolerance=0.25)
    assert verdict is not None and verdict.problem is not None
    assert verdict.burst is not None and verdict.burst.tokens == 10
    assert "32% of the decode in one burst of 10 chunks, beyond the 25% allowed" in verdict.problem
    default = judge_stream(times, counts, 32, client, 31 * TAU)  # 50%: a third is allowed
    assert default is not None and default.problem is None
    assert "the stream delivered 10 tokens" in verdict.problem
    assert "decode rate" not in verdict.problem


def test_a_flush_read_in_pieces_is_one_burst() -> None:
    """A flushed stream read in two pieces: a gap shorter than decoding, not ten times."""
    times = [0.5, *(0.6 + index * 1e-5 for index in range(15))]
    times += [times[-1] + 0.5 * TAU + index * 1e-5 for index in range(16)]
    verdict = largest_burst(times, [1] * 32, TAU)
    # the first flushed chunk came after the stall; the 30 after it came with it
    assert verdict is not None and verdict.tokens == 30 and verdict.chunks == 30


def test_a_little_jitter_is_not_a_burst() -> None:
    times = steady([1] * 32)
    times[10] = times[9] + 1e-5  # one token late, the next on time: two arrive together
    times[11] = times[10] + 1e-5
    counts = [1] * 32
    verdict = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU)
    assert verdict is not None and verdict.burst is not None and verdict.burst.tokens == 2
    assert verdict.problem is None


def test_a_rate_off_the_servers_fails_beyond_the_tolerance() -> None:
    counts = [1] * 32
    times = steady(counts, tau=TAU / 1.4)  # the stream shows a decode 40% faster
    verdict = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU, tolerance=0.25)
    assert verdict is not None and verdict.problem is not None
    assert "+40% off the server's own, 454.5 tok/s (tolerance 25%)" in verdict.problem
    default = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU)
    assert default is not None and default.problem is None  # within 50%


def test_nothing_is_judged_without_the_servers_decode_time() -> None:
    assert judge_stream([0.5, 0.6], [1, 1], 2, 10.0, None) is None
    assert judge_stream([0.5, 0.6], [1, 1], 2, 10.0, 0.0) is None


def test_the_instruments_own_overhead_is_no_disagreement() -> None:
    """A server decoding 8 tokens in 0.1 ms, read in 1 ms: the difference is the client's."""
    counts = [1] * 8
    times = steady(counts, tau=1e-3 / 7)
    verdict = judge_stream(times, counts, 8, rate(times, counts, 8), 1e-4)
    assert verdict is not None and verdict.problem is None


def test_a_stream_in_one_chunk_is_a_burst_of_its_whole_decode() -> None:
    """A starved API server merges the deltas: all 32 tokens in one chunk, no gap to judge and
    no client rate, while the server took 31 token-times to decode them."""
    verdict = judge_stream([1.0], [32], 32, None, 31 * TAU)
    assert verdict is not None and verdict.problem is not None
    assert verdict.burst is not None
    assert (verdict.burst.tokens, verdict.burst.chunks, verdict.burst.span_s) == (31, 1, 0.0)
    assert verdict.burst.first_chunk_tokens == 32
    assert verdict.burst.decode_s == pytest.approx(31 * TAU)
    assert (
        "the stream delivered 32 tokens within 0 ms, all in one chunk; the server decoded them "
        "at 455 tok/s (in 68 ms): 100% of the decode in one burst" in verdict.problem
    )
    assert "decode rate" not in verdict.problem  # no rate without two chunks
    assert "--longctx-strict-stream" in verdict.problem


def test_a_first_chunk_of_many_tokens_is_a_burst_with_the_flush_after_it() -> None:
    """The first chunk brings 20 tokens, the other 12 follow within microseconds."""
    times = [1.0 + index * 1e-5 for index in range(13)]
    counts = [20] + [1] * 12
    verdict = judge_stream(times, counts, 32, rate(times, counts, 32), 31 * TAU)
    assert verdict is not None and verdict.problem is not None
    assert verdict.burst is not None and verdict.burst.tokens == 31
    assert verdict.burst.first_chunk_tokens == 20
    assert "the stream delivered 32 tokens within 0.12 ms, 20 of them in its first chunk" in (
        verdict.problem
    )


def test_a_small_first_chunk_within_the_tolerance_agrees() -> None:
    """Four tokens in the first chunk of 17, the rest streamed as decoded: 3 of 16 early."""
    counts = [4, 4, 4, 4, 1]
    times = steady(counts)
    verdict = judge_stream(times, counts, 17, rate(times, counts, 17), 16 * TAU)
    assert verdict is not None and verdict.problem is None
    assert verdict.burst is not None and verdict.burst.tokens == 3
    strict = judge_stream(times, counts, 17, rate(times, counts, 17), 16 * TAU, tolerance=0.1)
    assert strict is not None and strict.problem is not None
    assert "the stream delivered 4 tokens within 0 ms, all in one chunk" in strict.problem


def test_a_first_chunk_decoded_faster_than_the_instrument_reads_is_no_burst() -> None:
    """Eight tokens in one chunk that the server decoded in 1 ms: below what a point fails for."""
    verdict = judge_stream([1.0], [8], 8, None, 1e-3)
    assert verdict is not None and verdict.problem is None


def held_back(total: int, held: int, tau: float = TAU) -> list[float]:
    """``total`` one-token chunks streamed as decoded but the last ``held``: those arrive
    together after the stall, 10 us apart; the first of them is as late as its decode, so
    the burst is the ``held - 1`` after it."""
    times = steady([1] * (total - held), tau)
    return times + [times[-1] + held * tau + index * 1e-5 for index in range(held)]


def test_a_burst_of_exactly_the_tolerances_share_agrees_and_one_more_token_does_not() -> None:
    """11 tokens, 10 decoded after the first: at 50%, a burst of 5 is allowed, 6 is not."""
    counts = [1] * 11
    for held, burst, agrees in ((6, 5, True), (7, 6, False)):
        times = held_back(11, held)
        verdict = judge_stream(times, counts, 11, rate(times, counts, 11), 10 * TAU)
        assert verdict is not None and verdict.burst is not None
        assert verdict.burst.tokens == burst
        assert (verdict.problem is None) is agrees, verdict.problem


def test_a_burst_must_bring_more_than_two_tokens() -> None:
    """At a tolerance of 10% of 10 tokens (one), a burst of two tokens is still one chunk
    early, jitter; three are a burst. The server takes 10 ms a token: the time is no excuse."""
    counts, tau = [1] * 11, 0.01
    for held, agrees in ((3, True), (4, False)):
        times = held_back(11, held, tau)
        verdict = judge_stream(times, counts, 11, rate(times, counts, 11), 10 * tau, 0.1)
        assert verdict is not None and verdict.burst is not None
        assert verdict.burst.tokens == held - 1
        assert (verdict.problem is None) is agrees, verdict.problem


def test_a_burst_disagrees_only_by_more_than_5_ms_of_decode_ahead_of_its_arrival() -> None:
    """The whole stream in one chunk: the lead is the server's decode time itself."""
    for decode_s, agrees in ((0.004, True), (0.006, False)):
        verdict = judge_stream([1.0], [8], 8, None, decode_s)
        assert verdict is not None and verdict.burst is not None
        assert (verdict.problem is None) is agrees, decode_s
    # a first chunk of 6 and one more token 0.4 ms after it: 6 tokens the server took 5.2 ms
    # (or 6 ms) to decode, arriving over 0.4 ms: 4.8 ms ahead agrees, 5.6 ms does not
    for decode_s, agrees in ((0.0052, True), (0.006, False)):
        verdict = judge_stream([1.0, 1.0004], [6, 1], 7, None, decode_s)
        assert verdict is not None and verdict.burst is not None
        assert (verdict.burst.tokens, verdict.burst.chunks) == (6, 2)
        assert verdict.burst.span_s == pytest.approx(0.0004)
        assert (verdict.problem is None) is agrees, decode_s
    assert "7 tokens within 0.4 ms, 6 of them in its first chunk" in verdict.problem
    assert "100% of the decode in one burst of 2 chunks, beyond the 50% allowed" in verdict.problem
    whole = judge_stream([1.0], [8], 8, None, 0.006)
    assert whole is not None and "100% of the decode in one burst, beyond" in whole.problem


def test_a_rate_exactly_the_tolerance_off_agrees() -> None:
    """3 tokens, 2 decoded in 0.5 s: 4 tok/s on the server; 6 tok/s (+50%) and 2 tok/s (-50%)
    are within 50%, a hair more is not."""
    times = [1.0, 1.25, 1.5]
    for client, agrees in ((6.0, True), (2.0, True), (6.01, False), (1.99, False)):
        verdict = judge_stream(times, [1, 1, 1], 3, client, 0.5)
        assert verdict is not None and verdict.server_rate == 4.0
        assert (verdict.problem is None) is agrees, client


def test_a_rate_disagrees_only_when_its_decode_time_is_5_ms_off() -> None:
    """The server decoded 2 tokens after the first in 10 ms; the stream's rate says 4 ms (6 ms
    off: disagrees) or 5.5 ms (4.5 ms off: the instrument's own, agrees), though both rates are
    more than 50% off. The stream's decode time counts the tokens after the first."""
    for span_s, agrees in ((0.004, False), (0.0055, True)):
        times = [1.0, 1.0 + span_s / 2, 1.0 + span_s]
        verdict = judge_stream(times, [1, 1, 1], 3, 2 / span_s, 0.010)
        assert verdict is not None and verdict.burst is None
        assert (verdict.problem is None) is agrees, span_s


def test_two_tokens_are_judged_by_their_one_gap_and_one_token_not_at_all() -> None:
    verdict = judge_stream([0.5, 0.6], [1, 1], 2, 10.0, 0.01)
    assert verdict is not None and verdict.server_rate == pytest.approx(100.0)
    assert verdict.problem is not None and "decode rate, 10.0 tok/s" in verdict.problem
    assert judge_stream([0.5], [1], 1, None, 0.01) is None


def test_a_chunk_is_held_back_when_it_came_within_a_tenth_of_its_decode_time() -> None:
    """Chunks of 8 at a server taking 2.2 ms a token: one that came 9% of its 17.6 ms after
    the one before was held back; one that came after 11% of it is an uneven step."""
    counts = [1, 8, 8, 8, 8]
    for share, held in ((0.09, True), (0.11, False)):
        times = steady(counts)
        times[2] = times[1] + share * 8 * TAU
        burst = largest_burst(times, counts, TAU)
        assert (burst is not None) is held, share
    assert burst is None and largest_burst(steady(counts), counts, TAU) is None
    times[2] = times[1] + 0.09 * 8 * TAU
    assert largest_burst(times, counts, TAU) == Burst(
        8.0, 1, pytest.approx(0.09 * 8 * TAU), 8 * TAU
    )


def test_a_run_of_held_back_chunks_ends_at_a_chunk_that_came_on_time() -> None:
    """A first chunk of 100 tokens, then one token exactly its decode time later: that one
    was streamed as decoded, the burst is the first chunk's 99 alone."""
    assert largest_burst([1.0, 1.25], [100, 1], 0.25) == Burst(99.0, 1, 0.0, 24.75, 100)
    # a first chunk of two tokens is a burst of one (vLLM sends the first token alone)
    assert largest_burst([1.0, 1.25], [2, 1], 0.25) == Burst(1.0, 1, 0.0, 0.25, 2)
    assert largest_burst([1.0, 1.25], [1, 1], 0.25) is None


def test_the_largest_burst_is_the_run_ten_times_faster_than_its_decode() -> None:
    """At 10 ms a token: one token 0.5 ms after the one before is a burst; the two after it,
    5 ms apart, continue the run (sooner than their decode) but not ten times faster: the
    burst stays the one token. Of two bursts of as many tokens, the first is kept."""
    times = [0.0, 0.0005, 0.0055, 0.0105]
    assert largest_burst(times, [1, 1, 1, 1], 0.01) == Burst(1.0, 1, pytest.approx(0.0005), 0.01)
    twice = [*times, 0.1, 0.1002]
    assert largest_burst(twice, [1] * 6, 0.01) == Burst(1.0, 1, pytest.approx(0.0005), 0.01)
