"""The interference workload's instrument against a fake server of exactly known timing: the
background streams' stamps, the windows their gaps fall in, the stall count, the statistics,
the server's inter-token histogram as a cross-check, and the sequence probe."""

from __future__ import annotations

import itertools
import operator
import statistics
import time
from array import array

import pytest
from fake_vllm import Behaviour, FakeVLLMProcess

from pytest_longctx.client import ServerTiming
from pytest_longctx.measure.background import (
    BackgroundRequest,
    BackgroundSpec,
    BackgroundStreams,
    request_decode_tokens,
    request_prompt,
)
from pytest_longctx.measure.measurement import PointSettings, client_for
from pytest_longctx.measure.server_metrics import MetricsSnapshot
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.prompts import Prompt
from pytest_longctx.workloads.interference.under_load import (
    LoadSettings,
    measure_under_load,
    probe_sequences,
)
from pytest_longctx.workloads.interference.windows import (
    BackgroundView,
    GapStats,
    SequenceProbe,
    Windows,
    background_view,
    check_background_requests,
    check_server_itl,
    chunk_from_server_info,
    chunk_from_streams,
)

TOKEN_S = 0.02
PREFILL_S = 1.5
LONG = 2048


def _request(stream: int, times: list[float], index: int = 0) -> BackgroundRequest:
    return BackgroundRequest(
        stream, index, times[0] - 0.01, tuple(times), (1,) * len(times), len(times)
    )


# -- the windows and the statistics, from stamps made up here ---------------------------------


def test_a_gap_belongs_to_the_window_its_midpoint_lies_in() -> None:
    windows = Windows(idle_from=0.0, sent=3.0, first_token=8.0, last_token=9.0)
    assert windows.window_of(1.0, 1.1) == "idle"
    # the stall: from a step after the send to the first token is the prefill's gap
    assert windows.window_of(3.05, 8.01) == "prefill"
    assert windows.window_of(2.99, 3.2) == "prefill"
    assert windows.window_of(8.0, 8.1) == "decode"
    assert windows.window_of(-1.0, -0.5) is None and windows.window_of(9.5, 9.6) is None
    assert windows.seconds("prefill") == 5.0


def test_a_stalled_prefill_has_no_background_token_inside_it() -> None:
    windows = Windows(idle_from=0.0, sent=1.0, first_token=3.0, last_token=3.5)
    step = 0.1
    before = [round(i * step, 6) for i in range(11)]  # 0.0 .. 1.0 s, every step
    # the step in flight at the send arrives just after it; then nothing until the prefill's
    # last step, which brings a token to every stream with the long prompt's first
    stalled = [1.05, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5]
    requests = [_request(stream, before + stalled) for stream in range(4)]
    # a request sent during the prefill: its first token waits for the end of it
    arrived = BackgroundRequest(4, 1, 1.5, (3.02, 3.1), (1, 1), 2)
    view = background_view([*requests, arrived], windows)
    assert view.tokens_during_prefill == 0
    waited = view.waits["prefill"]
    assert waited is not None and waited.count == 1 and waited.max == pytest.approx(1.52)
    prefill = view.gaps["prefill"]
    # two per stream: the step in flight (0.05 s), then the stall (1.95 s)
    assert prefill is not None and prefill.count == 8
    assert prefill.max == pytest.approx(1.95) and prefill.p99 == pytest.approx(1.95, abs=0.02)
    idle = view.gaps["idle"]
    assert (
        idle is not None and idle.median == pytest.approx(step) and idle.max == pytest.approx(step)
    )
    assert view.margin_s == pytest.approx(step)
    figures = view.figures()
    assert figures["bg_tokens_during_prefill"] == 0
    assert figures["bg_itl_prefill_p99"] == pytest.approx(1.95)
    assert figures["bg_rate_prefill"] == pytest.approx(4 * 2 / 2.0)  # 1.0 and 1.05 inside
    assert figures["bg_rate_idle"] == pytest.approx(4 * 10 / 1.0)


def test_a_chunked_prefill_lets_every_stream_through_each_step() -> None:
    windows = Windows(idle_from=0.0, sent=1.0, first_token=3.05, last_token=3.2)
    # the step in flight at the send ends at 1.05; then a token every step of 0.25 s
    chunked = [1.05 + 0.25 * i for i in range(0, 9)]
    requests = [_request(stream, [0.85, 0.95, *chunked]) for stream in range(3)]
    view = background_view(requests, windows)
    # 1.3 .. 2.8 inside, less the last idle step (0.1 s) before the first token: 7 x 3 streams
    assert view.tokens_during_prefill == 7 * 3
    assert view.gaps["prefill"].median == pytest.approx(0.25)
    assert GapStats.of([]) is None


def _snapshot(itl: list[float], count: int | None = None, preempted: int = 0) -> MetricsSnapshot:
    bounds = (0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0)
    lines = [
        f'vllm:inter_token_latency_seconds_bucket{{le="{b}"}} {sum(g <= b for g in itl)}'
        for b in bounds
    ]
    lines.append(f'vllm:inter_token_latency_seconds_bucket{{le="+Inf"}} {len(itl)}')
    lines.append(f"vllm:inter_token_latency_seconds_count {len(itl) if count is None else count}")
    lines.append(f"vllm:inter_token_latency_seconds_sum {sum(itl)}")
    lines.append(f"vllm:num_preemptions_total {preempted}")
    return MetricsSnapshot.from_text("\n".join(lines))


