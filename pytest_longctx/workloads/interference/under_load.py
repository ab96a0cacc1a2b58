"""One interference point: a cold prompt of L tokens sent while K background streams run.

The order: a ``/metrics`` read; the background streams started in their own process
(``background.py``) and given the idle reference once every one of them streams; the long
prompt sent and streamed as any point's; the streams stopped (their requests in flight end);
a second ``/metrics`` read, which so encloses every request of the point. What the streams
saw in each window is worked out in ``interference.py``.

The point keeps the cold contract's other checks: its lengths are exact (the sweep test), and
its own ``usage.prompt_tokens_details.cached_tokens`` must show that none of its prompt came
from the cache: ``/metrics``' cache counters now count the background requests too, so they
cannot say it. A preemption during the point fails it (its figures would hold recomputation),
as does a background request that failed.

The background streams' gaps are the server's only where its own figures confirm them: its
inter-token histogram and, where it times each request, each background request's decode
(interference.py). Gaps those refute (a host that held the streams back, or flushed them
whole) are not what K streams beside the prefill waited: the point keeps its TTFT under load
and passes, its background figures set aside in the record (``unconfirmed_figures``) where no
report and no gate reads them, unless ``--longctx-allow-unconfirmed`` keeps and gates them;
``--longctx-strict-stream`` fails it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_longctx.client import CompletionClient, RequestRejectedError, StreamMeasurement
from pytest_longctx.measure.agreement import STRICT_OPTION
from pytest_longctx.measure.background import (
    BackgroundError,
    BackgroundRequest,
    BackgroundSpec,
    BackgroundStreams,
    requests_in,
)
from pytest_longctx.measure.measurement import (
    UNVERIFIED_HINT,
    PointFailure,
    PointMeasurement,
    PointSettings,
    PointWatcher,
    UnverifiedPoint,
    point_request,
    send_measured,
    set_aside_stream_figures,
    snapshot,
    stream_check,
)
from pytest_longctx.measure.server_metrics import (
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    MetricsSnapshot,
    delta,
)
from pytest_longctx.measure.server_timing import (
    decode_counts,
    point_timing,
    stream_entry,
    timed_request,
)
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import IDLE_REFERENCE_S, Point
from pytest_longctx.prompts import Prompt
from pytest_longctx.workloads.interference.windows import (
    SequenceProbe,
    Windows,
    background_view,
    check_background_requests,
    check_server_itl,
    chunk_from_streams,
    preemptions,
)

#: How long the background streams may take to all receive a token.
STREAMING_TIMEOUT_S = 300.0
#: How long the sequence probe waits for K + 1 requests to run at once before it gives up.
PROBE_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 0.1
#: Keeps and gates the background figures of a point whose gaps the server's figures refute.
ALLOW_UNCONFIRMED_OPTION = "--longctx-allow-unconfirmed"
#: ``interference.background_gaps.figures`` of a point whose gaps were refuted.
SET_ASIDE = (
    "set aside under unconfirmed_figures, not reported nor gated (the default; "
    f"{ALLOW_UNCONFIRMED_OPTION} keeps and gates them, {STRICT_OPTION} fails such points)"
)
KEPT_UNCONFIRMED = f"kept and gated, though unconfirmed ({ALLOW_UNCONFIRMED_OPTION})"
NO_SERVER_INFO = (
    "the server does not say its chunk: vLLM reports its scheduler's config only at "
    "/server_info, served with VLLM_SERVER_DEV_MODE=1"
)


@dataclass(frozen=True)
class LoadSettings:
    """The load beside the long prompt, and what is known of its server."""

    background: BackgroundSpec
    idle_s: float = IDLE_REFERENCE_S
    #: How far the streams' gaps may stray from the server's inter-token histogram.
    tolerance: float = 0.5
    #: Keep a point whose gaps the server's figures refute (the default: on a starved host the
    #: streams see tokens late and in bursts), saying so in its record, its long stream's
    #: decode figures set aside where the server has no figure of the long request's own (its
    #: decode time counts the background requests; a server that sends per-request metrics
    #: has one, against which the long stream is judged as a cold point's is); False fails it
    #: (--longctx-strict-stream).
    keep_disagreeing: bool = True
    #: Keep such a point's background figures where reports and the gate read them
    #: (--longctx-allow-unconfirmed); by default they are set aside, unjudged.
    keep_unconfirmed: bool = False
    #: The server's effective chunk and limits (``/server_info``), when it says them.
    server_config: dict[str, Any] | None = None
    #: The sequence probe's finding on this server start.
    sequence_limit: dict[str, Any] = field(default_factory=dict)
    streaming_timeout_s: float = STREAMING_TIMEOUT_S


def probe_sequences(
    client: CompletionClient,
    server: ServerInfo,
    spec: BackgroundSpec,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``spec.streams`` requests at once and watch the scheduler's gauges: the server
    runs them together (``ran_at_once``), or a refusal saying why not (``refused``)."""
    probe = SequenceProbe(spec.streams)
    decided: bool | None = None
    with BackgroundStreams(spec) as streams:
        started = time.monotonic()
        while decided is None and time.monotonic() - started < timeout_s:
            try:
                now = MetricsSnapshot.from_text(client.metrics_text())
            except Exception as exc:  # noqa: BLE001 - no gauges to read: cannot decide
                return {
                    "wanted": spec.streams,
                    "refused": probe.refusal(
                        server.base_url, spec.streams - 1, f"/metrics could not be read ({exc})"
                    ),
                }
            decided = probe.add(
                time.monotonic(), now.total(REQUESTS_RUNNING), now.total(REQUESTS_WAITING)
            )
            time.sleep(PROBE_INTERVAL_S)
        streams.stop(abandon=True)
    if decided:
        wait_idle(client, timeout_s)
    found = {
        "wanted": spec.streams,
        "most_running": probe.most_running,
        "most_waiting": probe.most_waiting,
        "source": "vllm:num_requests_running / vllm:num_requests_waiting",
    }
    if decided:
        return {**found, "ran_at_once": True}
    seen = None
    if decided is None:
        seen = (
            f"they were not seen running together within {timeout_s:g} s (at most "
            f"{probe.most_running} ran at once while {probe.most_waiting} waited)"
        )
    if decided is None and probe.most_running == 0:
        seen = f"the gauges never showed a request running within {timeout_s:g} s"
    return {**found, "refused": probe.refusal(server.base_url, spec.streams - 1, seen)}


