"""What one streamed request measured, and the statistics of its token times."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


@dataclass(frozen=True)
class StreamMeasurement:
    """What one streamed request measured; see the module docstring for every definition."""

    ttft_s: float
    e2e_s: float
    token_times_s: tuple[float, ...]  # arrival of each token-carrying chunk, relative to t0
    tokens_per_chunk: tuple[int, ...]  # tokens each of those chunks carried, as counted
    itl_s: tuple[float, ...]  # inter-token gaps, k gaps of g/k for a k-token chunk
    completion_tokens: int  # usage.completion_tokens, the server's count
    requested_tokens: int
    prompt_tokens: int | None  # usage.prompt_tokens
    cached_prompt_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, if sent
    token_count_source: str  # "token_ids", "logprobs" or "text": how chunks were counted
    finish_reason: str | None
    decode_throughput: float | None  # tokens/s, None below two carrying chunks
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

    @property
    def stream_tokens(self) -> int:
        """Tokens counted from the stream; below ``completion_tokens`` when some were hidden."""
        return sum(self.tokens_per_chunk)

    def figures(self) -> dict[str, float]:
        """The figures under the names of :data:`pytest_longctx.records.FIGURE_UNITS`."""
        values = {
            "ttft": self.ttft_s,
            "decode_throughput": self.decode_throughput,
            "itl_median": self.itl_median_s,
            "itl_p90": self.itl_p90_s,
            "itl_max": self.itl_max_s,
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