def test_the_servers_inter_token_histogram_confirms_or_refutes_the_streams() -> None:
    before = _snapshot([])
    gaps = [0.02] * 95 + [0.3] * 5
    agrees = check_server_itl(before, _snapshot(gaps), gaps, 100, 0.5)
    assert agrees is not None and agrees.problem is None
    assert agrees.server_count == 100 and agrees.server_max_bucket == (0.1, 0.5)
    # the streams saw half the time the server did: a stamp that lies
    lying = check_server_itl(before, _snapshot([g * 2.5 for g in gaps]), gaps, 100, 0.5)
    assert lying is not None and "gaps sum to" in lying.problem
    # another client's requests: more gaps on the server than the streams received
    other = check_server_itl(before, _snapshot(gaps, count=140), gaps, 100, 0.5)
    assert other is not None and "the server counted 140 inter-token gaps" in other.problem
    assert check_server_itl(before, MetricsSnapshot.from_text("x 1"), gaps, 100, 0.5) is None


def test_a_longest_gap_outside_the_servers_top_bucket_refutes_the_streams() -> None:
    """Counts and sums agree, yet the streams' longest gap is one the server never saw (a
    stall the host made up, or a real one the stamps hid): refuted, on either side of the
    server's highest filled bucket widened by the tolerance."""
    before = _snapshot([])
    server = _snapshot([0.02] * 100)  # every gap in (10, 25] ms; 2 s in all
    stalled = [0.015] * 99 + [0.515]  # the same 2 s and 100 gaps, one of them 515 ms
    check = check_server_itl(before, server, stalled, 100, 0.5)
    assert check is not None and check.server_max_bucket == (0.01, 0.025)
    assert check.client_max_s == pytest.approx(0.515)
    assert check.problem == (
        "the background gaps disagree with the server's inter-token histogram "
        "(vllm:inter_token_latency_seconds): the streams' longest gap is 515.0 ms, the "
        "server's lies in (10, 25] ms"
    )
    # below: the server's longest gap was 0.8 s, the streams' longest 0.26 s
    low = check_server_itl(before, _snapshot([0.8] + [0.2] * 9), [0.26] * 10, 10, 0.5)
    assert low is not None and low.server_max_bucket == (0.5, 1.0)
    assert low.problem is not None and "the server's lies in (500, 1000] ms" in low.problem
    assert "gaps sum to" not in low.problem and "inter-token gaps, the streams" not in low.problem
    # the widened bucket is (10 / 1.5, 25 x 1.5] ms: its edges agree, just past them not
    server = _snapshot([0.011] * 100)  # 1.1 s
    for edge, past in ((0.025 * (1 + 0.5), 1.01), (0.01 / (1 + 0.5), 0.99)):
        others = [min(edge, edge * past, 0.011)] * 99
        at_edge = check_server_itl(before, server, [*others, edge], 100, 0.5)
        assert at_edge is not None and at_edge.problem is None, (edge, at_edge)
        beyond = check_server_itl(before, server, [*others, edge * past], 100, 0.5)
        assert beyond is not None and "the streams' longest gap is" in beyond.problem, edge
    assert check_server_itl(before, server, [], 100, 0.5).client_max_s is None


def test_only_a_gap_the_figures_read_is_held_to_the_servers_top_bucket() -> None:
    """A gap the host stretched where no figure reads it (as the streams started, before the
    idle window) does not refute the figures; the same gap inside the windows does, named as
    such. The shorter side is judged on every gap: the server's longest must show in them."""
    before = _snapshot([])
    server = _snapshot([0.02] * 100)  # every gap in (10, 25] ms; 2 s in all
    stalled = [0.015] * 99 + [0.515]  # one 515 ms gap among the same 2 s and 100 gaps
    outside = check_server_itl(before, server, stalled, 100, 0.5, read=[0.015] * 99)
    assert outside is not None and outside.problem is None
    assert outside.record()["client_max_s"] == pytest.approx(0.515)
    assert outside.record()["client_max_in_windows_s"] == pytest.approx(0.015)
    inside = check_server_itl(before, server, stalled, 100, 0.5, read=stalled)
    assert inside is not None and inside.problem is not None
    assert "the streams' longest gap in the windows is 515.0 ms" in inside.problem
    # the widened bucket's edge, among the gaps read: agrees at it, not just past it
    edge = 0.025 * 1.5
    assert check_server_itl(before, server, stalled, 100, 0.5, read=[edge]).problem is None
    past = check_server_itl(before, server, stalled, 100, 0.5, read=[edge * 1.01])
    assert past.problem is not None
    # the server's 0.8 s gap must show among all of them, not only the gaps read
    low = check_server_itl(before, _snapshot([0.8] + [0.2] * 9), [0.26] * 9 + [0.9], 10, 0.5,
                           read=[0.26] * 9)  # fmt: skip
    assert low is not None and low.problem is None
    assert check_server_itl(before, server, stalled, 100, 0.5, read=[]).problem is None


def test_the_windows_are_half_open_and_the_decode_closed() -> None:
    """Idle ``[idle_from, sent)``, prefill ``[sent, first_token)``, decode ``[first_token,
    last_token]``: a gap whose midpoint lies on a bound belongs to the window it opens."""
    windows = Windows(idle_from=0.0, sent=3.0, first_token=8.0, last_token=9.0)
    assert windows.window_of(0.0, 0.0) == "idle"
    assert windows.window_of(-0.5, 0.0) is None
    assert windows.window_of(2.0, 4.0) == "prefill"  # midpoint at the send
    assert windows.window_of(7.0, 9.0) == "decode"  # at the first token
    assert windows.window_of(9.0, 9.0) == "decode"  # at the last token
    assert windows.window_of(9.0, 9.5) is None


