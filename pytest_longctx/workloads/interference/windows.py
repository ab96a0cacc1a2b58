"""What one long prefill cost the background streams beside it: windows, gaps, stalls.

Definitions (every time on the shared monotonic clock, see ``background.py``):

* **Windows.** *Idle*: from the moment every background stream has received a token to the
  long prompt's send (the reference). *Prefill*: the long prompt's send (its t0) to its first
  token. *Decode*: its first token to its last.
* **Gaps.** Each background request's wait between two chunks it received (a user's wait
  for the next token; a request's own first token is not one). A gap belongs to the window
  its midpoint lies in: a prefill that stalls every stream for seconds makes one gap that
  starts a step after the send and ends with the first token, and it is the prefill's.
* **Tokens during the prefill.** Per stream, the tokens that arrived from the first step the
  prefill slowed (its first gap longer than the longest idle gap, ``margin``, begun after the
  send) until ``margin`` before the long prompt's first token (the step that brought it);
  steps before the first slowed one are the step in flight at the send and those while the
  server read the prompt, which waited for no prefill. A stream that no step slowed counts
  its tokens after its first there (the step in flight). Zero: the prefill stalled every
  stream.
* **Rates.** Background tokens (all streams) that arrived in a window over its length.
* **Waits.** Each background request's own time to its first token, in the window its middle
  lies in: a request that arrives during a prefill may wait for all of it, chunked or not
  (the chunks of a prefill already running take the step's budget before a waiting request).
* **The server's own view.** vLLM's ``vllm:inter_token_latency_seconds`` between two
  ``/metrics`` reads that enclose every request of the point: its sum against the sum of the
  gaps every stream and the long request saw, its count against their tokens after each
  request's first, and its highest filled bucket against their longest gap (a p99 would
  flip between the two modes of a stall's gaps at the tail's edge; the longest is the stall).
  Where the server times each request (vLLM's per-request metrics), each background
  request's stream, first chunk to last, against the server's own decode time of that very
  request: a stream the host held back, or flushed whole, is named request by request.
  Either refuting the gaps leaves them unconfirmed: workloads/interference/under_load.py
  sets the point's background figures aside.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_longctx.client import quantile
from pytest_longctx.measure.agreement import MIN_DISAGREEMENT_S
from pytest_longctx.measure.background import BackgroundRequest
from pytest_longctx.measure.server_metrics import (
    INTER_TOKEN,
    PREEMPTIONS,
    MetricsSnapshot,
    bucket_delta,
)

WINDOWS = ("idle", "prefill", "decode")


@dataclass(frozen=True)
class Windows:
    """The point's windows: idle ``[idle_from, sent)``, prefill ``[sent, first_token)``,
    decode ``[first_token, last_token]``."""

    idle_from: float
    sent: float
    first_token: float
    last_token: float

    def window_of(self, start: float, end: float) -> str | None:
        """The window a gap's midpoint lies in; None outside all three."""
        middle = (start + end) / 2
        if self.idle_from <= middle < self.sent:
            return "idle"
        if self.sent <= middle < self.first_token:
            return "prefill"
        if self.first_token <= middle <= self.last_token:
            return "decode"
        return None

    def span(self, window: str) -> tuple[float, float]:
        return {
            "idle": (self.idle_from, self.sent),
            "prefill": (self.sent, self.first_token),
            "decode": (self.first_token, self.last_token),
        }[window]

    def seconds(self, window: str) -> float:
        start, end = self.span(window)
        return max(0.0, end - start)

    def hold_any_of(self, request: BackgroundRequest) -> bool:
        """Whether any figure of the point reads ``request``: a token that arrived inside the
        windows, a gap or its wait for the first token whose midpoint lies in one."""
        if any(self.idle_from <= at <= self.last_token for at in request.token_times):
            return True
        if any(self.window_of(start, end) for start, end, _ in request.gaps):
            return True
        return bool(request.token_times and self.window_of(request.sent_at, request.token_times[0]))


