"""The instrument against a server whose timing and faults are known exactly.

Timing checks here assert only what the code guarantees on any machine, however loaded: a
token never arrives before the fake wrote it, nor before its injected delay, and the figures
relate to each other and to the counts as defined. How close the figures are to the truth is
judged on many requests in test_accuracy.py.
"""

from __future__ import annotations

import http.server
import json
import math
import socket
import threading
import time
import traceback
from array import array
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from fake_vllm import (  # noqa: F401
    MIN_STEP_SHARE,
    TOO_LONG_MESSAGE,
    Behaviour,
    FakeVLLM,
    fake_vllm,
    word_ids,
)

from pytest_longctx.client import (
    ClientConfig,
    CompletionClient,
    CompletionCountError,
    CompletionRequest,
    ErrorFrameError,
    FirstTokenTimeoutError,
    InterTokenTimeoutError,
    MalformedChunkError,
    MeasurementError,
    MissingUsageError,
    PromptTooLongError,
    RequestRejectedError,
    ServerUnavailableError,
    StreamError,
    TruncatedStreamError,
    encode_request,
    encode_token_ids,
    quantile,
    summarize_stream,
)
from pytest_longctx.client import client as client_module
from pytest_longctx.client import request as request_module
from pytest_longctx.client import result as result_module
from pytest_longctx.core.sizes import format_size, parse_size, powers_of_two_between
from pytest_longctx.measure.agreement import judge_stream
from pytest_longctx.measure.server_metrics import (
    ExpositionError,
    MetricsSnapshot,
    cache_config_labels,
    delta,
    parse_exposition,
)
from pytest_longctx.measure.timeouts import FirstTokenBudget

MODEL = "fake-model"
SECRET = "sk-test-4f9a1c2e"


@pytest.fixture
def server() -> Iterator[FakeVLLM]:
    with FakeVLLM() as fake:
        yield fake


def client_for(fake: FakeVLLM, **config: object) -> CompletionClient:
    return CompletionClient(ClientConfig(base_url=fake.url, **config))  # type: ignore[arg-type]


def ids_request(length: int = 100, decode: int = 20, **fields: object) -> CompletionRequest:
    return CompletionRequest(
        model=MODEL, prompt=list(range(length)), decode_tokens=decode, **fields
    )  # type: ignore[arg-type]


