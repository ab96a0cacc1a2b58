"""What one streamed request measured, and the statistics of its token times."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


#: Characters of the completion kept with a measurement: enough for any probe's answer, after
#: a reasoning block of a few thousand tokens too (the answer follows the thinking).
COMPLETION_HEAD_CHARS = 32_000


@dataclass(frozen=True)
class ServerTiming:
    """The server's own timing of one request: vLLM's per-request ``metrics`` (served with
    ``--enable-per-request-metrics``, stats logging on), which ride on the stream's final
    usage chunk (``stream_options.include_usage``) in every release from 0.25.1 to 0.34
    (``build_per_request_timing_metrics``, ``entrypoints/generate/base/serving.py``). Each
    figure is None where vLLM left it out (a timestamp it did not have).

    ``ttft_s``: scheduled to first token (``time_to_first_token_ms``: the queue, the request's
    way through the front end and back are not in it); ``queue_s``: queued to scheduled;
    ``decode_s``: first to last token (``generation_time_ms``); ``mean_itl_s``: that over the
    tokens after the first; ``tokens_per_second``: every token over scheduled to last token.
    """

    ttft_s: float | None = None
    queue_s: float | None = None
    decode_s: float | None = None
    mean_itl_s: float | None = None
    tokens_per_second: float | None = None

    #: vLLM's field (milliseconds, but for the rate) behind each figure.
    FIELDS: ClassVar[Mapping[str, str]] = {
        "ttft_s": "time_to_first_token_ms",
        "queue_s": "queue_time_ms",
        "decode_s": "generation_time_ms",
        "mean_itl_s": "mean_itl_ms",
        "tokens_per_second": "tokens_per_second",
    }

    @classmethod
    def from_metrics(cls, metrics: Any) -> ServerTiming | None:
        """The figures of a chunk's ``metrics`` object; None when it carries none of them."""
        if not isinstance(metrics, Mapping):
            return None
        values: dict[str, float] = {}
        for name, key in cls.FIELDS.items():
            value = metrics.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            values[name] = float(value) if key == "tokens_per_second" else value / 1000.0
        return cls(**values) if values else None

    def to_json(self) -> dict[str, float]:
        """The figures vLLM sent, in seconds (tokens per second for the rate)."""
        return {
            name: getattr(self, name) for name in self.FIELDS if getattr(self, name) is not None
        }


