"""Hours of silence on the wire: TCP keepalive on the measured socket, SSE keep-alive comments.

A 64Mi prefill keeps its connection silent for hours; a NAT or an L4 load balancer drops an
idle connection after minutes. The measured socket probes with TCP keepalive, and a launched
vLLM sends ``: keep-alive`` comments (``--sse-keep-alive-interval``), which must never count as
a token or as progress of the stream.
"""

from __future__ import annotations

import socket

import pytest
from fake_vllm import FakeVLLM

from pytest_longctx.client import ClientConfig, CompletionClient, CompletionRequest
from pytest_longctx.client import client as client_module
from pytest_longctx.client.errors import FirstTokenTimeoutError


def _request(tokens: int = 4) -> CompletionRequest:
    return CompletionRequest(model="fake-model", prompt=list(range(64)), decode_tokens=tokens)


def test_the_measured_socket_carries_the_keepalive_settings(
    fake_vllm: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket the measured request goes over (the one opened before t0, handed to the
    pool) probes after 7 s of silence, every 7 s, and gives up after 4 unanswered probes."""
    seen: list[dict[str, int]] = []
    taken = client_module._PreopenedBackend.connect_tcp

    def spy(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ANN001, ANN202
        stream = taken(self, host, port, timeout, local_address, socket_options)
        sock: socket.socket = stream.get_extra_info("socket")
        seen.append(
            {
                "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                "staged": int(self._staged is None),
            }
        )
        return stream

    monkeypatch.setattr(client_module._PreopenedBackend, "connect_tcp", spy)
    config = ClientConfig(base_url=fake_vllm.url, tcp_keepalive_s=7)
    with CompletionClient(config) as client:
        measured = client.measure(_request(), first_token_budget_s=10)
    assert measured.completion_tokens == 4
    assert seen == [{"keepalive": 1, "idle": 7, "interval": 7, "probes": 4, "staged": 1}]


def test_keepalive_off_leaves_the_socket_as_the_kernel_makes_it(fake_vllm: FakeVLLM) -> None:
    assert client_module.keepalive_options(0) == []
    with CompletionClient(ClientConfig(base_url=fake_vllm.url, tcp_keepalive_s=0)) as client:
        assert client.measure(_request(), first_token_budget_s=10).completion_tokens == 4


def test_keep_alive_comments_are_neither_tokens_nor_progress(fake_vllm: FakeVLLM) -> None:
    """Comments every 50 ms through a 0.5 s prefill: the first token is still at 0.5 s, and
    the count is the tokens'."""
    fake_vllm.configure(keep_alive_s=0.05, first_token_delay_s=0.5)
    with CompletionClient(ClientConfig(base_url=fake_vllm.url)) as client:
        measured = client.measure(_request(), first_token_budget_s=10)
    assert measured.ttft_s >= 0.5
    assert measured.completion_tokens == 4 and sum(measured.tokens_per_chunk) == 4


def test_keep_alive_comments_do_not_hold_off_the_first_token_budget(fake_vllm: FakeVLLM) -> None:
    """A server that only ever sends comments runs out of its budget like a silent one."""
    fake_vllm.configure(keep_alive_s=0.05, fault="hang_after_headers")
    client = CompletionClient(ClientConfig(base_url=fake_vllm.url))
    with client, pytest.raises(FirstTokenTimeoutError):
        client.measure(_request(), first_token_budget_s=0.6)


def test_a_server_closing_idle_connections_fails_no_request(fake_vllm: FakeVLLM) -> None:
    """vLLM's API server closes a connection idle for ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s)
    between points. The client keeps no connection between requests, so no request ever goes
    out on one the server is closing: each point, and each control request between them, opens
    its own, and every one succeeds past the idle limit."""
    import time

    fake_vllm.configure(idle_close_s=0.3)
    with CompletionClient(ClientConfig(base_url=fake_vllm.url)) as client:
        first = client.measure(_request(), first_token_budget_s=10)
        client.models()
        client.health()
        time.sleep(0.8)  # past the idle limit, as the pause between two points
        client.health()
        second = client.measure(_request(), first_token_budget_s=10)
        client.models()
    assert first.completion_tokens == second.completion_tokens == 4
    requests = len(fake_vllm.requests)
    assert fake_vllm.totals.connections_opened == requests >= 6