def test_a_windows_gap_statistics() -> None:
    stats = GapStats.of([0.3, 0.1, 1.0, 0.2])
    assert stats == GapStats(4, pytest.approx(0.25), pytest.approx(0.979), 1.0)


def _stream_view(times: list[float], windows: Windows) -> BackgroundView:
    return background_view([_request(0, times)], windows)


def test_tokens_count_in_the_window_they_arrived_in_and_waits_in_their_requests() -> None:
    """A token at the long request's last token is the decode's; one after it, or before the
    idle window, is no window's. A zero-length window has no rate. A request sent in the
    prefill whose first token comes before the decode waited in the prefill."""
    windows = Windows(idle_from=0.0, sent=1.0, first_token=2.0, last_token=2.0)
    view = _stream_view([-0.25, 0.25, 0.5, 0.75, 1.5, 2.0, 2.5], windows)
    assert view.tokens == {"idle": 3, "prefill": 1, "decode": 1}
    figures = view.figures()
    assert (figures["bg_rate_idle"], figures["bg_rate_prefill"]) == (3.0, 1.0)
    assert "bg_rate_decode" not in figures
    sent_in_prefill = BackgroundRequest(1, 1, 1.5, (1.75, 2.5), (1, 1), 2)
    waited = background_view([sent_in_prefill], windows).waits
    assert waited["prefill"] == GapStats(1, 0.25, 0.25, 0.25) and waited["decode"] is None


def test_the_stall_count_needs_a_prefill_longer_than_the_longest_idle_gap() -> None:
    """Tokens during the prefill are counted over the prefill less the longest idle gap (the
    step that brought the first token): none counted when that leaves nothing."""
    idle = [0.0, 0.25, 0.5, 0.75, 1.0]  # steps of 0.25 s until the send at 1.0
    for first_token, counted in ((1.125, None), (1.25, None), (1.75, 0.5)):
        windows = Windows(idle_from=0.0, sent=1.0, first_token=first_token, last_token=2.0)
        view = _stream_view([*idle, first_token, 2.0], windows)
        assert view.margin_s == 0.25
        assert view.counted_s == first_token - 1.0 - 0.25
        assert view.figures().get("bg_tokens_during_prefill") == (None if counted is None else 0)


@pytest.mark.parametrize(
    ("during", "tokens"),
    [
        # never slowed (its gaps equal the longest idle one): its tokens in the window after
        # its first, the step in flight; neither the token at the send nor the one a margin
        # before the first token is inside; a slow gap from the first token on is not the
        # prefill's
        ([1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5], 5),
        # slowed by the gap that began at 1.5: its tokens from there
        ([1.25, 1.5, 2.25, 2.5, 3.0, 3.25], 2),
        # slowed from the send on
        ([1.75, 2.0, 2.25, 2.5, 3.0, 3.25], 4),
    ],
)
def test_tokens_during_the_prefill_are_counted_from_the_first_slowed_gap(
    during: list[float], tokens: int
) -> None:
    windows = Windows(idle_from=0.0, sent=1.0, first_token=3.0, last_token=3.5)
    view = _stream_view([0.0, 0.25, 0.5, 0.75, 1.0, *during], windows)
    assert view.margin_s == 0.25 and view.tokens_during_prefill == tokens


def test_the_servers_histogram_is_read_between_the_two_reads() -> None:
    """The server's counts since the first read; a histogram without its count is none."""
    before = _snapshot([0.5] * 50)  # an earlier point's 50 gaps, 25 s
    gaps = [0.02] * 100
    after = _snapshot([0.5] * 50 + gaps)
    check = check_server_itl(before, after, gaps, 100, 0.5)
    assert check is not None and check.problem is None
    assert (check.server_count, check.server_sum_s) == (100, pytest.approx(2.0))
    assert check.server_max_bucket == (0.01, 0.025)
    sum_only = MetricsSnapshot.from_text("vllm:inter_token_latency_seconds_sum 2.0")
    count_only = MetricsSnapshot.from_text("vllm:inter_token_latency_seconds_count 100")
    assert check_server_itl(_snapshot([]), sum_only, gaps, 100, 0.5) is None
    assert check_server_itl(_snapshot([]), count_only, gaps, 100, 0.5) is None


def test_the_sums_disagree_beyond_the_tolerance_of_the_servers_and_not_at_it() -> None:
    before = _snapshot([])
    server = _snapshot([0.25] * 8, count=12)  # 2 s over the streams' 12 gaps
    exactly_over, exactly_under = [0.25] * 12, [0.125] * 8 + [0.0] * 4  # 3 s, 1 s: 50% apart
    just_over, just_under = [0.2501] + [0.25] * 11, [0.124] + [0.125] * 7 + [0.0] * 4
    for gaps, apart in ((exactly_over, False), (just_over, True), (exactly_under, False)):
        check = check_server_itl(before, server, gaps, 12, 0.5)
        assert check is not None
        assert ("gaps sum to" in (check.problem or "")) is apart, sum(gaps)
    check = check_server_itl(before, server, just_under, 12, 0.5)
    assert check is not None and "gaps sum to 0.999 s" in check.problem
    # under a second, the same: 10 gaps of 20 ms against the server's 0.5 s
    small = check_server_itl(before, _snapshot([0.05] * 10), [0.02] * 10, 10, 0.5)
    assert small is not None and "gaps sum to 0.200 s, the server's to 0.500 s" in small.problem
    # the server counted nothing: its sum says nothing either, its count does
    none = check_server_itl(before, before, [0.02] * 10, 10, 0.5)
    assert none is not None and "the server counted 0 inter-token gaps" in none.problem
    assert "gaps sum to" not in none.problem


