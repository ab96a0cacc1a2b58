"""Whether a stream shows the decode the server did: the client's figures against vLLM's own.

A stream can hand over tokens later than they were decoded, then all at once: an API server
starved of CPU flushes a whole stream late, and the client's decode rate becomes fiction
(62,017 tok/s from a server decoding 478). vLLM's engine stamps every token as it leaves the
model (``vllm:request_decode_time_seconds``, read from ``/metrics`` around the point), so each
point is checked two ways:

* **Rate**: the client's decode throughput and the server's, ``(N - 1) / decode time``, may
  differ by at most the tolerance.
* **Bursts**, chunk by chunk: a chunk's ``k`` tokens took the server ``k`` times its per-token
  time ``tau`` to decode, so a run of chunks that brings ``T`` tokens within ``S`` seconds
  arrived ``T - S / tau`` tokens ahead of the decode. The largest such run is the stream's
  burst, and more than the tolerance's share of the decoded tokens ahead (two at least) fails
  the point. A chunk of eight tokens eight token-times after the previous one is no burst, so
  a large ``--stream-interval`` or speculative decoding passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: How far the client's decode rate may stray from the server's, and what share of the decoded
#: tokens may arrive ahead of the server's decode in one burst (``--longctx-stream-tolerance``).
DEFAULT_STREAM_TOLERANCE = 0.25
#: A burst must bring at least this many tokens ahead of the decode: one token early is jitter.
MIN_BURST_TOKENS = 2.0
TOLERANCE_OPTION = "--longctx-stream-tolerance"
KEEP_OPTION = "--longctx-allow-bursts"


@dataclass(frozen=True)
class Burst:
    """The run of chunks that arrived furthest ahead of the server's decode."""

    tokens: float  # tokens the run's chunks brought (after its first chunk)
    span_s: float  # from its first chunk's arrival to its last's
    ahead_tokens: float  # tokens - span_s / tau
    decode_s: float  # what the server took for those tokens: tokens * tau


@dataclass(frozen=True)
class StreamAgreement:
    """A point's stream against the server's decode; ``problem`` is None when they agree."""

    client_rate: float | None
    server_rate: float | None
    tolerance: float
    burst: Burst | None
    problem: str | None


def largest_burst(
    token_times_s: Sequence[float], token_counts: Sequence[float], per_token_s: float
) -> Burst | None:
    """The run of chunks (after the first) furthest ahead of a decode of ``per_token_s`` a
    token; None with fewer than two chunks."""
    if len(token_times_s) < 2 or per_token_s <= 0:
        return None
    start = token_times_s[0]
    lowest, lowest_at = 0.0, 0  # the lead (tokens so far - elapsed / tau) at chunk 0 is 0
    cumulative = [0.0]
    best: tuple[float, int, int] | None = None
    for index in range(1, len(token_times_s)):
        cumulative.append(cumulative[-1] + token_counts[index])
        lead = cumulative[index] - (token_times_s[index] - start) / per_token_s
        if best is None or lead - lowest > best[0]:
            best = (lead - lowest, lowest_at, index)
        if lead < lowest:
            lowest, lowest_at = lead, index
    assert best is not None
    ahead, first, last = best
    tokens = cumulative[last] - cumulative[first]
    return Burst(
        tokens=tokens,
        span_s=token_times_s[last] - token_times_s[first],
        ahead_tokens=ahead,
        decode_s=tokens * per_token_s,
    )


def judge_stream(
    token_times_s: Sequence[float],
    token_counts: Sequence[float],
    completion_tokens: int,
    client_rate: float | None,
    server_decode_s: float | None,
    tolerance: float = DEFAULT_STREAM_TOLERANCE,
) -> StreamAgreement | None:
    """The stream against the server's decode time; None when the server's is unknown."""
    if not server_decode_s or server_decode_s <= 0 or completion_tokens < 2:
        return None
    server_rate = (completion_tokens - 1) / server_decode_s
    burst = largest_burst(token_times_s, token_counts, 1.0 / server_rate)
    problems = []
    if burst is not None and burst.ahead_tokens > max(
        tolerance * (completion_tokens - 1), MIN_BURST_TOKENS
    ):
        problems.append(
            f"the stream delivered {burst.tokens:,.0f} tokens within {_duration(burst.span_s)}; "
            f"the server decoded them at {server_rate:,.0f} tok/s (in "
            f"{_duration(burst.decode_s)}): {burst.ahead_tokens:,.0f} of {completion_tokens - 1} "
            f"arrived ahead of the decode, beyond the {tolerance:.0%} allowed"
        )
    if client_rate is not None and abs(client_rate / server_rate - 1) > tolerance:
        problems.append(
            f"the stream's decode rate, {client_rate:,.1f} tok/s, is "
            f"{client_rate / server_rate - 1:+.0%} off the server's own, {server_rate:,.1f} tok/s "
            f"(tolerance {tolerance:.0%})"
        )
    problem = None
    if problems:
        problem = (
            "; ".join(problems)
            + f". The stream does not show the server's decode: its figures are not this "
            f"point's ({TOLERANCE_OPTION} sets the tolerance; {KEEP_OPTION} keeps such points "
            "with the server's decode figure)"
        )
    return StreamAgreement(client_rate, server_rate, tolerance, burst, problem)


def _duration(seconds: float) -> str:
    """Milliseconds to two significant figures (``0.08 ms``, ``67 ms``); seconds above 10 s."""
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    milliseconds = seconds * 1e3
    if milliseconds >= 10:
        return f"{milliseconds:,.0f} ms"
    return f"{milliseconds:.2g} ms" if milliseconds > 0 else "0 ms"