@dataclass(frozen=True)
class GapStats:
    """The gaps of one window over every stream."""

    count: int
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, gaps: Sequence[float]) -> GapStats | None:
        if not gaps:
            return None
        ordered = sorted(gaps)
        return cls(len(ordered), quantile(ordered, 0.5), quantile(ordered, 0.99), ordered[-1])


@dataclass(frozen=True)
class BackgroundView:
    """The background streams' figures for one point."""

    gaps: Mapping[str, GapStats | None]
    #: The background requests' own waits for their first token, per window.
    waits: Mapping[str, GapStats | None]
    tokens: Mapping[str, int]  # tokens that arrived in each window
    tokens_during_prefill: int
    margin_s: float
    windows: Windows

    def figures(self) -> dict[str, float]:
        """The record's ``bg_*`` figures (core/records.py)."""
        figures: dict[str, float] = {}
        for window in WINDOWS:
            stats = self.gaps.get(window)
            if stats is not None:
                figures[f"bg_itl_{window}_median"] = stats.median
                figures[f"bg_itl_{window}_p99"] = stats.p99
                figures[f"bg_itl_{window}_max"] = stats.max
            wait = self.waits.get(window)
            if wait is not None:
                figures[f"bg_ttft_{window}_median"] = wait.median
                figures[f"bg_ttft_{window}_max"] = wait.max
            seconds = self.windows.seconds(window)
            if seconds > 0:
                figures[f"bg_rate_{window}"] = self.tokens[window] / seconds
        if self.counted_s > 0:  # a prefill shorter than an idle step cannot show a stall
            figures["bg_tokens_during_prefill"] = float(self.tokens_during_prefill)
        return figures

    @property
    def counted_s(self) -> float:
        """The part of the prefill window whose tokens are counted (less the last step)."""
        return self.windows.seconds("prefill") - self.margin_s

    def details(self) -> dict[str, Any]:
        """For the record's ``interference``: the windows' lengths, gaps and tokens each."""
        return {
            "windows_s": {w: round(self.windows.seconds(w), 6) for w in WINDOWS},
            "gaps": {w: _count(self.gaps.get(w)) for w in WINDOWS},
            "requests_started": {w: _count(self.waits.get(w)) for w in WINDOWS},
            "tokens": dict(self.tokens),
            "stall_margin_s": round(self.margin_s, 6),
            "stall_counted_s": round(max(0.0, self.counted_s), 6),
        }


def background_view(requests: Iterable[BackgroundRequest], windows: Windows) -> BackgroundView:
    """Gaps per window, tokens per window and the tokens that came during the prefill."""
    done = [r for r in requests if r.error is None]
    by_window: dict[str, list[float]] = {w: [] for w in WINDOWS}
    for request in done:
        for start, end, _ in request.gaps:
            window = windows.window_of(start, end)
            if window is not None:
                by_window[window].append(end - start)
    gaps = {w: GapStats.of(values) for w, values in by_window.items()}
    waited: dict[str, list[float]] = {w: [] for w in WINDOWS}
    for request in done:
        if request.token_times:
            window = windows.window_of(request.sent_at, request.token_times[0])
            if window is not None:
                waited[window].append(request.token_times[0] - request.sent_at)
    waits = {w: GapStats.of(values) for w, values in waited.items()}
    idle = gaps["idle"]
    margin = idle.max if idle is not None else 0.0
    tokens = {w: 0 for w in WINDOWS}
    #: per stream, every token: (arrival, tokens, when the gap before it began or None)
    timeline: dict[int, list[tuple[float, int, float | None]]] = {}
    for request in done:
        previous = None
        for at, count in zip(request.token_times, request.tokens_per_chunk, strict=True):
            for window in WINDOWS:
                start, end = windows.span(window)
                if start <= at < end or (window == "decode" and at == end):
                    tokens[window] += count
                    break
            timeline.setdefault(request.stream, []).append((at, count, previous))
            previous = at
    during = sum(_during(sorted(seen), windows, margin) for seen in timeline.values())
    return BackgroundView(gaps, waits, tokens, during, margin, windows)