def test_the_chunk_comes_from_the_servers_config_or_the_streams() -> None:
    info = {
        "vllm_config": {"scheduler_config": {"max_num_batched_tokens": 2048, "max_num_seqs": 5}}
    }
    assert chunk_from_server_info(info)["max_num_batched_tokens"] == 2048
    assert chunk_from_server_info({"detail": "Not Found"}) is None
    # without it, the streams' tokens per prefill step: 7 steps inside, and the last one
    windows = Windows(idle_from=0.0, sent=1.0, first_token=3.05, last_token=3.2)
    chunked = [1.05 + 0.25 * i for i in range(0, 9)]
    view = background_view([_request(s, [0.85, 0.95, *chunked]) for s in range(3)], windows)
    seen = chunk_from_streams(view, 16384, 3)
    assert seen["prefill_steps_seen"] == 8 and seen["estimated_chunk_tokens"] == 2048


def test_the_sequence_probe_decides_from_the_gauges() -> None:
    probe = SequenceProbe(wanted=5, persist_s=1.0)
    assert probe.add(0.0, 3, 0) is None  # requests still arriving
    assert probe.add(0.1, 5, 0) is True
    limited = SequenceProbe(wanted=5, persist_s=1.0)
    assert limited.add(0.0, 1, 4) is None
    assert limited.add(0.5, 1, 4) is None
    assert limited.add(1.2, 1, 4) is False
    refusal = limited.refusal("http://x", 4)
    assert "cannot run 5 requests at once" in refusal and "at most 1 ran at once" in refusal
    assert "--max-num-seqs 5" in refusal


# -- against the fake server --------------------------------------------------------------


def _behaviour(**changes) -> Behaviour:  # noqa: ANN003
    settings = {
        "long_prompt_from": 1000,
        "first_token_delay_s": PREFILL_S,
        "short_first_token_delay_s": TOKEN_S,
        "token_delay_s": TOKEN_S,
        "prompt_tokens_details": True,
        "scheduler_config": {"max_num_batched_tokens": 4096, "max_num_seqs": 8},
    }
    settings.update(changes)
    return Behaviour(**settings)


def _spec(url: str, streams: int = 3) -> BackgroundSpec:
    return BackgroundSpec(
        base_url=url,
        model="fake-model",
        streams=streams,
        prompt_ids=tuple(range(100, 164)),
        nonce_pool=tuple(range(1000, 2000)),
        nonce_key="test",
        decode_tokens=16,
    )


def _measure(  # noqa: ANN202
    fake: FakeVLLMProcess, idle_s: float = 1.0, streams: int = 3, keep_unconfirmed: bool = False
):
    server = ServerInfo(fake.url, "fake-model", 32_768, "attached")
    prompt = Prompt(LONG, array("I", range(LONG)), 0, 0.0)
    settings = PointSettings(decode_tokens=8, first_token_budget_s=60, budget_source="test")
    with client_for(server) as client:
        info = chunk_from_server_info(client.server_info())
        load = LoadSettings(
            _spec(fake.url, streams),
            idle_s=idle_s,
            server_config=info,
            keep_unconfirmed=keep_unconfirmed,
        )
        return measure_under_load(
            client, server, Point(LONG, 0, background=streams), prompt, settings, load
        )


@pytest.fixture(scope="module")
def stalled():  # noqa: ANN201
    """One point on a fake whose long prefill stalls every other stream (one big step)."""
    with FakeVLLMProcess(_behaviour(prefill_interference="stall")) as fake:
        result = _measure(fake)
        yield result, fake.streams


def test_the_stamps_are_the_servers_writes_seen_on_the_same_clock() -> None:
    """Each background token arrives after the fake wrote it and soon after: the background
    process and the fake stamp on the one monotonic clock of the machine."""
    with FakeVLLMProcess(_behaviour()) as fake:
        with BackgroundStreams(_spec(fake.url)) as streams:
            assert streams.wait_streaming(30)
            time.sleep(0.8)
            requests = streams.stop()
        written = fake.streams
    assert {r.stream for r in requests} == {0, 1, 2} and all(r.error is None for r in requests)
    assert len(requests) == len(written) >= 6  # each stream sent one request after another
    spec = _spec(fake.url)
    by_nonce = {w.prompt_head[:4]: w for w in written}
    lags = []
    for request in requests:
        server = by_nonce[tuple(request_prompt(spec, request.stream, request.index)[:4])]
        tokens = request_decode_tokens(spec, request.stream, request.index)
        assert len(server.chunks_written_at) == len(request.token_times) == tokens
        for wrote, arrived in zip(server.chunks_written_at, request.token_times, strict=True):
            lags.append(arrived - wrote)
    assert min(lags) >= 0  # never before the fake wrote it: one clock for both processes
    assert statistics.median(lags) < 0.005