def refused_url() -> str:
    """A loopback port that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------
# The request body


@pytest.mark.parametrize(
    "ids",
    [
        [0],
        [5, 10, 99, 100, 12345],
        list(range(3000)),
        [4194303, 1, 4194304, 2**32 - 1, 2**40],  # past the lookup table: digit by digit
        np.array([3, 2, 1], dtype=np.int16),
        array("I", [7, 8, 9, 151_935]),
        range(5, 500, 7),
        [],
    ],
    ids=["one", "mixed-widths", "3000", "wide", "int16", "array-I", "range", "empty"],
)
def test_token_ids_encode_like_json_dumps(ids: object) -> None:
    expected = b"<" + json.dumps([int(i) for i in ids], separators=(",", ":")).encode() + b">"  # type: ignore[attr-defined]
    assert bytes(encode_token_ids(ids, prefix=b"<", suffix=b">")) == expected  # type: ignore[arg-type]


def test_python_fallback_encodes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_module, "np", None)
    assert bytes(encode_token_ids(array("I", [1, 22, 333]))) == b"[1,22,333]"
    with pytest.raises(ValueError, match="-4"):
        encode_token_ids([1, -4])


@pytest.mark.parametrize(
    ("ids", "complaint"),
    [([3, -1], "negative"), ([1.5], "float"), ([[1, 2]], "flat"), (["7"], "dtype")],
)
def test_bad_token_ids_are_named(ids: object, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        encode_token_ids(ids)  # type: ignore[arg-type]


def test_request_body_holds_the_decode_contract() -> None:
    request = ids_request(
        length=5, decode=64, extra_body={"temperature": 0.5, "seed": 3}, return_token_ids=True
    )
    body = encode_request(request)
    decoded = json.loads(bytes(body.data))
    assert decoded == {
        "model": MODEL,
        "prompt": [0, 1, 2, 3, 4],
        "max_tokens": 64,
        "min_tokens": 64,
        "ignore_eos": True,
        "temperature": 0.5,  # extra_body wins
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }
    assert body.size == len(bytes(body.data))
    assert b"".join(body.chunks(7)) == bytes(body.data)


def test_text_prompt_body_and_repr() -> None:
    request = CompletionRequest(model=MODEL, prompt='say "hi"\n', decode_tokens=2)
    assert json.loads(bytes(encode_request(request).data))["prompt"] == 'say "hi"\n'
    assert request.prompt_length is None
    long_request = ids_request(length=100_000)
    assert "100000 ids" in repr(long_request)
    assert len(repr(long_request)) < 300


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [({"decode_tokens": 0}, "positive"), ({"extra_body": {"prompt": [1]}}, "prompt")],
)
def test_request_rejects_bad_fields(fields: dict, complaint: str) -> None:
    arguments = {"model": MODEL, "prompt": [1], "decode_tokens": 4, **fields}
    with pytest.raises(ValueError, match=complaint):
        CompletionRequest(**arguments)


# ---------------------------------------------------------------------------------------------
# Figures from a stream


def test_event_stream_split_anywhere() -> None:
    stream = (
        b": a comment\r\n"
        b'data: {"a": 1}\r\n\r\n'
        b"event: ignored\n"
        b'data: {"b":\n'
        b"data: 2}\n\n"
        b"data: [DONE]\n\n"
    )
    expected = ['{"a": 1}', '{"b":\n2}', "[DONE]"]
    for step in (1, 2, 5, len(stream)):
        decoder = client_module._SSEDecoder()
        events = []
        for start in range(0, len(stream), step):
            events += decoder.feed(stream[start : start + step])
        assert events + decoder.finish() == expected, step
    unterminated = client_module._SSEDecoder()
    assert unterminated.feed(b"data: x") == []
    assert unterminated.finish() == ["x"]
    # the space after "data:" is optional in server-sent events: one is dropped, no more
    spaced = client_module._SSEDecoder()
    assert spaced.feed(b'data:{"c": 3}\n\ndata:  two spaces\n\n') == ['{"c": 3}', " two spaces"]


def test_summary_hand_computed() -> None:
    # chunks at 1.0, 1.1, 1.3, 1.6 s carrying 1, 1, 2, 1 tokens; the server counted 5
    throughput, gaps = summarize_stream((1.0, 1.1, 1.3, 1.6), (1, 1, 2, 1), 5)
    assert throughput == pytest.approx(4 / 0.6)  # (5 - 1) / (1.6 - 1.0)
    assert gaps == pytest.approx((0.1, 0.1, 0.1, 0.3))  # the 2-token chunk: two gaps of 0.1
    ordered = sorted(gaps)
    assert quantile(ordered, 0.5) == pytest.approx(0.1)
    assert quantile(ordered, 0.9) == pytest.approx(0.1 + 0.2 * 0.7)  # rank 2.7 of 0..3


def test_summary_needs_two_chunks() -> None:
    assert summarize_stream((0.5,), (1,), 1) == (None, ())
    assert summarize_stream((1.0, 1.5), (1, 1), 2) == (2.0, (0.5,))  # two chunks are enough
    assert summarize_stream((1.0, 1.0), (1, 1), 2) == (None, (0.0,))  # no span: no rate
    assert summarize_stream((1.0, 2.0), (1, 1), 1)[0] is None  # nothing after the first
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def assert_after_the_writes(result: object, times: object) -> None:
    """Every carrying chunk arrived after the fake wrote it, one arrival per written chunk."""
    arrivals = [result.started_perf_s + t for t in result.token_times_s]  # type: ignore[attr-defined]
    written = times.chunks_written_at  # type: ignore[attr-defined]
    assert len(arrivals) == len(written)
    assert all(a >= w for a, w in zip(arrivals, written, strict=True))
    assert result.started_perf_s < times.request_at  # type: ignore[attr-defined]


def test_ttft_and_decode_follow_the_injected_delays(server: FakeVLLM) -> None:
    server.configure(first_token_delay_s=0.3, token_delay_s=0.02)
    with client_for(server) as client:
        result = client.measure(ids_request(length=100, decode=20), first_token_budget_s=10)
    assert_after_the_writes(result, server.streams[-1])
    assert result.ttft_s >= 0.3  # the fake writes no earlier than 0.3 s after reading it
    assert result.ttft_s == result.token_times_s[0]
    assert list(result.token_times_s) == sorted(result.token_times_s)
    assert result.e2e_s >= result.token_times_s[-1] >= 0.3 + 19 * 0.02
    span = result.token_times_s[-1] - result.token_times_s[0]
    assert result.decode_throughput == pytest.approx(19 / span)
    assert sum(result.itl_s) == pytest.approx(span)
    assert result.itl_median_s == pytest.approx(quantile(sorted(result.itl_s), 0.5))
    assert result.itl_p90_s == pytest.approx(quantile(sorted(result.itl_s), 0.9))
    assert result.itl_max_s == max(result.itl_s)
    assert result.completion_tokens == 20
    assert result.prompt_tokens == 100
    assert result.requested_tokens == 20
    assert len(result.token_times_s) == 20 and len(result.itl_s) == 19
    assert result.e2e_s >= 0.3 + 19 * 0.02
    assert result.finish_reason == "length"
    assert result.token_count_source == "usage"  # the running count of every chunk
    assert result.per_token and result.stream_interval == 1
    assert result.body_bytes == len(encode_request(ids_request(length=100, decode=20)).data)
    assert result.upload_s is not None and result.connect_s is not None
    figures = result.figures()
    assert figures["ttft"] == result.ttft_s
    assert figures["request_body_bytes"] == result.body_bytes


SLOW_CONNECT_S = 0.05


def test_the_connection_is_opened_before_t0(
    server: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    connects: list[float] = []
    create_connection = socket.create_connection

    def recorded(*args: object, **kwargs: object) -> socket.socket:
        sock = create_connection(*args, **kwargs)  # type: ignore[arg-type]
        time.sleep(SLOW_CONNECT_S)  # a connection that takes its time: counted, before t0
        connects.append(time.perf_counter())
        return sock

    monkeypatch.setattr(socket, "create_connection", recorded)
    with client_for(server) as client:
        results = [client.measure(ids_request(decode=2), first_token_budget_s=10) for _ in range(2)]
    assert len(connects) == 2  # one fresh connection per measurement, none wasted
    for connected, result in zip(connects, results, strict=True):
        assert connected < result.started_perf_s
        # the pre-opened connection's own time, not the handover of the opened socket
        assert result.connect_s is not None and result.connect_s >= SLOW_CONNECT_S
    assert connects[1] > results[0].started_perf_s + results[0].e2e_s  # not kept alive


def test_a_staged_connection_serves_only_its_address() -> None:
    opened: list[tuple[str, int]] = []

    class Stream:
        closed = False

        def close(self) -> None:
            self.closed = True

    class Inner:
        def connect_tcp(self, host: str, port: int, *args: object, **kwargs: object) -> Stream:
            opened.append((host, port))
            return Stream()

    backend = client_module._PreopenedBackend(Inner())  # type: ignore[arg-type]
    staged = backend.open("127.0.0.1", 80, timeout=1)
    assert backend.connect_tcp("127.0.0.1", 80) is staged  # taken, not reconnected
    assert opened == [("127.0.0.1", 80)]
    other = backend.open("127.0.0.1", 80, timeout=1)
    fresh = backend.connect_tcp("127.0.0.1", 81)
    assert other.closed and fresh is not other and opened[-1] == ("127.0.0.1", 81)
    replaced = backend.open("127.0.0.1", 80, timeout=1)
    backend.open("127.0.0.1", 80, timeout=1)
    assert replaced.closed  # a second staging closes the first
    backend.discard()
    assert backend.connect_tcp("127.0.0.1", 80) is not staged and len(opened) == 6


def test_server_receives_exactly_the_contract(server: FakeVLLM) -> None:
    with client_for(server) as client:
        client.measure(ids_request(length=7, decode=3), first_token_budget_s=10)
    (received,) = [r for r in server.requests if r.path == "/v1/completions"]
    assert received.payload["prompt"] == list(range(7))
    assert received.payload["max_tokens"] == received.payload["min_tokens"] == 3
    assert received.payload["ignore_eos"] is True
    assert received.payload["temperature"] == 0
    assert received.headers["Content-Type"] == "application/json"
    assert "Authorization" not in received.headers


@pytest.mark.parametrize("with_ids", [False, True], ids=["text", "token_ids"])
def test_keep_alive_chunks_do_not_stop_the_clock(server: FakeVLLM, with_ids: bool) -> None:
    server.configure(first_token_delay_s=0.3, empty_chunks_first=3)
    with client_for(server) as client:
        result = client.measure(
            ids_request(decode=4, return_token_ids=with_ids), first_token_budget_s=10
        )
    assert result.ttft_s >= 0.3
    assert result.stream_tokens == 4
    assert_after_the_writes(result, server.streams[-1])


def test_an_empty_text_first_token_starts_the_decode(server: FakeVLLM) -> None:
    # vLLM sends "text": "" for a token that is an incomplete UTF-8 piece: still a token
    server.configure(first_token_delay_s=0.05, token_delay_s=0.2, empty_text_tokens=(0,))
    with client_for(server) as client:
        result = client.measure(ids_request(decode=4), first_token_budget_s=10)
    times = server.streams[-1]
    assert (result.stream_tokens, len(result.token_times_s)) == (4, 4)
    assert_after_the_writes(result, times)
    # the first token is the first chunk, not the second one, written 0.2 s later
    assert result.started_perf_s + result.ttft_s < times.chunks_written_at[1]


def test_an_empty_text_last_token_ends_the_decode(server: FakeVLLM) -> None:
    server.configure(token_delay_s=0.05, empty_text_tokens=(-1,))
    with client_for(server) as client:
        result = client.measure(ids_request(decode=5), first_token_budget_s=10)
    times = server.streams[-1]
    assert (result.stream_tokens, len(result.token_times_s)) == (5, 5)
    assert_after_the_writes(result, times)
    span = result.token_times_s[-1] - result.token_times_s[0]
    assert result.decode_throughput == pytest.approx(4 / span)
    assert result.started_perf_s + result.token_times_s[-1] >= times.last_token_at


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"index": 0, "text": " a", "finish_reason": None}, (1, "text")),
        ({"index": 0, "text": "", "finish_reason": None}, (1, "text")),
        ({"index": 0, "text": None}, (0, "text")),
        ({"index": 0, "finish_reason": None}, (0, "text")),  # a keep-alive
        ({"index": 0, "text": "", "token_ids": [5, 6]}, (2, "token_ids")),
        ({"index": 0, "text": "ab", "token_ids": []}, (0, "token_ids")),
        ({"text": "x", "logprobs": {"tokens": ["a", "b", "c"]}}, (3, "logprobs")),
        ({"text": "", "logprobs": {"tokens": []}}, (0, "logprobs")),
        ({"text": "x", "logprobs": None}, (1, "text")),
        ({"delta": {"content": "hi"}}, (1, "text")),
        ({"delta": {"content": ""}}, (1, "text")),
        ({"delta": {"role": "assistant", "content": ""}}, (0, "text")),  # role announcement
        ({"delta": {"role": "assistant", "content": "hi"}}, (1, "text")),
        ({"delta": {"role": "assistant"}}, (0, "text")),
        ({"delta": "text"}, (0, "text")),
    ],
)
def test_what_a_choice_counts(choice: dict, expected: tuple[int, str]) -> None:
    assert client_module._choice_tokens(choice) == expected


@pytest.mark.parametrize("running_usage", [True, False], ids=["usage", "token_ids"])
def test_multi_token_chunks_counted_exactly(server: FakeVLLM, running_usage: bool) -> None:
    server.configure(
        first_token_delay_s=0.1,
        token_delay_s=0.02,
        tokens_per_chunk=3,
        continuous_usage=running_usage,
    )
    with client_for(server) as client:
        result = client.measure(
            ids_request(decode=20, return_token_ids=True), first_token_budget_s=10
        )
    assert result.token_count_source == ("usage" if running_usage else "token_ids")
    assert result.stream_interval == 3
    assert not result.per_token and result.itl_median_s is None  # no gap here is per token
    figures = result.figures()
    assert "itl_median" not in figures
    gaps = sorted(result.chunk_gaps_s)
    assert figures["chunk_gap_median"] == pytest.approx(quantile(gaps, 0.5))
    assert figures["chunk_gap_max"] == gaps[-1]
    assert figures["derived_itl_median"] == pytest.approx(quantile(sorted(result.itl_s), 0.5))
    # the stand-in wrote its chunks three tokens' time apart, not one's: held back by a busy
    # host it catches up at twice its pace (MIN_STEP_SHARE), still more than one token's time.
    # The client's gaps are the same ones as it read them, every one between two chunks (a
    # pause of the reader moves them: 15 ms once for a 60 ms step).
    written = server.streams[-1].chunks_written_at
    wrote = sorted(b - a for a, b in zip(written, written[1:], strict=False))
    assert quantile(wrote, 0.5) >= 3 * 0.02 * MIN_STEP_SHARE > 0.02
    read = result.token_times_s
    assert len(gaps) == len(wrote) and sum(gaps) == pytest.approx(read[-1] - read[0])
    assert result.chunking()["tokens_per_chunk"] == [[3, 6], [2, 1]]
    assert result.tokens_per_chunk == (3, 3, 3, 3, 3, 3, 2)
    assert len(result.itl_s) == 17  # every token after the first chunk gets a gap
    assert_after_the_writes(result, server.streams[-1])
    # the first chunk leaves with token 3, at 0.1 + 2 * 0.02
    assert result.ttft_s >= 0.14
    span = result.token_times_s[-1] - result.token_times_s[0]
    assert result.decode_throughput == pytest.approx((20 - 3) / span)
    gaps = [b - a for a, b in zip(result.token_times_s, result.token_times_s[1:], strict=False)]
    assert result.itl_s[:3] == pytest.approx([gaps[0] / 3] * 3)  # a 3-token chunk: 3 gaps
    assert result.itl_s[-2:] == pytest.approx([gaps[-1] / 2] * 2)


def test_a_paused_stand_in_catches_up_step_by_step(server: FakeVLLM) -> None:
    """A host that stops scheduling the stand-in for 0.3 s mid-decode: the tokens that fell
    behind leave half a token's time apart, as a late engine's would, not in one burst that the
    stream check rightly calls a flush."""
    server.configure(first_token_delay_s=0.1, token_delay_s=0.02)
    pause = threading.Timer(0.2, server.pause, args=(0.3,))
    pause.start()
    with client_for(server) as client:
        result = client.measure(ids_request(decode=40), first_token_budget_s=10)
    pause.join()
    written = server.streams[-1].chunks_written_at
    gaps = [later - earlier for earlier, later in zip(written, written[1:], strict=False)]
    assert max(gaps) >= 0.25  # the pause fell within the decode
    assert min(gaps) >= 0.02 * MIN_STEP_SHARE
    agreement = judge_stream(
        result.token_times_s,
        result.chunk_token_counts(),
        result.completion_tokens,
        result.decode_throughput,
        written[-1] - written[0],
    )
    # the client's own pauses may still bring two chunks together: one token early is jitter
    assert agreement is not None and agreement.problem is None, agreement


def test_chunks_counted_by_text_when_the_server_omits_running_usage(server: FakeVLLM) -> None:
    """A server without continuous_usage_stats: a chunk of 4 tokens counts as one, so its
    gaps are between chunks, the per-token figure shares the server's count among them."""
    server.configure(token_delay_s=0.01, tokens_per_chunk=4, continuous_usage=False)
    with client_for(server) as client:
        result = client.measure(ids_request(decode=17), first_token_budget_s=10)
    assert result.token_count_source == "text"
    assert result.tokens_per_chunk == (1,) * 5 and not result.counts_exact
    assert not result.per_token and result.stream_interval is None
    span = result.token_times_s[-1] - result.token_times_s[0]
    assert result.decode_throughput == pytest.approx(16 / span)  # exact: N from usage
    assert result.chunk_token_counts() == (1.0, 4.0, 4.0, 4.0, 4.0)
    chunking = result.chunking()
    assert chunking["tokens_per_chunk"] is None and chunking["tokens_per_chunk_mean"] == 4.0
    figures = result.figures()
    assert "itl_median" not in figures
    assert figures["derived_itl_median"] == pytest.approx(figures["chunk_gap_median"] / 4)