def _during(seen: list[tuple[float, int, float | None]], windows: Windows, margin: float) -> int:
    """One stream's tokens during the prefill (module docstring): from the first gap the
    prefill slowed, or after the stream's first token in the window when none was."""
    onset = min(
        (
            began
            for at, _, began in seen
            if began is not None
            and windows.sent <= began < windows.first_token
            and at - began > margin
        ),
        default=None,
    )
    inside = [
        (at, count) for at, count, _ in seen if windows.sent < at < windows.first_token - margin
    ]
    if onset is None:
        return sum(count for _, count in inside[1:])
    return sum(count for at, count in inside if at > onset)


@dataclass(frozen=True)
class ServerItlCheck:
    """vLLM's inter-token histogram against the gaps the clients saw."""

    server_sum_s: float
    server_count: int
    client_sum_s: float
    client_count: int
    server_max_bucket: tuple[float, float] | None
    client_max_s: float | None
    problem: str | None
    #: The longest of the gaps the point's figures read (inside its windows).
    client_max_read_s: float | None = None

    def record(self) -> dict[str, Any]:
        return {
            "server_sum_s": round(self.server_sum_s, 6),
            "server_count": self.server_count,
            "client_sum_s": round(self.client_sum_s, 6),
            "client_count": self.client_count,
            "server_max_bucket": list(self.server_max_bucket) if self.server_max_bucket else None,
            "client_max_s": self.client_max_s,
            "client_max_in_windows_s": self.client_max_read_s,
            "agreement": self.problem or "agrees",
        }