def test_the_streams_requests_never_end_in_the_same_step() -> None:
    """The first requests end a K-th of the decode apart and the later ones decode all of
    it, so on a server that steps every stream together (vLLM's batch) the streams' request
    boundaries stay that far apart: a prefill step the long prompt holds shows as a gap in
    K - 1 streams at least. (Sent in step, all four requests of a busy CPU server once ended
    together just as a 16Ki prompt began its one-step prefill: the streams waited it out as
    first-token time, and the longest gap beside it was 0.4 s.) The stand-in streams each
    request on its own clock, one token time a step, so each first request's span is read
    on that clock, from the stand-in's own stamps of what it wrote: the tokens it wrote after
    the first, a K-th of the decode more from one stream to the next. (The client's arrival
    times are not the server's steps: a loaded host that held the reader back read 16 tokens
    over 0.191 s where the stand-in took 0.3.)"""
    with FakeVLLMProcess(_behaviour()) as fake, BackgroundStreams(_spec(fake.url)) as streams:
        assert streams.wait_streaming(30)
        time.sleep(1.2)
        requests = streams.stop()
        written = fake.streams
    first = sorted((r.stream, r.completion_tokens) for r in requests if r.index == 0)
    assert first == [(0, 5), (1, 10), (2, 16)]
    assert {r.completion_tokens for r in requests if r.index > 0} == {16}
    spec = _spec(fake.url)
    by_nonce = {w.prompt_head[:4]: w for w in written}
    steps = []
    for request in sorted(requests, key=lambda r: r.stream):
        if request.index:
            continue
        server = by_nonce[tuple(request_prompt(spec, request.stream, 0)[:4])]
        # the stream the client timed is the one the stand-in wrote, token by token, each
        # seen no sooner than written (one clock for both processes)
        assert len(server.chunks_written_at) == len(request.token_times), request
        assert all(map(operator.ge, request.token_times, server.chunks_written_at)), request
        steps.append(sum(server.tokens_per_chunk) - server.tokens_per_chunk[0])
    # begun together, the first requests end in stream order, several steps apart
    assert all(b - a > 2 for a, b in itertools.pairwise(steps)), steps


def test_the_wait_ends_once_every_streams_first_request_has_ended() -> None:
    """The streams' start is behind the point before its idle window begins: every stream's
    first request has ended (its last token arrived) by the moment the wait ends, each seen
    streaming, and every stream is on a later request then."""
    with FakeVLLMProcess(_behaviour()) as fake, BackgroundStreams(_spec(fake.url)) as streams:
        assert streams.wait_streaming(30)
        ready = streams.ready_at
        time.sleep(0.4)
        requests = streams.stop()
    assert ready is not None
    first = {r.stream: r for r in requests if r.index == 0}
    assert sorted(first) == [0, 1, 2]
    assert all(r.token_times[-1] <= ready for r in first.values()), [
        r.token_times[-1] - ready for r in first.values()
    ]
    assert streams.ready_by == {"streaming": 3, "flushed_whole": 0}


def test_streams_flushed_whole_are_streaming_once_each_first_request_arrived() -> None:
    """A starved API server hands each background request over whole, in one flush: the
    stream's first token and its last arrive together and the next request starts at once.
    Each stream counts as streaming from its first token however briefly its request lasted
    after it, so the wait ends with the streams' first requests (it once went on for 45 s,
    33 requests, until a poll happened to fall inside one)."""
    with (
        FakeVLLMProcess(_behaviour(deliver_at_once=True)) as fake,
        BackgroundStreams(_spec(fake.url)) as streams,
    ):
        assert streams.wait_streaming(60)
        requests = streams.stop()
    ready = streams.ready_at
    assert ready is not None
    first = {r.stream: r for r in requests if r.index == 0}
    assert sorted(first) == [0, 1, 2]
    # the wait ended only once every stream's first request had arrived ...
    assert all(r.token_times[0] <= ready for r in first.values())
    # ... and no stream was on its third request by then (each one 16 tokens of the stand-in)
    late = [(r.stream, r.index) for r in requests if r.index >= 2 and r.token_times[0] < ready]
    assert not late, late


def test_every_background_request_has_its_own_nonce() -> None:
    spec = _spec("http://unused")
    prompts = [request_prompt(spec, stream, index) for stream in range(3) for index in range(50)]
    assert len({tuple(p[:4]) for p in prompts}) == len(prompts)
    assert all(p[4:] == list(spec.prompt_ids[4:]) for p in prompts)


def test_the_point_sees_its_prompt_cold_and_every_request_counted(stalled) -> None:  # noqa: ANN001
    result, streams = stalled
    short = [s for s in streams if s.tokens != 8]  # all but the measured request
    assert result.interference["background_requests"] == {
        "requests": len(short),
        "finished": len(short),
        "failed": 0,
    }
    assert result.interference["background_streams"] == 3
    assert result.prompt_tokens == LONG and result.cached_prompt_tokens == 0
    assert result.interference["long_cached_tokens"] == 0


def written_before_the_prefill(result, streams) -> int:  # noqa: ANN001
    """Background tokens the stand-in wrote from the long prompt's send until it had read
    that prompt and began its prefill. They waited for no prefill, but a host that holds the
    stand-in back there (a tenth of a second once, on a loaded host) lets them through after
    a gap the client cannot tell from a slowed step. The send is no later than the long
    prompt's first token's write less its TTFT (the token arrives after its write); a token
    earlier may be in flight at the send."""
    (long,) = [s for s in streams if s.prompt_head[:4] == (0, 1, 2, 3)]
    sent_no_later = long.first_token_at - result.ttft_s
    return sum(
        count
        for stream in streams
        if stream is not long
        for at, count in zip(stream.chunks_written_at, stream.tokens_per_chunk, strict=True)
        if sent_no_later - TOKEN_S <= at < long.body_read_at
    )