def test_one_token_chunks_are_per_token_whatever_counts_them(server: FakeVLLM) -> None:
    server.configure(token_delay_s=0.005, continuous_usage=False)
    with client_for(server) as client:
        result = client.measure(ids_request(decode=8), first_token_budget_s=10)
    assert result.token_count_source == "text" and result.per_token
    assert set(result.figures()) >= {"itl_median", "itl_p90", "itl_max"}
    assert not set(result.figures()) & {"chunk_gap_median", "derived_itl_median"}


def test_sink_mode_counts_ids_without_parsing(server: FakeVLLM) -> None:
    server.configure(read_prompt=False)
    with client_for(server, upload_chunk_bytes=4096) as client:
        result = client.measure(ids_request(length=5000, decode=3), first_token_budget_s=10)
    assert (result.prompt_tokens, result.completion_tokens) == (5000, 3)
    assert server.requests[-1].payload is None
    assert server.requests[-1].body_bytes == result.body_bytes


def test_text_prompt_is_measured(server: FakeVLLM) -> None:
    request = CompletionRequest(model=MODEL, prompt="one two three four", decode_tokens=2)
    with client_for(server) as client:
        result = client.measure(request, first_token_budget_s=10)
    assert result.prompt_tokens == 4
    assert result.completion_tokens == 2


