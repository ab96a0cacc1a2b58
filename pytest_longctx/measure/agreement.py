"""Whether a stream shows the decode the server did: the client's figures against vLLM's own.

A stream can hand over tokens later than they were decoded, then all at once: an API server
starved of CPU flushes a whole stream late, and the client's decode rate becomes fiction
(62,017 tok/s from a server decoding 478). vLLM's engine stamps every token as it leaves the
model (``vllm:request_decode_time_seconds``, read from ``/metrics`` around the point), so each
point is checked two ways:

* **Rate**: the client's decode throughput and the server's, ``(N - 1) / decode time``, may
  differ by at most the tolerance.
* **Bursts**, chunk by chunk: a chunk of ``k`` tokens took the server ``k`` times its
  per-token time ``tau`` to decode. Chunks that arrive, together, within a tenth of their
  decode time after the chunk before them were not streamed as decoded but held back and
  handed over at once: a burst. A burst of more than the tolerance's share of the decoded
  tokens (two at least) disagrees. A chunk of eight tokens eight token-times after the
  previous one is no burst, so a large ``--stream-interval`` or speculative decoding passes,
  and so does a decode that runs unevenly on a busy host (its fast steps are not ten times
  the mean). The first chunk has no gap before it, but its tokens after the first arrived
  with it, within 0 s of the first: an API server starved of CPU merges the deltas, and a
  first chunk of ``k`` tokens (a whole stream in one chunk, at worst, with no client rate to
  compare) is a burst of ``k - 1`` tokens the server took ``(k - 1) * tau`` to decode, judged
  as any other (vLLM sends the first token alone, whatever its stream interval).

Neither finds a disagreement over less than :data:`MIN_DISAGREEMENT_S` of decode time. A
disagreeing point keeps the server's decode figure (measure/measurement.py), or fails with
``--longctx-strict-stream``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: How far the client's decode rate may stray from the server's, and what share of the decoded
#: tokens may arrive in one burst (``--longctx-stream-tolerance``). On a 2-core host shared
#: with other work, a serial cpu-tiny sweep saw rates within 7% of the server's and bursts of
#: up to a third of a 32-token decode; the bursts this check exists for held back all of it.
DEFAULT_STREAM_TOLERANCE = 0.5
#: A chunk that arrives within ``k * tau / BURST_FACTOR`` of the previous one was held back.
BURST_FACTOR = 10.0
#: A burst must bring at least this many tokens: one chunk early is jitter.
MIN_BURST_TOKENS = 2.0
#: Disagreements of less decode time than this are the instrument's own overhead (reading a
#: chunk, a thread switch), not the server's: neither check counts them.
MIN_DISAGREEMENT_S = 0.005
TOLERANCE_OPTION = "--longctx-stream-tolerance"
STRICT_OPTION = "--longctx-strict-stream"


@dataclass(frozen=True)
class Burst:
    """The largest run of chunks that each arrived too soon after the previous one."""

    tokens: float  # tokens the run's chunks brought (the first chunk's: all but its first)
    chunks: int
    span_s: float  # from the chunk before the run (or the first chunk) to the run's last chunk
    decode_s: float  # what the server took for those tokens: tokens * tau
    #: The first chunk's tokens when the run begins with it (it carried several), else 0.
    first_chunk_tokens: float = 0.0


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
    """The run of chunks (after the first) with the most tokens that arrived, as a whole,
    within a :data:`BURST_FACTOR`-th of their decode time; None when there is none.

    A run starts at a chunk that came that soon after the previous one, or at a first chunk
    of several tokens (all but its first arrived within 0 s), and goes on through chunks that
    came sooner than their own decode time (a flush read in several pieces)."""
    best: Burst | None = None
    tokens, chunks, started = 0.0, 0, 0.0
    first = token_counts[0] if token_times_s and token_counts[0] > 1 else 0.0
    if first:
        tokens, chunks, started = first - 1, 1, token_times_s[0]
        best = Burst(tokens, chunks, 0.0, tokens * per_token_s, first)
    for index in range(1, len(token_times_s)):
        gap = token_times_s[index] - token_times_s[index - 1]
        decode_s = token_counts[index] * per_token_s
        if not chunks and gap * BURST_FACTOR < decode_s:
            started = token_times_s[index - 1]
        elif not chunks or gap >= decode_s:
            tokens, chunks, first = 0.0, 0, 0.0
            continue
        tokens += token_counts[index]
        chunks += 1
        span_s = token_times_s[index] - started
        if span_s * BURST_FACTOR < tokens * per_token_s and (best is None or tokens > best.tokens):
            best = Burst(tokens, chunks, span_s, tokens * per_token_s, first)
    return best


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
    if (
        burst is not None
        and burst.tokens > max(tolerance * (completion_tokens - 1), MIN_BURST_TOKENS)
        and burst.decode_s - burst.span_s > MIN_DISAGREEMENT_S
    ):
        problems.append(
            f"the stream delivered {_arrivals(burst)}; the server decoded them at "
            f"{server_rate:,.0f} tok/s (in {_duration(burst.decode_s)}): "
            f"{burst.tokens / (completion_tokens - 1):.0%} of the decode in one burst"
            + (f" of {burst.chunks} chunks" if burst.chunks > 1 else "")
            + f", beyond the {tolerance:.0%} allowed"
        )
    client_span_s = (completion_tokens - 1) / client_rate if client_rate else None
    if (
        client_rate is not None
        and client_span_s is not None
        and abs(client_rate / server_rate - 1) > tolerance
        and abs(client_span_s - server_decode_s) > MIN_DISAGREEMENT_S
    ):
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
            f"point's ({TOLERANCE_OPTION} sets the tolerance; such a point keeps the server's "
            f"decode figure, or fails with {STRICT_OPTION})"
        )
    return StreamAgreement(client_rate, server_rate, tolerance, burst, problem)


def _arrivals(burst: Burst) -> str:
    """What arrived how fast: ``31 tokens within 0.062 ms`` after the chunk before them; a
    run that begins with the first chunk counts that chunk's first token too."""
    within = _duration(burst.span_s)
    if not burst.first_chunk_tokens:
        return f"{burst.tokens:,.0f} tokens within {within}"
    if burst.chunks == 1:
        return f"{burst.tokens + 1:,.0f} tokens within {within}, all in one chunk"
    return (
        f"{burst.tokens + 1:,.0f} tokens within {within}, "
        f"{burst.first_chunk_tokens:,.0f} of them in its first chunk"
    )


def _duration(seconds: float) -> str:
    """Milliseconds to two significant figures (``0.08 ms``, ``67 ms``); seconds above 10 s."""
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    milliseconds = seconds * 1e3
    if milliseconds >= 10:
        return f"{milliseconds:,.0f} ms"
    return f"{milliseconds:.2g} ms" if milliseconds > 0 else "0 ms"