def test_a_stalling_prefill_reads_as_a_stall(stalled) -> None:  # noqa: ANN001
    result, streams = stalled
    figures = result.figures()
    # none written during the stand-in's prefill (the rule on exact times: the test above)
    assert figures["bg_tokens_during_prefill"] <= written_before_the_prefill(result, streams)
    assert figures["bg_itl_prefill_max"] > 0.8 * PREFILL_S
    assert figures["bg_itl_idle_median"] == pytest.approx(TOKEN_S, abs=0.01)
    assert figures["bg_itl_idle_p99"] < 0.2 * PREFILL_S
    assert figures["bg_rate_prefill"] < 0.2 * figures["bg_rate_idle"]
    assert result.ttft_s == pytest.approx(PREFILL_S, abs=0.3)
    details = result.interference
    assert details["windows_s"]["prefill"] == pytest.approx(result.ttft_s)
    # the idle window: from every stream's first token, the 1 s reference at least, to the
    # send, no later than the stand-in read the long prompt (its writes on the same clock)
    (long,) = [s for s in streams if s.prompt_head[:4] == (0, 1, 2, 3)]
    by_head = {written.prompt_head[:4]: written for written in streams}
    spec = _spec("http://unused")
    streaming_from = max(
        by_head[tuple(request_prompt(spec, stream, 0)[:4])].chunks_written_at[0]
        for stream in range(3)
    )
    assert 1.0 <= details["windows_s"]["idle"] <= long.body_read_at - streaming_from
    assert details["chunk"]["max_num_batched_tokens"] == 4096
    # one step, the whole prompt; and a step for each K tokens let through before the
    # stand-in read the prompt (as above: on a quiet host none)
    seen_steps = details["chunk"]["seen"]["prefill_steps_seen"]
    assert seen_steps == round(1 + figures["bg_tokens_during_prefill"] / 3, 2)
    assert seen_steps <= 1 + written_before_the_prefill(result, streams) / 3
    assert details["server_itl"]["agreement"] == "agrees", details["server_itl"]
    # confirmed, so kept where reports and the gate read them
    assert details["background_gaps"] == {
        "verdict": "confirmed",
        "by": ["the server's inter-token histogram"],
    }
    assert "unconfirmed_figures" not in details
    # every stream was seen receiving tokens before the idle reference began
    assert details["streams_ready"] == {"streaming": 3, "flushed_whole": 0}
    assert details["preemptions"] == 0
    assert result.interference_problem is None


def test_a_chunked_prefill_lets_tokens_through_at_a_slower_pace() -> None:
    """A prefill of 3 s: the window from the send also holds the stand-in's wait before it
    read the long prompt, when tokens come at the idle pace (0.3 s on a loaded host once,
    which in a prefill of 1.5 s gave the median gap to the idle pace)."""
    slow, prefill_s = 0.1, 2 * PREFILL_S
    behaviour = _behaviour(
        prefill_interference="slow", interference_token_delay_s=slow, first_token_delay_s=prefill_s
    )
    with FakeVLLMProcess(behaviour) as fake:
        result = _measure(fake)
    figures = result.figures()
    # three streams, a token every 0.1 s through most of the prefill
    assert figures["bg_tokens_during_prefill"] >= 3 * 8 * 2
    assert figures["bg_itl_prefill_median"] == pytest.approx(slow, abs=0.03)
    assert figures["bg_itl_idle_median"] == pytest.approx(TOKEN_S, abs=0.01)
    assert statistics.fmean([figures["bg_itl_prefill_p99"], slow]) < prefill_s
    assert result.interference_problem is None


def test_the_long_request_and_each_background_request_carry_their_own_server_timing() -> None:
    """vLLM's per-request metrics on every request of the point: the long request's TTFT and
    decode its own (its stream judged against them, not /metrics' sum over every request),
    and beside it each background request's, matched to what the stand-in sent for it."""
    behaviour = _behaviour(prefill_interference="stall", per_request_metrics=True)
    with FakeVLLMProcess(behaviour) as fake:
        result = _measure(fake)
        written = fake.streams
    timing = result.server_timing
    assert timing["source"] == "per_request"
    by_head = {stream.prompt_head[:4]: stream for stream in written}
    long_sent = by_head[(0, 1, 2, 3)].metrics
    assert long_sent is not None
    entry = timing["request"]
    assert entry["ttft_s"] == long_sent["time_to_first_token_ms"] / 1000
    assert entry["ttft_s"] >= PREFILL_S and entry["client_ttft_s"] == result.ttft_s
    assert entry["front_end_s"] == pytest.approx(result.ttft_s - entry["ttft_s"])
    assert entry["decode"] == "agrees"
    assert result.stream["decode_source"] == "stream" and result.stream["agreement"] == "agrees"
    assert "per-request" in result.stream["server_decode_from"]
    assert result.figures()["server_request_ttft"] == entry["ttft_s"]
    spec = _spec(fake.url)
    finished = result.interference["background_requests"]["finished"]
    background = timing["background"]
    assert len(background) == finished >= 6
    for request in background:
        sent = by_head[tuple(request_prompt(spec, request["stream"], request["index"])[:4])]
        assert sent.metrics is not None
        assert request["ttft_s"] == sent.metrics["time_to_first_token_ms"] / 1000
        assert request["decode_s"] == sent.metrics["generation_time_ms"] / 1000
        assert request["client_ttft_s"] >= request["ttft_s"]
    counts = timing["background_decode"]
    assert sum(counts.values()) == finished
    # a request whose decode the stall split in two is no burst: its gaps are the server's
    # (a host that holds the background process back may burst one now and then; the test
    # below has every one of them disagree)
    assert counts["agree"] > finished / 2, [r["decode"] for r in background]