# ---------------------------------------------------------------------------------------------
# Failures, each with the facts a person needs


def test_prompt_too_long_reports_the_servers_numbers(server: FakeVLLM) -> None:
    server.configure(max_model_len=50)
    with client_for(server) as client, pytest.raises(PromptTooLongError) as caught:
        client.measure(ids_request(length=60, decode=4), first_token_budget_s=10)
    error = caught.value
    assert (error.max_model_len, error.prompt_tokens, error.status_code) == (50, 60, 400)
    assert error.server_message == TOO_LONG_MESSAGE.format(limit=50, count=60)
    assert "at most 50 tokens" in str(error)
    assert "--max-model-len >= 64" in str(error)  # 60 prompt + 4 decode


def test_clamped_completion_is_an_error_with_the_timing_attached(server: FakeVLLM) -> None:
    server.configure(max_model_len=100)
    request = ids_request(length=96, decode=8)
    with client_for(server) as client:
        with pytest.raises(CompletionCountError) as caught:
            client.measure(request, first_token_budget_s=10)
        unchecked = client.measure(request, first_token_budget_s=10, check_count=False)
    error = caught.value
    assert "asked for 8 completion tokens, got 4" in str(error)
    assert "clamped" in str(error) and "96 + 8 = 104" in str(error)
    assert (error.requested, error.received) == (8, 4)
    assert error.measurement is not None and error.measurement.completion_tokens == 4
    assert unchecked.completion_tokens == 4


def test_http_500_carries_the_server_message(server: FakeVLLM) -> None:
    server.configure(fault="http_500")
    with client_for(server) as client, pytest.raises(RequestRejectedError) as caught:
        client.measure(ids_request(length=2048), first_token_budget_s=10)
    assert caught.value.status_code == 500
    assert not isinstance(caught.value, PromptTooLongError)
    assert "HTTP 500" in str(caught.value) and "EngineCore" in str(caught.value)
    assert "2Ki-token prompt" in str(caught.value)


def test_unknown_model_is_named(server: FakeVLLM) -> None:
    request = CompletionRequest(model="other", prompt=[1, 2], decode_tokens=2)
    with client_for(server) as client, pytest.raises(RequestRejectedError) as caught:
        client.measure(request, first_token_budget_s=10)
    assert caught.value.status_code == 404
    assert "`other` does not exist" in str(caught.value)


@pytest.mark.parametrize(
    ("fault", "error_type", "facts"),
    [
        ("error_frame", ErrorFrameError, ["after 3 tokens", "Internal server error", "500"]),
        ("truncate", TruncatedStreamError, ["after 3 tokens", "[DONE]"]),
        # the body ends as it should, only the sentinel is missing: no timeout was involved
        ("end_without_done", TruncatedStreamError, ["after 3 tokens", "[DONE]"]),
        ("malformed_chunk", MalformedChunkError, ["chunk 4", "not JSON"]),
    ],
)
def test_broken_streams(server: FakeVLLM, fault: str, error_type: type, facts: list[str]) -> None:
    server.configure(fault=fault, fault_after_tokens=3)
    with client_for(server) as client, pytest.raises(error_type) as caught:
        client.measure(ids_request(decode=10), first_token_budget_s=10)
    assert isinstance(caught.value, StreamError)
    for fact in facts:
        assert fact in str(caught.value)