def _top_bucket(buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The (lower, upper] bucket of a histogram's largest observation; None when empty."""
    filled = [index for index, (_, count) in enumerate(buckets) if count > 0]
    if not filled:
        return None
    top = filled[-1]
    return (buckets[top - 1][0] if top else 0.0, buckets[top][0])


def check_server_itl(
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    gaps: Sequence[float],
    tokens_after_first: int,
    tolerance: float,
    read: Sequence[float] | None = None,
) -> ServerItlCheck | None:
    """The server's inter-token histogram between ``before`` and ``after`` against the
    clients' ``gaps`` (every request between the reads) and their ``tokens_after_first``.

    They disagree when the sums differ by more than ``tolerance`` (a fraction), when the
    server counted other requests' tokens, when the clients' longest gap is shorter than the
    server's highest filled bucket narrowed by the tolerance, or when the longest of the gaps
    the figures ``read`` (those inside the point's windows; all of ``gaps`` when None) is
    longer than that bucket widened by it: a stall the host made in a gap no figure reads (as
    the streams start) is no reason to doubt the figures. None when the server has no
    histogram."""
    old_sum, new_sum = before.total(f"{INTER_TOKEN}_sum"), after.total(f"{INTER_TOKEN}_sum")
    old_count, new_count = before.total(f"{INTER_TOKEN}_count"), after.total(f"{INTER_TOKEN}_count")
    if new_sum is None or new_count is None:
        return None
    server_sum, server_count = new_sum - (old_sum or 0.0), int(new_count - (old_count or 0.0))
    client_sum = math.fsum(gaps)
    bucket = _top_bucket(bucket_delta(before, after, INTER_TOKEN))
    longest = max(gaps) if gaps else None
    where = " in the windows" if read is not None else ""
    longest_read = longest if read is None else max(read, default=None)
    problems = []
    if server_count != tokens_after_first:
        problems.append(
            f"the server counted {server_count:,} inter-token gaps, the streams "
            f"{tokens_after_first:,} (another client's requests ran, or some of these were "
            "lost)"
        )
    if server_sum > 0 and abs(client_sum - server_sum) > tolerance * server_sum:
        problems.append(
            f"the streams' gaps sum to {client_sum:.3f} s, the server's to {server_sum:.3f} s "
            f"(more than {tolerance:.0%} apart)"
        )
    if bucket is not None and longest is not None:
        low, high = bucket
        too_long = longest_read is not None and longest_read > high * (1 + tolerance)
        if too_long or longest < low / (1 + tolerance):
            seen, which = (longest_read, where) if too_long else (longest, "")
            assert seen is not None
            upper = "inf" if math.isinf(high) else f"{high * 1000:g}"
            problems.append(
                f"the streams' longest gap{which} is {seen * 1000:.1f} ms, the server's lies "
                f"in ({low * 1000:g}, {upper}] ms"
            )
    problem = (
        "the background gaps disagree with the server's inter-token histogram "
        "(vllm:inter_token_latency_seconds): " + "; ".join(problems)
        if problems
        else None
    )
    return ServerItlCheck(
        server_sum, server_count, client_sum, len(gaps), bucket, longest, problem, longest_read
    )


@dataclass(frozen=True)
class RequestsCheck:
    """The background requests' streams against the server's own timing of each."""

    checked: int
    refuted: int
    #: The request furthest off: (stream, index, the stream's decode span, the server's).
    worst: tuple[int, int, float, float] | None
    problem: str | None
    #: Requests with the server's figure that no window of the point holds (not judged).
    outside_windows: int = 0

    def record(self) -> dict[str, Any]:
        worst = None
        if self.worst is not None:
            stream, index, client_s, server_s = self.worst
            worst = {
                "stream": stream,
                "index": index,
                "client_decode_s": round(client_s, 6),
                "server_decode_s": round(server_s, 6),
            }
        return {
            "checked": self.checked,
            "refuted": self.refuted,
            "outside_windows": self.outside_windows,
            "furthest": worst,
            "agreement": self.problem or "agrees",
        }


def check_background_requests(
    requests: Iterable[BackgroundRequest], tolerance: float, windows: Windows
) -> RequestsCheck | None:
    """Each finished background request's stream, its first chunk to its last, against the
    server's own decode time of that request (vLLM's per-request ``generation_time_ms``, its
    first token to its last). They disagree where the two differ by more than ``tolerance``
    of the server's and by more than :data:`MIN_DISAGREEMENT_S`: the host held the stream
    back, or flushed it whole (a span of 0 s), and its gaps are not the server's. A stall
    the long prefill makes lies inside both. Judged are the requests the point's figures
    read: one whose every token and gap came before the idle window (a stream's first
    request, flushed whole while the streams started) or after the long request's last
    token is counted as ``outside_windows``. None when no request has the server's figure."""
    checked, refuted, outside = 0, 0, 0
    worst: tuple[int, int, float, float] | None = None
    for request in requests:
        timing = request.server_timing
        if request.error is not None or timing is None or timing.decode_s is None:
            continue
        if request.completion_tokens < 2 or not request.token_times:
            continue
        if not windows.hold_any_of(request):
            outside += 1
            continue
        checked += 1
        client_s = request.token_times[-1] - request.token_times[0]
        off = abs(client_s - timing.decode_s)
        if off > tolerance * timing.decode_s and off > MIN_DISAGREEMENT_S:
            refuted += 1
            if worst is None or off > abs(worst[2] - worst[3]):
                worst = (request.stream, request.index, client_s, timing.decode_s)
    if not checked and not outside:
        return None
    problem = None
    if worst is not None:
        stream, index, client_s, server_s = worst
        problem = (
            f"the background streams disagree with the server's own timing of their requests "
            f"(vLLM's per-request metrics): {refuted} of {checked} requests' streams spanned "
            f"their decode more than {tolerance:.0%} off the server's (furthest: stream "
            f"{stream}'s request {index}, {client_s:.3f} s first chunk to last, the server "
            f"{server_s:.3f} s first token to last)"
        )
    return RequestsCheck(checked, refuted, worst, problem, outside)


def preemptions(before: MetricsSnapshot, after: MetricsSnapshot) -> int | None:
    """Requests vLLM preempted between the reads; None when it does not count them."""
    old, new = before.total(PREEMPTIONS), after.total(PREEMPTIONS)
    return None if new is None else int(new - (old or 0.0))


def chunk_from_server_info(info: Any) -> dict[str, Any] | None:
    """The scheduler's effective chunk and sequence limit from vLLM's ``/server_info``
    (``config_format=json``; served with ``VLLM_SERVER_DEV_MODE=1``), None without them."""
    config = info.get("vllm_config") if isinstance(info, Mapping) else None
    scheduler = config.get("scheduler_config") if isinstance(config, Mapping) else None
    if not isinstance(scheduler, Mapping) or scheduler.get("max_num_batched_tokens") is None:
        return None
    return {
        "max_num_batched_tokens": int(scheduler["max_num_batched_tokens"]),
        "max_num_seqs": scheduler.get("max_num_seqs"),
        "enable_chunked_prefill": scheduler.get("enable_chunked_prefill"),
        "source": "/server_info (vLLM's scheduler config as it runs)",
    }


def chunk_from_streams(view: BackgroundView, length: int, streams: int) -> dict[str, Any] | None:
    """The chunk as the background streams saw it, where the server does not say it: each
    prefill step gives every stream a token, so the steps inside the counted window are its
    tokens over K, and one more step (the last) brings the first token. An estimate: a stream
    between two of its requests misses a step. vLLM exports its chunk nowhere else
    (``vllm:iteration_tokens_total`` counts a prompt's tokens at its first token's step)."""
    if "bg_tokens_during_prefill" not in view.figures() or streams < 1:
        return None
    steps = view.tokens_during_prefill / streams + 1
    return {
        "prefill_steps_seen": round(steps, 2),
        "estimated_chunk_tokens": round(length / steps),
        "source": "estimated from the background tokens per prefill step",
    }


@dataclass
class SequenceProbe:
    """Whether a server runs K + 1 requests at once, from its running and waiting gauges
    sampled while K + 1 requests are in flight (vLLM does not export ``max_num_seqs``)."""

    wanted: int
    #: Seconds requests must keep waiting with fewer than ``wanted`` running to decide "no".
    persist_s: float = 2.0
    most_running: int = 0
    most_waiting: int = 0
    _waiting_since: float | None = None

    def add(self, at: float, running: float | None, waiting: float | None) -> bool | None:
        """One sample; True: ``wanted`` ran at once; False: requests kept waiting behind
        fewer; None: not decided yet."""
        if running is None:
            return None
        running_now, waiting_now = int(running), int(waiting or 0)
        self.most_running = max(self.most_running, running_now)
        self.most_waiting = max(self.most_waiting, waiting_now)
        if running_now >= self.wanted:
            return True
        if waiting_now > 0 and running_now + waiting_now >= self.wanted:
            if self._waiting_since is None:
                self._waiting_since = at
            return False if at - self._waiting_since >= self.persist_s else None
        self._waiting_since = None
        return None

    def refusal(self, base_url: str, streams: int, seen: str | None = None) -> str:
        seen = seen or (
            f"at most {self.most_running} ran at once while {self.most_waiting} waited "
            "(vllm:num_requests_running, vllm:num_requests_waiting)"
        )
        return (
            f"the server at {base_url} cannot run {self.wanted} requests at once: with "
            f"{self.wanted} in flight, {seen}. The interference workload needs {streams} "
            f"background streams and the long prompt running together; serve it with "
            f"--max-num-seqs {self.wanted} or more"
        )


def _count(stats: GapStats | None) -> int:
    return stats.count if stats is not None else 0