def test_a_long_stream_flushed_whole_keeps_its_own_requests_decode() -> None:
    """Every stream handed over whole (a starved API server): the histogram refutes the
    gaps, but the long request has the server's figure of its own, so it keeps that decode
    (not none), and each background request's stream is named as not showing its decode.
    The background figures are fiction: each request's own timing refutes them too, the
    streams were ready only by requests flushed whole, and they are set aside, not gated;
    --longctx-allow-unconfirmed keeps them where the gate reads them."""
    behaviour = _behaviour(deliver_at_once=True, token_delay_s=0.005, per_request_metrics=True)
    with FakeVLLMProcess(behaviour) as fake:
        result = _measure(fake)
        written = fake.streams
        kept = _measure(fake, keep_unconfirmed=True)
    # The stand-in's own stamps: a request whose writes a held-back host spread over half its
    # decode or more was not handed over whole, and its stream may show its decode.
    spread = sum(
        1
        for stream in written
        if len(stream.chunks_written_at) > 1
        and stream.chunks_written_at[-1] - stream.chunks_written_at[0] >= stream.decode_s / 2
    )
    entry = result.server_timing["request"]
    assert "the stream delivered" in entry["decode"]
    assert result.stream["decode_source"] == "server"
    assert result.figures()["decode_throughput"] == pytest.approx(7 / entry["decode_s"])
    assert "stream_decode_throughput" in result.figures()
    counts = result.server_timing["background_decode"]
    assert counts["disagree"] == len(result.server_timing["background"]) > 0, counts
    details = result.interference
    assert details["streams_ready"] == {"streaming": 0, "flushed_whole": 3}
    timing = details["background_timing"]
    # every request a window holds and the stand-in wrote whole is refuted; those before the
    # idle window are not judged
    judged = len(result.server_timing["background"]) - timing["outside_windows"]
    assert timing["checked"] == judged > spread, (timing, spread)
    assert timing["checked"] - spread <= timing["refuted"] <= timing["checked"], (timing, spread)
    assert timing["outside_windows"] >= 3, timing  # the streams' first requests at least
    furthest = timing["furthest"]  # written at once: its chunks all but together
    assert furthest["client_decode_s"] < furthest["server_decode_s"] / 10, furthest
    gaps = details["background_gaps"]
    assert gaps["verdict"] == "refuted"
    assert "inter-token histogram" in gaps["why"] and "per-request metrics" in gaps["why"]
    assert "3 of the 3 background streams had only had a request flushed whole" in gaps["why"]
    assert gaps["figures"].startswith("set aside under unconfirmed_figures, not reported")
    # measured and kept in the record, out of the figures reports and the gate read
    assert not [name for name in result.figures() if name.startswith("bg_")]
    assert details["unconfirmed_figures"]["bg_itl_idle_p99"] >= 0
    assert result.interference_problem is None  # the point passes, with its TTFT under load
    assert result.figures()["ttft"] >= PREFILL_S
    # --longctx-allow-unconfirmed: the same refutation, the figures kept and gated
    assert kept.interference["background_gaps"]["verdict"] == "refuted"
    assert "--longctx-allow-unconfirmed" in kept.interference["background_gaps"]["figures"]
    assert "unconfirmed_figures" not in kept.interference
    assert kept.figures()["bg_itl_idle_p99"] >= 0 and kept.interference_problem is None


def test_background_requests_are_checked_against_the_servers_timing_of_each() -> None:
    """A request's stream, first chunk to last, against the server's own decode of it: a
    stall the prefill made lies in both and agrees; a request flushed whole (0 s) or held
    back past its last token does not; one no window of the point holds (flushed before the
    idle window began) is counted, not judged: no figure reads it; a request without the
    server's figure is not checked, and none with one leaves nothing to say."""
    windows = Windows(idle_from=0.0, sent=1.0, first_token=2.0, last_token=3.0)
    steps = [0.01 * i for i in range(16)]
    stalled = [*steps[:8], *(2.0 + t for t in steps[8:])]  # one 1.9 s stall inside

    def request(stream: int, times: list[float], decode_s: float | None, counts=None):  # noqa: ANN001, ANN202
        counts = counts or (1,) * len(times)
        timing = ServerTiming(decode_s=decode_s) if decode_s is not None else None
        return BackgroundRequest(
            stream, 0, -0.1, tuple(times), tuple(counts), 16, server_timing=timing
        )

    agrees = [request(0, steps, 0.15), request(1, stalled, stalled[-1] - stalled[0])]
    check = check_background_requests(agrees, 0.5, windows)
    assert check is not None and (check.checked, check.refuted, check.problem) == (2, 0, None)
    assert check.record()["agreement"] == "agrees"
    flushed = request(2, [0.3], 0.15, counts=(16,))
    held = request(3, [*steps[:15], 0.9], 0.15)  # the last token 0.75 s late
    before = request(5, [-0.05, -0.049], 0.15, counts=(15, 1))  # flushed as the streams began
    check = check_background_requests([*agrees, flushed, held, before], 0.5, windows)
    assert check is not None and (check.checked, check.refuted) == (4, 2)
    assert check.record()["outside_windows"] == 1
    assert check.worst == (3, 0, pytest.approx(0.9), 0.15)
    assert check.problem.startswith(
        "the background streams disagree with the server's own timing of their requests "
        "(vLLM's per-request metrics): 2 of 4 requests' streams spanned their decode more "
        "than 50% off the server's (furthest: stream 3's request 0, 0.900 s first chunk to "
        "last, the server 0.150 s first token to last)"
    )
    assert check_background_requests([request(4, steps, None)], 0.5, windows) is None
    # judged once a window holds it: the same flushed request a moment into the idle window
    inside = request(5, [0.01, 0.011], 0.15, counts=(15, 1))
    check = check_background_requests([inside], 0.5, windows)
    assert check is not None and (check.checked, check.refuted, check.outside_windows) == (1, 1, 0)