def test_the_servers_per_request_metrics_ride_on_the_last_chunk(server: FakeVLLM) -> None:
    """vLLM's ``metrics`` (``--enable-per-request-metrics``) on the final usage chunk: read in
    seconds, exactly as sent, and none from a server that sends none."""
    server.configure(first_token_delay_s=0.2, token_delay_s=0.02, per_request_metrics=True)
    with client_for(server) as client:
        result = client.measure(ids_request(length=100, decode=12), first_token_budget_s=10)
    sent = server.streams[-1].metrics
    assert sent is not None and result.server_timing is not None
    timing = result.server_timing
    assert timing.ttft_s == sent["time_to_first_token_ms"] / 1000
    assert timing.queue_s == sent["queue_time_ms"] / 1000
    assert timing.decode_s == sent["generation_time_ms"] / 1000
    assert timing.mean_itl_s == sent["mean_itl_ms"] / 1000
    assert timing.tokens_per_second == sent["tokens_per_second"]
    # the engine's first token left no earlier than its delay, and before the client saw it
    assert 0.2 <= timing.ttft_s <= result.ttft_s
    assert timing.decode_s >= 11 * 0.02 * MIN_STEP_SHARE
    assert timing.to_json() == {
        "ttft_s": timing.ttft_s,
        "queue_s": timing.queue_s,
        "decode_s": timing.decode_s,
        "mean_itl_s": timing.mean_itl_s,
        "tokens_per_second": timing.tokens_per_second,
    }
    server.configure(per_request_metrics=False)
    with client_for(server) as client:
        plain = client.measure(ids_request(length=100, decode=12), first_token_budget_s=10)
    assert plain.server_timing is None and server.streams[-1].metrics is None


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"time_to_first_token_ms": 55.6, "tokens_per_second": 120.0}, (0.0556, 120.0)),
        ({"time_to_first_token_ms": None, "tokens_per_second": 7}, (None, 7.0)),
        ({"time_to_first_token_ms": True, "queue_time_ms": "3"}, None),
        ({"speculative_decoding": {"acceptance_rate": 0.5}}, None),
        ([1, 2], None),
        (None, None),
    ],
)
def test_what_a_metrics_object_holds(metrics: object, expected: tuple | None) -> None:
    """vLLM leaves out (``exclude_none``) a figure it has no stamps for, and 0.29 on may send
    ``speculative_decoding`` alone: only numbers are figures, and none is no timing."""
    from pytest_longctx.client import ServerTiming

    timing = ServerTiming.from_metrics(metrics)
    if expected is None:
        assert timing is None
    else:
        assert timing is not None
        assert (timing.ttft_s, timing.tokens_per_second) == pytest.approx(expected)


def test_missing_usage_is_an_error(server: FakeVLLM) -> None:
    server.configure(fault="no_usage")
    with client_for(server) as client, pytest.raises(MissingUsageError, match="usage"):
        client.measure(ids_request(decode=3), first_token_budget_s=10)


def test_refused_connection_is_server_unavailable() -> None:
    url = refused_url()
    with CompletionClient(ClientConfig(base_url=url, connect_timeout_s=2)) as client:
        assert client.health() is False
        with pytest.raises(ServerUnavailableError, match="cannot connect") as caught:
            client.measure(ids_request(), first_token_budget_s=5)
        assert url in str(caught.value)
        with pytest.raises(ServerUnavailableError):
            client.models()


def test_reset_before_answer_is_server_unavailable(server: FakeVLLM) -> None:
    server.configure(fault="reset")
    with client_for(server) as client, pytest.raises(ServerUnavailableError, match="crashed"):
        client.measure(ids_request(), first_token_budget_s=5)


@pytest.mark.parametrize(
    ("fault", "progress"),
    [("hang_before_headers", "never answered"), ("hang_after_headers", "accepted the request")],
)
def test_first_token_timeout_names_length_budget_and_source(
    server: FakeVLLM, fault: str, progress: str
) -> None:
    server.configure(fault=fault)
    started = time.perf_counter()
    with client_for(server) as client, pytest.raises(FirstTokenTimeoutError) as caught:
        client.measure(
            ids_request(length=1024), first_token_budget_s=0.5, budget_source="the test's limit"
        )
    assert time.perf_counter() - started < 20  # ended by the budget, not by the server
    error = caught.value
    assert (error.length, error.budget_s, error.budget_source) == (1024, 0.5, "the test's limit")
    for fact in ("1Ki-token prompt", "0.5 s", "the test's limit", progress):
        assert fact in str(error)


def test_slow_first_token_times_out(server: FakeVLLM) -> None:
    server.configure(first_token_delay_s=5.0)
    with client_for(server) as client, pytest.raises(FirstTokenTimeoutError):
        client.measure(ids_request(), first_token_budget_s=0.5)


def test_stalled_stream_hits_the_inter_token_limit(server: FakeVLLM) -> None:
    server.configure(fault="stall", fault_after_tokens=3, token_delay_s=0.01)
    started = time.perf_counter()
    with (
        client_for(server, inter_token_timeout_s=0.5) as client,
        pytest.raises(InterTokenTimeoutError) as caught,
    ):
        client.measure(ids_request(decode=10), first_token_budget_s=30)
    assert time.perf_counter() - started < 10  # the 0.5 s limit, not the 30 s first-token one
    assert "token 3 of 10" in str(caught.value)
    assert "0.5 s" in str(caught.value)


def test_inter_token_limit_does_not_cut_a_slow_first_token(server: FakeVLLM) -> None:
    server.configure(first_token_delay_s=0.8, token_delay_s=0.01)
    with client_for(server, inter_token_timeout_s=0.3) as client:
        result = client.measure(ids_request(decode=5), first_token_budget_s=10)
    assert result.ttft_s >= 0.8


# ---------------------------------------------------------------------------------------------
# The API key


def test_api_key_is_sent_and_accepted(server: FakeVLLM) -> None:
    server.configure(api_key=SECRET)
    with client_for(server, api_key=SECRET) as client:
        result = client.measure(ids_request(decode=2), first_token_budget_s=10)
        assert client.models().id == MODEL
    assert result.completion_tokens == 2
    assert server.requests[0].headers["Authorization"] == f"Bearer {SECRET}"


def test_wrong_key_is_rejected_without_showing_it(server: FakeVLLM) -> None:
    server.configure(api_key="the-right-one")
    with client_for(server, api_key=SECRET) as client, pytest.raises(RequestRejectedError) as e:
        client.measure(ids_request(), first_token_budget_s=10)
    assert e.value.status_code == 401 and "API key" in str(e.value)
    assert SECRET not in str(e.value)