@dataclass(frozen=True)
class StreamMeasurement:
    """What one streamed request measured; see the module docstring for every definition."""

    ttft_s: float
    e2e_s: float
    token_times_s: tuple[float, ...]  # arrival of each token-carrying chunk, relative to t0
    tokens_per_chunk: tuple[int, ...]  # tokens each of those chunks carried, as counted
    itl_s: tuple[float, ...]  # per-token gaps derived from chunks: k gaps of g/k for k tokens
    completion_tokens: int  # usage.completion_tokens, the server's count
    requested_tokens: int
    prompt_tokens: int | None  # usage.prompt_tokens
    cached_prompt_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, if sent
    #: How chunks were counted: "usage" (the running count), "token_ids", "logprobs", "text".
    token_count_source: str
    finish_reason: str | None
    decode_throughput: float | None  # tokens/s, None below two carrying chunks
    #: Inter-token latencies: only when every chunk carried one token (else None; see
    #: :meth:`chunk_figures` for the gaps between chunks and the per-token figures derived).
    itl_median_s: float | None
    itl_p90_s: float | None
    itl_max_s: float | None
    body_bytes: int
    body_build_s: float
    connect_s: float | None  # TCP connect, just before t0 (outside ttft_s)
    upload_s: float | None  # body handed to the kernel, inside ttft_s
    response_headers_s: float | None  # t0 to the response headers
    #: ``time.perf_counter()`` at t0: lines the stream up with other clocks of this machine.
    started_perf_s: float = 0.0
    #: The completion's first :data:`COMPLETION_HEAD_CHARS` characters: the probe's answer.
    completion_head: str = ""
    #: The server's stream interval as known before this request (its warm-ups showed it);
    #: None when not known. One stream's counts can hide it: see :func:`infer_stream_interval`.
    server_stream_interval: int | None = None
    #: The server's own timing of this request (vLLM's per-request ``metrics``); None when it
    #: sent none (a server without ``--enable-per-request-metrics``).
    server_timing: ServerTiming | None = None

    @property
    def stream_tokens(self) -> int:
        """Tokens counted from the stream; below ``completion_tokens`` when some were hidden."""
        return sum(self.tokens_per_chunk)

    @property
    def counts_exact(self) -> bool:
        """True when the chunks' counts add up to the server's: each chunk's count is known."""
        return self.stream_tokens == self.completion_tokens

    @property
    def per_token(self) -> bool:
        """True when the server streamed every token as it came (stream interval 1): the gaps
        of the chunks that carried one token are inter-token latencies."""
        return self.stream_interval == 1

    @property
    def chunk_gaps_s(self) -> tuple[float, ...]:
        """Gaps between successive carrying chunks, as they arrived."""
        times = self.token_times_s
        return tuple(times[index] - times[index - 1] for index in range(1, len(times)))

    @property
    def coalesced_chunks(self) -> int:
        """Chunks the server merged because the stream fell behind: the first when it carried
        more than its one token (vLLM sends the first alone), and those after it that carried
        more than the interval (the last carries the remainder, less); 0 when the interval is
        unknown."""
        counts, interval = self.tokens_per_chunk, self.stream_interval
        if not counts or interval is None:
            return 0
        return int(counts[0] > 1) + sum(count > interval for count in counts[1:])

    def chunk_token_counts(self) -> tuple[float, ...]:
        """Tokens each carrying chunk brought; where the stream's count fell short of the
        server's (text counted, several tokens a chunk), the chunks after the first share the
        rest evenly (vLLM sends the first token alone)."""
        if self.counts_exact or len(self.tokens_per_chunk) < 2:
            return tuple(float(count) for count in self.tokens_per_chunk)
        first = self.tokens_per_chunk[0]
        share = (self.completion_tokens - first) / (len(self.tokens_per_chunk) - 1)
        return (float(first), *([share] * (len(self.tokens_per_chunk) - 1)))

    @property
    def stream_interval(self) -> int | None:
        """The server's stream interval as the counts show it, with what was known of it
        before (:func:`infer_stream_interval`)."""
        return infer_stream_interval(
            self.tokens_per_chunk, self.counts_exact, self.server_stream_interval
        )

    def chunking(self) -> dict[str, Any]:
        """How the stream was chunked, for the record: counts, their source, the interval."""
        counts = self.tokens_per_chunk
        runs: list[list[int]] = []
        for count in counts:
            if runs and runs[-1][0] == count:
                runs[-1][1] += 1
            else:
                runs.append([count, 1])
        after_first = self.chunk_token_counts()[1:]
        return {
            "token_count_source": self.token_count_source,
            "chunks": len(counts),
            "tokens_per_chunk": runs if self.counts_exact else None,
            "tokens_per_chunk_mean": (
                round(sum(after_first) / len(after_first), 3) if after_first else None
            ),
            "stream_interval": self.stream_interval,
            "per_token_gaps": self.per_token,
            # chunks that carried more than the interval (the first, more than its one token):
            # tokens the server coalesced because the stream fell behind
            "coalesced_chunks": self.coalesced_chunks,
        }

    def chunk_figures(self) -> dict[str, float]:
        """When a chunk after the first carried several tokens: the gaps between chunks as
        such, and the per-token figures derived from them (each gap over the tokens its chunk
        carried), labelled."""
        gaps = self.chunk_gaps_s
        if not gaps or (self.counts_exact and set(self.tokens_per_chunk[1:]) == {1}):
            return {}
        counts = self.chunk_token_counts()[1:]
        per_token = sorted(
            gap / count
            for gap, count in zip(gaps, counts, strict=True)
            for _ in range(max(1, round(count)))  # a chunk's k tokens: k gaps of g / k
        )
        ordered = sorted(gaps)
        return {
            "chunk_gap_median": quantile(ordered, 0.5),
            "chunk_gap_p90": quantile(ordered, 0.9),
            "chunk_gap_max": ordered[-1],
            "derived_itl_median": quantile(per_token, 0.5),
            "derived_itl_p90": quantile(per_token, 0.9),
        }

    def figures(self) -> dict[str, float]:
        """The figures under the names of :data:`pytest_longctx.core.records.FIGURE_UNITS`."""
        values = {
            "ttft": self.ttft_s,
            "decode_throughput": self.decode_throughput,
            "itl_median": self.itl_median_s,
            "itl_p90": self.itl_p90_s,
            "itl_max": self.itl_max_s,
            **self.chunk_figures(),
            "e2e": self.e2e_s,
            "request_body_bytes": float(self.body_bytes),
        }
        return {name: value for name, value in values.items() if value is not None}


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def summarize_stream(
    token_times_s: Sequence[float], tokens_per_chunk: Sequence[int], completion_tokens: int
) -> tuple[float | None, tuple[float, ...]]:
    """Decode throughput and inter-token gaps from the carrying chunks (module docstring)."""
    gaps: list[float] = []
    for index in range(1, len(token_times_s)):
        tokens = max(1, tokens_per_chunk[index])
        gap = (token_times_s[index] - token_times_s[index - 1]) / tokens
        gaps.extend([gap] * tokens)
    throughput = None
    if len(token_times_s) >= 2:
        span = token_times_s[-1] - token_times_s[0]
        after_first = completion_tokens - max(1, tokens_per_chunk[0])
        if span > 0 and after_first >= 1:
            throughput = after_first / span
    return throughput, tuple(gaps)


def infer_stream_interval(
    tokens_per_chunk: Sequence[int], exact: bool = True, known: int | None = None
) -> int | None:
    """The server's stream interval, by vLLM's rule: the first token goes alone, every chunk
    after it carries the interval's count or, where the stream fell behind and the API server
    merged chunks, a multiple of it, and the last the remainder. So the interval divides every
    chunk between the first and the last: their greatest common divisor, or the interval
    ``known`` from earlier streams of the same server where it divides them all (chunks of 1,
    20 and 11 are a stream that fell behind on a server whose warm-ups showed 1, and one at
    interval 20 on a server never seen). With no chunk between, the known interval or else the
    last chunk's count (a lower bound); with one chunk only (the whole stream merged), the
    known interval or None. None when the counts are not exact (text counted while chunks
    held several)."""
    if not exact:
        return None
    if len(tokens_per_chunk) < 2:
        return known
    middle = tokens_per_chunk[1:-1]
    if not middle:
        return known or tokens_per_chunk[-1]
    divisor = math.gcd(*middle)
    return known if known and divisor % known == 0 else divisor


def inter_token_gaps(
    token_times_s: Sequence[float],
    tokens_per_chunk: Sequence[int],
    exact: bool,
    known_interval: int | None = None,
) -> tuple[float, ...]:
    """The gaps before each chunk that carried exactly one token, when the server streamed
    every token (stream interval 1); none otherwise. A chunk of two (the server coalesced
    them while the stream fell behind) has no per-token gap and is left out."""
    if infer_stream_interval(tokens_per_chunk, exact, known_interval) != 1:
        return ()
    return tuple(
        token_times_s[index] - token_times_s[index - 1]
        for index in range(1, len(token_times_s))
        if tokens_per_chunk[index] == 1
    )