def test_first_requests_flushed_whole_as_the_streams_start_leave_the_point_confirmed() -> None:
    """An API server starved while the streams start hands each stream's first request over
    whole; then every stream streams on schedule. No figure reads those first requests (all
    came before the idle window began), so the server's timing of each request judges the
    others and confirms the gaps, as the histogram does over them all: the figures stay."""
    behaviour = _behaviour(
        prefill_interference="stall", per_request_metrics=True, flush_first_requests=3
    )
    with FakeVLLMProcess(behaviour) as fake:
        result = _measure(fake)
    details = result.interference
    assert details["streams_ready"]["flushed_whole"] >= 1, details["streams_ready"]
    timing = details["background_timing"]
    assert timing["outside_windows"] >= 3 and timing["checked"] > 0, timing  # first requests
    assert timing["agreement"] == "agrees", timing
    assert details["background_gaps"]["verdict"] == "confirmed", details["background_gaps"]
    assert (
        "the server's own timing of each background request" in (details["background_gaps"]["by"])
    )
    assert result.figures()["bg_itl_prefill_max"] > 0.8 * PREFILL_S


def test_a_request_is_judged_where_a_window_holds_it_and_at_the_rules_edges() -> None:
    """Which requests are judged, and the edges of the rule: a window holds a request by a
    token inside it (its ends included), a gap or its wait whose midpoint lies in one; a
    failed request or one of a single token is not judged; a stream exactly the tolerance off
    the server's agrees; the furthest request is the one furthest off, the first of a tie."""
    windows = Windows(idle_from=0.0, sent=1.0, first_token=2.0, last_token=3.0)

    def request(times: tuple[float, ...], sent_at: float) -> BackgroundRequest:
        return BackgroundRequest(0, 0, sent_at, times, (1,) * len(times), len(times))

    assert windows.hold_any_of(request((0.0,), -0.1))  # a token at the idle window's start
    assert windows.hold_any_of(request((3.0,), -3.2))  # one at the long request's last token
    assert windows.hold_any_of(request((-1.0, 3.5), -1.1))  # a gap across the windows
    assert windows.hold_any_of(request((3.5,), 2.5))  # a wait whose midpoint is in decode
    assert not windows.hold_any_of(request((-0.5, -0.4), -0.6))
    assert not windows.hold_any_of(request((3.1, 3.2), 3.05))

    def timed(  # noqa: ANN202
        stream: int,
        times: tuple[float, ...],
        decode_s: float,
        tokens: int = 0,
        error=None,  # noqa: ANN001
    ):
        return BackgroundRequest(
            stream, 0, times[0] - 0.01, times, (1,) * len(times), tokens or len(times),
            error=error, server_timing=ServerTiming(decode_s=decode_s),
        )  # fmt: skip

    failed = timed(0, (0.5, 0.6), 0.9, error="the server closed the stream")
    single = timed(1, (0.5,), 0.15, tokens=1)
    assert check_background_requests([failed, single], 0.5, windows) is None
    two = timed(2, (0.5, 0.9), 0.1)  # two tokens: judged
    check = check_background_requests([two], 0.5, windows)
    assert check is not None and (check.checked, check.refuted) == (1, 1)
    # exactly the tolerance off (0.375 s against 0.25 s at 50 %): agrees; beyond it: not
    edge = timed(3, (1.0, 1.375), 0.25)
    assert check_background_requests([edge], 0.5, windows).refuted == 0
    assert check_background_requests([edge], 0.49, windows).refuted == 1
    # and never less than MIN_DISAGREEMENT_S off: 5 ms against a server's 0 s agrees
    assert check_background_requests([timed(4, (0.0, 0.005), 0.0)], 0.5, windows).refuted == 0
    # only requests outside every window: counted, none judged, nothing refuted
    before = timed(5, (-0.5, -0.4), 0.9)
    check = check_background_requests([before], 0.5, windows)
    assert check is not None and check.record()["outside_windows"] == 1
    assert (check.checked, check.refuted, check.problem) == (0, 0, None)
    # the furthest off: 0.875 s beats 0.75 s (the differences, not the sums); a tie keeps the
    # first
    first, further = timed(6, (0.125, 1.0), 0.125), timed(7, (0.125, 1.125), 0.125)
    assert check_background_requests([first, further], 0.5, windows).worst[0] == 7
    assert check_background_requests([further, first], 0.5, windows).worst[0] == 7
    tie = timed(8, (0.25, 1.125), 0.125)
    assert check_background_requests([first, tie], 0.5, windows).worst[0] == 6


def test_a_preemption_during_the_point_fails_it() -> None:
    with FakeVLLMProcess(_behaviour(preemptions_per_long_request=2)) as fake:
        result = _measure(fake, idle_s=0.3)
    assert result.interference["preemptions"] == 2
    assert "preempted 2 request(s)" in result.interference_problem


def test_a_server_that_runs_one_request_at_a_time_is_refused_with_the_reason() -> None:
    with FakeVLLMProcess(_behaviour(max_num_seqs=1, first_token_delay_s=0.1)) as fake:
        server = ServerInfo(fake.url, "fake-model", 32_768, "attached")
        with client_for(server) as client:
            found = probe_sequences(client, server, _spec(fake.url, streams=5), timeout_s=20)
    assert "ran_at_once" not in found
    assert found["most_running"] == 1
    assert "cannot run 5 requests at once" in found["refused"]
    assert "at most 1 ran at once while 4 waited" in found["refused"]


def test_a_server_with_room_runs_them_at_once() -> None:
    with FakeVLLMProcess(_behaviour(first_token_delay_s=0.1, token_delay_s=0.05)) as fake:
        server = ServerInfo(fake.url, "fake-model", 32_768, "attached")
        with client_for(server) as client:
            found = probe_sequences(client, server, _spec(fake.url, streams=5), timeout_s=20)
    assert found.get("ran_at_once") is True and found["most_running"] >= 5