def test_api_key_never_appears_in_errors_or_reprs(server: FakeVLLM) -> None:
    server.configure(fault="reject_echoing_auth")
    config = ClientConfig(base_url=server.url, api_key=SECRET)
    with CompletionClient(config) as client:
        for call in (
            lambda: client.measure(ids_request(), first_token_budget_s=10),
            client.models,
            client.metrics_text,
        ):
            with pytest.raises(MeasurementError) as caught:
                call()
            shown = "".join(traceback.format_exception(caught.value))
            assert "credentials in header" in shown  # the server's message is kept...
            assert SECRET not in shown and SECRET not in repr(caught.value)  # ...the key is not
        assert SECRET not in repr(client) and SECRET not in repr(config)


# ---------------------------------------------------------------------------------------------
# Control endpoints


def test_control_endpoints(server: FakeVLLM) -> None:
    server.configure(max_model_len=4096)
    with client_for(server) as client:
        assert client.health() is True
        served = client.models()
        assert (served.id, served.max_model_len) == (MODEL, 4096)
        assert client.tokenize("alpha beta  gamma") == word_ids("alpha beta gamma")
        assert "vllm:time_to_first_token_seconds_sum" in client.metrics_text()


def test_module_fixture_serves(fake_vllm: FakeVLLM) -> None:  # noqa: F811
    with client_for(fake_vllm) as client:
        assert client.health()


# ---------------------------------------------------------------------------------------------
# /metrics

EXPOSITION_HEAD = r"""# HELP vllm:time_to_first_token_seconds Histogram of time to first token.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m,1"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m,1"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m,1"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m,1"} 4.5
vllm:time_to_first_token_seconds_created{engine="0",model_name="m,1"} 1.7e+09
vllm:time_to_first_token_seconds_count{engine="1",model_name="m,1"} 1.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m,1"} 0.25
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m,1"} 4.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m,1"} 3072.0
vllm:prompt_tokens_created{engine="0",model_name="m,1"} 1.7e+09
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m,1",source="local_compute"} 2048.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m,1",source="local_cache_hit"} 1024.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m,1"} NaN
# TYPE vllm:cache_config_info gauge
"""
# Label values may hold commas, braces, escaped quotes and backslashes.
CACHE_INFO_LINE = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
    r'kv_cache_size_tokens="2097152",note="a \"quoted\", {braced} value\\",num_gpu_blocks="16384"}'
    " 1.0\n"
)
EXPOSITION = EXPOSITION_HEAD + CACHE_INFO_LINE + "process_start_time_seconds 1.7e+09\n"


