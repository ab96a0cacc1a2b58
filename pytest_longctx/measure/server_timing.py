"""The server's own timing of each request beside the client's: the record's ``server_timing``.

vLLM times every request it serves (``RequestStateStats``: queued, scheduled, first and last
token) and, started with ``--enable-per-request-metrics`` (stats logging on), sends that
request's figures on its stream's final usage chunk (:class:`~pytest_longctx.client.
ServerTiming`). ``/metrics`` has the same stamps only as sums over every request between two
reads: exact for a point alone, one figure for a concurrency level's c requests or an
interference point's long request and its background streams. Per request, each side is
compared with the other:

* **Front end**: the client's TTFT less the server's (scheduled to first token): the upload,
  the request's parsing, the validation of its L ids, the queue and the first token's way
  back. At millions of tokens it is a cost a user pays that no engine figure shows.
* **Decode**: the stream's chunks against the server's own decode time for that request
  (:func:`~pytest_longctx.measure.agreement.judge_stream`: its rate and its bursts), so a
  stream the host merged or delayed is told apart request by request, never in a sum.

A server that sends no per-request figures keeps the ``/metrics`` evidence alone, and the
record says so (``source`` ``metrics``, ``why``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_longctx.client import ServerTiming, StreamMeasurement, summarize_stream
from pytest_longctx.measure.agreement import DEFAULT_STREAM_TOLERANCE, judge_stream

#: ``server_timing.source``: vLLM's per-request metrics, or /metrics' sums alone.
PER_REQUEST = "per_request"
METRICS_ONLY = "metrics"
FLAG = "--enable-per-request-metrics"
NOT_SENT = (
    f"the server sent no per-request metrics (vLLM's {FLAG}, with stats logging on, from "
    "0.25.1): its figures for this point are /metrics' sums between two reads "
    "(server_metrics), one over every request that ran between them"
)
#: A request whose decode cannot be judged against the server's own.
UNCHECKED = "unchecked: fewer than two tokens, or the server did not time this decode"


def request_entry(
    timing: ServerTiming,
    client_ttft_s: float | None,
    token_times_s: Sequence[float],
    token_counts: Sequence[float],
    completion_tokens: int,
    client_rate: float | None,
    tolerance: float = DEFAULT_STREAM_TOLERANCE,
) -> dict[str, Any]:
    """One request's server figures (seconds) beside the client's: its TTFT and the front
    end's share of it, its decode span against the server's, and the verdict on its stream
    (``decode``: ``agrees``, why not, or :data:`UNCHECKED`). ``token_times_s``: its carrying
    chunks' arrivals (any origin); ``token_counts``: their tokens."""
    entry: dict[str, Any] = timing.to_json()
    if client_ttft_s is not None:
        entry["client_ttft_s"] = client_ttft_s
        if timing.ttft_s is not None:
            entry["front_end_s"] = client_ttft_s - timing.ttft_s
    if len(token_times_s) >= 2:
        entry["client_decode_s"] = token_times_s[-1] - token_times_s[0]
    agreement = judge_stream(
        token_times_s, token_counts, completion_tokens, client_rate, timing.decode_s, tolerance
    )
    entry["decode"] = UNCHECKED if agreement is None else agreement.problem or "agrees"
    return entry


def stream_entry(
    stream: StreamMeasurement, tolerance: float = DEFAULT_STREAM_TOLERANCE
) -> dict[str, Any] | None:
    """:func:`request_entry` of a measured stream; None when the server sent no figures."""
    if stream.server_timing is None:
        return None
    return request_entry(
        stream.server_timing,
        stream.ttft_s,
        stream.token_times_s,
        stream.chunk_token_counts(),
        stream.completion_tokens,
        stream.decode_throughput,
        tolerance,
    )


def timed_request(
    timing: ServerTiming | None,
    sent_at: float,
    token_times: Sequence[float],
    tokens_per_chunk: Sequence[int],
    completion_tokens: int,
    tolerance: float = DEFAULT_STREAM_TOLERANCE,
) -> dict[str, Any] | None:
    """:func:`request_entry` of a request known by its absolute stamps (a background
    stream's, a concurrency level's); None without the server's figures."""
    if timing is None:
        return None
    rate, _ = summarize_stream(token_times, tokens_per_chunk, completion_tokens)
    return request_entry(
        timing,
        token_times[0] - sent_at if token_times else None,
        token_times,
        [float(count) for count in tokens_per_chunk],
        completion_tokens,
        rate,
        tolerance,
    )


def point_timing(entry: Mapping[str, Any] | None, **more: Any) -> dict[str, Any]:
    """The record's ``server_timing`` of a point whose measured request has ``entry``
    (None: the server sent no figures), with ``more`` beside it (an interference point's
    ``background``)."""
    if entry is None:
        return {"source": METRICS_ONLY, "why": NOT_SENT}
    return {"source": PER_REQUEST, "request": dict(entry), **more}


def requests_timing(entries: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The record's ``server_timing`` of a concurrency level: each request's entry (its
    ``index`` in it), or the ``/metrics`` evidence alone when no request had figures."""
    if not entries or all(entry is None for entry in entries):
        return {"source": METRICS_ONLY, "why": NOT_SENT}
    found: dict[str, Any] = {
        "source": PER_REQUEST,
        "requests": [dict(entry) for entry in entries if entry is not None],
    }
    missing = sum(entry is None for entry in entries)
    if missing:
        found["without_figures"] = missing  # failed requests, or a server that sent none
    found["decode"] = decode_counts(found["requests"])
    return found


def decode_counts(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many requests' streams agree with the server's own decode, disagree, or could
    not be judged."""
    counts = {"agree": 0, "disagree": 0, "unchecked": 0}
    for entry in entries:
        verdict = str(entry.get("decode", UNCHECKED))
        key = (
            "agree"
            if verdict == "agrees"
            else ("unchecked" if verdict.startswith("unchecked") else "disagree")
        )
        counts[key] += 1
    return counts


def timing_figures(server_timing: Mapping[str, Any]) -> dict[str, float]:
    """The record's figures of the measured request's server timing (core/records.py):
    ``server_request_ttft``, ``server_request_queue``, ``front_end_ttft`` and
    ``server_request_itl``, the server's mean inter-token latency of the request, which the
    gate judges ITL on where a stream shows no gap of one token (merged, in bursts, or in
    chunks of several)."""
    entry = server_timing.get("request")
    if not isinstance(entry, Mapping):
        return {}
    names = {
        "server_request_ttft": "ttft_s",
        "server_request_queue": "queue_s",
        "front_end_ttft": "front_end_s",
        "server_request_itl": "mean_itl_s",
    }
    return {name: float(entry[key]) for name, key in names.items() if entry.get(key) is not None}