def wait_idle(client: CompletionClient, timeout_s: float) -> bool:
    """Wait until the scheduler runs and queues nothing (the probe's abandoned requests
    aborted), so the point's counters count its own requests only; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            now = MetricsSnapshot.from_text(client.metrics_text())
        except Exception:  # noqa: BLE001 - the point's own /metrics read will say why
            return False
        if not (now.total(REQUESTS_RUNNING) or 0) and not (now.total(REQUESTS_WAITING) or 0):
            return True
        time.sleep(PROBE_INTERVAL_S)
    return False


def load_timing(
    stream: StreamMeasurement, requests: Sequence[BackgroundRequest], tolerance: float
) -> dict[str, Any]:
    """The record's ``server_timing`` of an interference point: the long request's own and,
    beside it, each finished background request's (its ``stream`` and ``index``), with how
    many of their streams agree with their own decode."""
    background = []
    for request in requests:
        if request.error is not None:
            continue
        entry = timed_request(
            request.server_timing,
            request.sent_at,
            request.token_times,
            request.tokens_per_chunk,
            request.completion_tokens,
            tolerance,
        )
        if entry is not None:
            background.append({"stream": request.stream, "index": request.index, **entry})
    more: dict[str, Any] = {}
    if background:
        more = {"background": background, "background_decode": decode_counts(background)}
    return point_timing(stream_entry(stream, tolerance), **more)


def measure_under_load(
    client: CompletionClient,
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    settings: PointSettings,
    load: LoadSettings,
    check_alive: Callable[[float], None] = lambda grace_s: None,
    refusal: Callable[[RequestRejectedError], str] = str,
    watch: PointWatcher | None = None,
) -> PointMeasurement:
    """The point under load; raise :class:`PointFailure` when it could not be measured.

    What the figures must show (exact lengths, none of the prompt cached, no problem with
    the load) is the sweep test's to assert."""
    if load.sequence_limit.get("refused"):
        raise PointFailure(load.sequence_limit["refused"], "refused", sent=False)
    request = point_request(server, point, prompt, settings, check_alive)
    wait_idle(client, load.streaming_timeout_s)  # nothing of an earlier request in its counts
    before, why_not = snapshot(client)
    if before is None and not settings.allow_unverified:
        raise PointFailure(
            f"this point cannot be verified: /metrics could not be read ({why_not}); "
            + UNVERIFIED_HINT
        )
    streams = BackgroundStreams(load.background)
    try:
        streams.start()
        if not streams.wait_streaming(load.streaming_timeout_s):
            raise PointFailure(
                f"the {load.background.streams} background streams did not all finish a "
                f"first request within {load.streaming_timeout_s:g} s"
            )
        time.sleep(load.idle_s)
        stream = send_measured(
            client, server, request, settings, check_alive, refusal, watch, load.background.streams
        )
    except BackgroundError as exc:
        raise PointFailure(f"the background streams failed: {exc}") from None
    finally:
        requests = streams.stop()
    after, why_not_after = snapshot(client) if before is not None else (None, None)
    t0 = stream.started_perf_s
    ready_at = streams.ready_at if streams.ready_at is not None else t0
    windows = Windows(ready_at, t0, t0 + stream.ttft_s, t0 + stream.token_times_s[-1])
    view = background_view(requests, windows)
    counts = requests_in(requests)
    details: dict[str, Any] = {
        "background_streams": load.background.streams,
        "background_prompt_tokens": len(load.background.prompt_ids),
        "background_decode_tokens": load.background.decode_tokens,
        "idle_reference_s": load.idle_s,
        "background_requests": counts,
        **view.details(),
        "long_cached_tokens": stream.cached_prompt_tokens,
        "sequence_limit": dict(load.sequence_limit),
    }
    problems = []
    if counts["failed"]:
        first = next(r.error for r in requests if r.error is not None)
        problems.append(
            f"{counts['failed']} of {counts['requests']} background requests failed (first: "
            f"{first}): the load was not {load.background.streams} streams throughout"
        )
    if view.gaps.get("idle") is None:
        problems.append(
            f"the {load.idle_s:g} s idle reference holds no background gap to compare with"
        )
    server_view: dict[str, float] = {}
    disagreement: str | None = None
    finished = [r for r in requests if r.error is None]
    refutations: list[str] = []
    confirmed_by: list[str] = []
    if before is not None and after is not None:
        server_view = delta(before, after).counters()
        preempted = preemptions(before, after)
        details["preemptions"] = preempted
        if preempted:
            problems.append(
                f"the server preempted {preempted} request(s) during this point "
                "(vllm:num_preemptions_total): its KV cache could not hold the long prompt and "
                f"the {load.background.streams} background streams, so the figures hold "
                "recomputed work"
            )
        gaps = [end - start for r in finished for start, end, _ in r.gaps]
        gaps += list(stream.chunk_gaps_s)
        tokens_after_first = sum(max(0, r.completion_tokens - 1) for r in finished)
        tokens_after_first += max(0, stream.completion_tokens - 1)
        read = [
            end - start
            for r in finished
            for start, end, _ in r.gaps
            if windows.window_of(start, end) is not None
        ]
        read += list(stream.chunk_gaps_s)  # the long request's, in its decode window
        itl = check_server_itl(before, after, gaps, tokens_after_first, load.tolerance, read)
        if itl is not None:
            details["server_itl"] = itl.record()
            if itl.problem is None:
                confirmed_by.append("the server's inter-token histogram")
            else:
                refutations.append(itl.problem)
                if load.keep_disagreeing and not counts["failed"]:
                    disagreement = itl.problem
    by_request = check_background_requests(finished, load.tolerance, windows)
    if by_request is not None:
        details["background_timing"] = by_request.record()
        if by_request.problem is None:
            confirmed_by.append("the server's own timing of each background request")
        else:
            refutations.append(by_request.problem)
    background_figures = view.figures()
    if streams.ready_by is not None:
        details["streams_ready"] = dict(streams.ready_by)
    if counts["failed"]:
        # the point fails already: the load was not K streams throughout, and the server's
        # counts hold requests no stream finished
        details["background_gaps"] = {"verdict": "unchecked", "why": problems[0]}
    elif refutations:
        why = "; ".join(refutations)
        flushed = (streams.ready_by or {}).get("flushed_whole")
        if flushed:
            why += (
                f" ({flushed} of the {load.background.streams} background streams had only had "
                "a request flushed whole when the point began)"
            )
        verdict: dict[str, Any] = {"verdict": "refuted", "why": why}
        if not load.keep_disagreeing:
            problems.append(why + f" ({STRICT_OPTION} fails such points)")
        elif load.keep_unconfirmed:
            verdict["figures"] = KEPT_UNCONFIRMED
        else:
            verdict["figures"] = SET_ASIDE
            details["unconfirmed_figures"] = background_figures
            background_figures = {}
        details["background_gaps"] = verdict
    elif confirmed_by:
        details["background_gaps"] = {"verdict": "confirmed", "by": confirmed_by}
    else:
        details["background_gaps"] = {
            "verdict": "unchecked",
            "why": "the server has neither an inter-token histogram nor per-request metrics",
        }

    details["chunk"] = {
        **(load.server_config or {"unknown": NO_SERVER_INFO}),
        "seen": chunk_from_streams(view, point.length, load.background.streams),
    }
    own = stream.server_timing.decode_s if stream.server_timing is not None else None
    stream_problem = None
    if own is not None:  # the long request's own decode: its stream is judged against it
        stream_figures, stream_info, stream_problem = stream_check(stream, {}, settings, False)
    else:
        stream_info = stream.chunking()
        stream_info["decode_source"] = "stream"
        stream_info["agreement"] = (
            "unchecked: the server's decode time counts the background requests too; the "
            "inter-token histogram is checked instead"
        )
        stream_figures = stream.figures()
    if disagreement is not None and own is None:
        stream_info["decode_source"] = "none"
        stream_info["decode_problem"] = (
            f"{disagreement}; the server's decode time counts the background requests too: "
            "this point has no decode figure"
        )
        stream_figures = set_aside_stream_figures(stream_figures, stream.decode_throughput)
    result = PointMeasurement(
        length=point.length,
        requested_tokens=settings.decode_tokens,
        prompt_tokens=stream.prompt_tokens if stream.prompt_tokens is not None else -1,
        completion_tokens=stream.completion_tokens,
        ttft_s=stream.ttft_s,
        stream_figures=stream_figures,
        server_view=server_view,
        prompt_build_s=prompt.build_s,
        completion_head=stream.completion_head,
        cached_prompt_tokens=stream.cached_prompt_tokens,
        server_requests=None,
        finish_reason=stream.finish_reason,
        watch_figures=(
            watch.figures(stream.prompt_tokens, stream.completion_tokens) if watch else {}
        ),
        energy=watch.energy(stream.prompt_tokens, stream.completion_tokens) if watch else {},
        stream=stream_info,
        cache={"served": stream.cached_prompt_tokens},
        interference=details,
        background_figures=background_figures,
        interference_problem="; ".join(problems) or None,
        stream_problem=stream_problem,
        server_timing=load_timing(stream, requests, settings.stream_tolerance),
    )
    if not settings.allow_unverified:
        problem = why_not or why_not_after
        if problem is None and stream.cached_prompt_tokens is None:
            problem = (
                "the server's usage carries no prompt_tokens_details.cached_tokens (start it "
                "with --enable-prompt-tokens-details): /metrics' cache counters count the "
                "background requests too, so only usage shows the long prompt was cold"
            )
        if problem is None and "server_itl" not in details:
            problem = "the server's /metrics lacks vLLM's inter-token latency histogram"
        if problem is not None:
            raise UnverifiedPoint(
                f"this point cannot be verified: {problem}; " + UNVERIFIED_HINT,
                replace(result, interference={**details, "unverified": problem}),
            )
    return result