def later(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text
        text = text.replace(old, new)
    return text


def test_exposition_parses_labels_values_and_sums() -> None:
    samples = parse_exposition(EXPOSITION)
    info = [s for s in samples if s.name == "vllm:cache_config_info"][0]
    assert info.labels["note"] == 'a "quoted", {braced} value\\'
    assert info.labels["num_gpu_blocks"] == "16384"
    inf_bucket = [s for s in samples if s.labels.get("le") == "+Inf"][0]
    assert inf_bucket.value == 3.0
    snapshot = MetricsSnapshot.from_text(EXPOSITION)
    assert snapshot.total("vllm:time_to_first_token_seconds_sum") == 4.75  # 4.5 + 0.25
    assert snapshot.total("vllm:time_to_first_token_seconds_count") == 4.0
    assert snapshot.total("process_start_time_seconds") == 1.7e9
    assert math.isnan(snapshot.total("vllm:kv_cache_usage_perc"))
    assert snapshot.total("vllm:missing") is None
    labels = cache_config_labels(EXPOSITION)
    assert labels is not None and labels["kv_cache_size_tokens"] == "2097152"
    assert cache_config_labels("# nothing here\n") is None


def test_exposition_error_names_the_line() -> None:
    with pytest.raises(ExpositionError, match="line 2"):
        parse_exposition('ok 1\nbroken{le="1" 2\n')


def test_delta_hand_computed() -> None:
    before = MetricsSnapshot.from_text(EXPOSITION)
    after = MetricsSnapshot.from_text(
        later(
            EXPOSITION,
            {
                'count{engine="0",model_name="m,1"} 3.0': 'count{engine="0",model_name="m,1"} 4.0',
                'sum{engine="0",model_name="m,1"} 4.5': 'sum{engine="0",model_name="m,1"} 6.5',
                'seconds_sum{engine="0",model_name="m,1"} 4.0': (
                    'seconds_sum{engine="0",model_name="m,1"} 5.75'
                ),
                "} 3072.0": "} 7168.0",
                'source="local_cache_hit"} 1024.0': 'source="local_cache_hit"} 1536.0',
            },
        )
    )
    view = delta(before, after)
    assert view.requests == 1.0
    assert view.server_ttft_s == pytest.approx(2.0)  # 6.5 + 0.25 - 4.75
    assert view.server_prefill_s == pytest.approx(1.75)
    assert view.prompt_tokens == 4096.0
    assert view.cached_prompt_tokens == 512.0  # from by_source: no prompt_tokens_cached here
    assert view.server_queue_s is None and view.server_decode_s is None  # not exposed
    assert view.prefix_cache_hits is None
    assert view.figures() == {"server_ttft": view.server_ttft_s, "server_prefill": 1.75}
    assert view.counters()["prompt_tokens"] == 4096.0


def test_counter_reset_gives_none() -> None:
    before = MetricsSnapshot.from_text(EXPOSITION)
    after = MetricsSnapshot.from_text(later(EXPOSITION, {"} 3072.0": "} 100.0"}))
    assert delta(before, after).prompt_tokens is None


def test_metrics_delta_over_a_real_request(server: FakeVLLM) -> None:
    server.configure(first_token_delay_s=0.2, cached_prompt_tokens=16)
    with client_for(server) as client:
        before = MetricsSnapshot.from_text(client.metrics_text())
        result = client.measure(ids_request(length=300, decode=5), first_token_budget_s=10)
        after = MetricsSnapshot.from_text(client.metrics_text())
    view = delta(before, after)
    assert view.requests == 1
    assert view.prompt_tokens == 300
    assert view.cached_prompt_tokens == 16 and view.prefix_cache_hits == 16
    assert view.prefix_cache_queries == 300
    assert 0.2 <= view.server_ttft_s <= result.ttft_s
    assert result.cached_prompt_tokens == 16


# ---------------------------------------------------------------------------------------------
# First-token budgets


def test_budget_override_wins() -> None:
    budget = FirstTokenBudget(override_s=300.0)
    assert budget.for_length(1 << 20, {1024: 0.08}) == (300.0, "explicit override of 300 s")


def test_budget_default_when_nothing_below() -> None:
    seconds, why = FirstTokenBudget(default_s=7200.0).for_length(4096, {8192: 3.0})
    assert seconds == 7200.0
    assert "default" in why and "4Ki" in why


@pytest.mark.parametrize(
    ("measured", "length", "expected"),
    [
        ({8192: 2.6}, 32768, 2.6 * 16 * 3),  # 124.8 s
        ({16384: 8.0, 65536: 118.0}, 131072, 118.0 * 4 * 3),  # the largest base is used
        ({4096: 30.0}, 4096, 90.0),  # a repeat reuses its own length
        ({32 << 20: 9900.0}, 64 << 20, 9900.0 * 4 * 3),  # 32Mi at 2.75 h -> 64Mi
    ],
)
def test_budget_extrapolates_quadratically(
    measured: dict[int, float], length: int, expected: float
) -> None:
    seconds, why = FirstTokenBudget(floor_s=60.0, safety_factor=3.0).for_length(length, measured)
    assert seconds == pytest.approx(expected)
    assert why.startswith("extrapolated")


def test_a_concurrency_levels_budget_covers_each_request_waiting_for_the_others() -> None:
    """Four 8Ki prompts at once on a server with room for three: the fourth starts after
    another has prefilled and decoded, so one request's budget is not enough for it."""
    budget = FirstTokenBudget(floor_s=60.0, safety_factor=3.0)
    one, _ = budget.for_length(8192, {8192: 14.4})
    assert one == 60.0  # 14.4 s x 3 = 43.2 s is below the floor
    seconds, why = budget.for_length(8192, {8192: 14.4}, requests=4)
    assert seconds == 4 * one
    assert why.startswith("floor of 60 s") and "x 4 prompts sent at once" in why
    extrapolated, _ = budget.for_length(32768, {8192: 14.4}, requests=2)
    assert extrapolated == pytest.approx(2 * 14.4 * 16 * 3)
    assert FirstTokenBudget(override_s=90.0).for_length(8192, {}, requests=4)[0] == 90.0
    with pytest.raises(ValueError, match="requests"):
        budget.for_length(8192, {}, requests=0)


def test_budget_floor_and_bad_values() -> None:
    budget = FirstTokenBudget(floor_s=60.0, safety_factor=3.0)
    seconds, why = budget.for_length(8192, {1024: 0.08, 2048: 0.2, 4096: float("nan")})
    assert seconds == 60.0  # 0.2 * 4**2 * 3 = 9.6 s is below the floor
    assert "floor" in why and "9.6 s" in why and "2Ki" in why
    custom = FirstTokenBudget(floor_s=1.0, safety_factor=2.0, exponent=1.5)
    assert custom.for_length(4096, {1024: 0.5})[0] == pytest.approx(0.5 * 4**1.5 * 2)
    with pytest.raises(ValueError, match="safety_factor"):
        FirstTokenBudget(safety_factor=0)
    with pytest.raises(ValueError, match="length"):
        budget.for_length(0, {})


def test_budget_bounds_and_unusable_bases() -> None:
    FirstTokenBudget(floor_s=0.5, safety_factor=1.0, exponent=1.0, default_s=0.5)  # all > 0
    with pytest.raises(ValueError, match="floor_s"):
        FirstTokenBudget(floor_s=0)
    assert FirstTokenBudget(override_s=0.5).for_length(8, {})[0] == 0.5
    with pytest.raises(ValueError, match="override_s"):
        FirstTokenBudget(override_s=0)
    budget = FirstTokenBudget(floor_s=1.0, safety_factor=2.0)
    assert budget.for_length(1, {1: 0.6})[0] == pytest.approx(1.2)  # length 1 is a length
    # a base of 0 tokens or a TTFT of 0 says nothing about the length asked for
    assert budget.for_length(4, {0: 5.0})[1].startswith("default")
    assert budget.for_length(4096, {1024: 0.0})[1].startswith("default")
    assert budget.for_length(4096, {1: 1e-6})[0] == pytest.approx(1e-6 * 4096**2 * 2)


def test_sizes_in_messages_and_sweeps() -> None:
    assert [format_size(n) for n in (1 << 30, 3 << 30, 3072, 1 << 20, 1000)] == [
        "1Gi",
        "3Gi",
        "3Ki",
        "1Mi",
        "1000",
    ]
    assert parse_size(1) == parse_size("1") == 1
    assert powers_of_two_between(1, 4) == [1, 2, 4]
    assert powers_of_two_between(3, 16) == [4, 8, 16]


@pytest.mark.parametrize("budget", [0.0, -1.0, math.nan])
def test_a_first_token_budget_must_be_positive(budget: float) -> None:
    """Checked before anything is sent: a zero budget would time out every request at once."""
    client = CompletionClient(ClientConfig(base_url="http://127.0.0.1:9"))
    with client, pytest.raises(ValueError, match="first_token_budget_s"):
        client.measure(ids_request(), first_token_budget_s=budget)


def test_inter_token_latencies_leave_out_chunks_a_stream_interval_1_server_coalesced() -> None:
    """Behind on its stream, vLLM at stream interval 1 sends two tokens in one chunk: that
    chunk's gap is not a token's, the others' are."""
    times = (0.5, 0.51, 0.52, 0.54, 0.55, 0.56)
    counts = (1, 1, 1, 2, 1, 1)
    assert result_module.inter_token_gaps(times, counts, exact=True) == pytest.approx(
        (0.01, 0.01, 0.01, 0.01)
    )
    assert result_module.infer_stream_interval(counts) == 1
    assert result_module.inter_token_gaps(times, (1, 8, 8, 8, 8, 7), exact=True) == ()
    assert result_module.infer_stream_interval((1, 8, 8, 8, 8, 7)) == 8
    assert result_module.infer_stream_interval((1, 23)) == 23  # a lower bound
    assert result_module.infer_stream_interval((1, 1, 1), exact=False) is None


def test_the_stream_interval_divides_every_chunk_between_the_first_and_the_last() -> None:
    """vLLM merges whole chunks when a stream falls behind: the interval divides them all, and
    the interval earlier streams of the server showed holds where it does."""
    infer = result_module.infer_stream_interval
    assert infer((1, 2, 2, 1, 2, 1)) == 1  # mostly pairs, yet a chunk of one between
    assert infer((1, 8, 16, 8, 7)) == 8
    assert infer((1, 20, 11)) == 20  # alone: a server at interval 20
    assert infer((1, 20, 11), known=1) == 1  # the warm-ups showed 1: a stream that fell behind
    assert infer((1, 16, 8, 7), known=8) == 8
    assert infer((1, 8, 8, 7), known=23) == 8  # 23 divides no chunk: the stream's own reading
    assert infer((1, 23), known=8) == 8
    assert infer((32,), known=1) == 1  # the whole stream merged into its first chunk
    assert infer((32,)) is None
    times = (0.5, 0.51, 0.53, 0.54)
    assert result_module.inter_token_gaps(times, (1, 2, 2, 1), exact=True) == ()
    assert result_module.inter_token_gaps(
        times, (1, 2, 2, 1), exact=True, known_interval=1
    ) == pytest.approx((0.01,))


def test_chunk_counts_come_from_the_running_usage_count_when_every_chunk_has_one() -> None:
    counter = client_module._ChunkCounter()
    assert [counter.add(1, "text", running) for running in (1, 9, 17, 20)] == [1, 8, 8, 3]
    assert counter.add(0, "text", None) == 0  # the final usage-only chunk carries nothing
    assert counter.counts() == ((1, 8, 8, 3), "usage")
    # a count that did not rise, or a chunk without one: the chunks count themselves
    stalled = client_module._ChunkCounter()
    assert [stalled.add(1, "text", running) for running in (1, 9, 9, 17)] == [1, 8, 1, 8]
    assert stalled.counts() == ((1, 1, 1, 1), "text")
    partial = client_module._ChunkCounter()
    assert [partial.add(2, "token_ids", running) for running in (2, None)] == [2, 2]
    assert partial.counts() == ((2, 2), "token_ids")


def test_clients_load_the_certificates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session makes a client for every health and metrics check; each loading the CA
    bundle anew cost about 0.1 s of CPU."""
    import ssl

    from pytest_longctx.client.client import verified_tls

    verified_tls.cache_clear()
    loads = []
    original = ssl.SSLContext.load_verify_locations

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        loads.append(args or kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    for _ in range(5):
        CompletionClient(ClientConfig(base_url="http://127.0.0.1:9")).close()
    assert len(loads) == 1


# -- what the timed request reports besides the stream ---------------------------------------


def test_the_progress_counter_follows_the_stream(server: FakeVLLM) -> None:
    """What a watcher reads while the stream goes: t0, the first and latest tokens' arrival,
    the tokens so far and the longest wait between two chunks, on the client's own clock."""
    from pytest_longctx.client.stream_progress import StreamProgress

    server.configure(first_token_delay_s=0.05, token_delay_s=0.01)
    progress = StreamProgress()
    with client_for(server) as client:
        result = client.measure(ids_request(decode=10), first_token_budget_s=10, progress=progress)
    assert progress.finished and progress.tokens == 10
    assert progress.t0 == result.started_perf_s
    assert progress.first_token_at == pytest.approx(progress.t0 + result.ttft_s)
    assert progress.last_token_at == pytest.approx(progress.t0 + result.token_times_s[-1])
    assert progress.slowest_gap_s == pytest.approx(max(result.chunk_gaps_s))


def test_the_phases_of_a_request_lie_in_order(server: FakeVLLM) -> None:
    """The connection opened before t0, then within the TTFT the upload and the headers."""
    server.configure(first_token_delay_s=0.05)
    with client_for(server) as client:
        result = client.measure(ids_request(), first_token_budget_s=10)
    assert result.connect_s is not None and 0 <= result.connect_s < 1.0
    assert result.upload_s is not None and result.response_headers_s is not None
    assert 0 <= result.upload_s <= result.response_headers_s <= result.ttft_s <= result.e2e_s


def test_a_url_without_a_port_is_opened_on_its_schemes_port() -> None:
    with CompletionClient(ClientConfig(base_url="http://127.0.0.1:9")) as client:
        opened: list[tuple[str, int]] = []
        client._backend.open = lambda host, port, timeout: opened.append((host, port))
        for url in (
            "http://example.test/v1",
            "https://example.test/v1",
            "http://example.test:8000",
        ):
            assert client._preconnect(httpx.URL(url)) is not None
        assert client._preconnect(httpx.URL("ftp://example.test/")) is None  # not pre-opened
    assert opened == [("example.test", 80), ("example.test", 443), ("example.test", 8000)]


def test_a_connection_staged_for_a_request_that_never_went_out_is_closed(
    server: FakeVLLM,
) -> None:
    with client_for(server) as client:

        def refused(*args: object, **kwargs: object) -> None:
            raise httpx.ConnectError("refused")

        client._http.send = refused
        with pytest.raises(ServerUnavailableError):
            client.measure(ids_request(), first_token_budget_s=10)
        assert client._backend._staged is None


def test_the_completions_head_keeps_its_first_characters_up_to_the_limit(
    server: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head stops at the limit exactly, in the middle of a token (200 here, for a short
    stream; the package's limit is ``COMPLETION_HEAD_CHARS``)."""
    monkeypatch.setattr("pytest_longctx.client.client.COMPLETION_HEAD_CHARS", 200)
    server.configure(token_text=" token")  # 6 characters a token: 240 in all
    with client_for(server) as client:
        result = client.measure(ids_request(decode=40), first_token_budget_s=10)
    assert result.completion_head == (" token" * 40)[:200]


class _OneAnswer(http.server.BaseHTTPRequestHandler):
    """Answers every completion with 200, ``body`` and ``content_type`` (class attributes)."""

    body = b""
    content_type = ""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def answered_with(content_type: str, body: bytes) -> CompletionClient:
    """A client of a server that answers every completion with ``body`` as ``content_type``."""
    handler = type("Answer", (_OneAnswer,), {"body": body, "content_type": content_type})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return CompletionClient(ClientConfig(base_url=f"http://127.0.0.1:{httpd.server_port}"))


def test_a_server_that_ignores_stream_is_named_and_a_stream_under_another_type_is_read() -> None:
    answer = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})
    with (
        answered_with("application/json", answer.encode()) as client,
        pytest.raises(
            StreamError, match="answered 200 with application/json instead of an event stream"
        ),
    ):
        client.measure(ids_request(decode=1), first_token_budget_s=10)
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": usage}
    stream = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    with answered_with("text/plain", stream) as client:  # a proxy's type: still a stream
        assert client.measure(ids_request(decode=1), first_token_budget_s=10).completion_tokens == 1
