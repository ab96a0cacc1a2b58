"""A TCP connection opened just before t0, so connecting is not timed as TTFT."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

import httpcore
import httpx

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


#: Unanswered keepalive probes after which the kernel gives up on the peer.
KEEPALIVE_PROBES = 4


def keepalive_options(interval_s: float) -> list[tuple[int, int, int]]:
    """Socket options for TCP keepalive probes every ``interval_s`` seconds of silence.

    A prefill of hours keeps its connection silent; a NAT or an L4 load balancer between
    client and server drops an idle connection after minutes. Probes are answered by the
    server's kernel, so they keep the path's state alive without a byte in the stream.
    """
    if not interval_s > 0:
        return []
    seconds = max(1, round(interval_s))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    if idle is not None:  # Linux: TCP_KEEPIDLE; macOS: TCP_KEEPALIVE
        options.append((socket.IPPROTO_TCP, idle, seconds))
    if hasattr(socket, "TCP_KEEPINTVL"):
        options.append((socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds))
    if hasattr(socket, "TCP_KEEPCNT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES))
    return options


class _PreopenedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, able to hand over a TCP connection opened in advance.

    :meth:`CompletionClient.measure` opens its request's connection just before ``t0`` and
    stages it here; the pool, which keeps no idle connection, takes it instead of connecting
    inside the timed window. Any other connection, or a staged one for another address, is
    opened as usual.
    """

    def __init__(
        self, inner: httpcore.NetworkBackend, socket_options: Sequence[tuple[int, int, int]] = ()
    ) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._staged: tuple[str, int, httpcore.NetworkStream] | None = None
        #: The options every connection gets (keepalive), staged ones included.
        self.socket_options = list(socket_options)

    def open(self, host: str, port: int, timeout: float) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, timeout=timeout, socket_options=self.socket_options or None
        )
        with self._lock:
            staged, self._staged = self._staged, (host, port, stream)
        if staged is not None:
            staged[2].close()
        return stream

    def discard(self) -> None:
        """Close a staged connection nobody took (the request failed before sending)."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            staged[2].close()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            same_options = list(socket_options or ()) == self.socket_options
            if staged[:2] == (host, port) and local_address is None and same_options:
                return staged[2]
            staged[2].close()
        return self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _preopening_transport(
    keepalive_s: float = 0.0,
) -> tuple[httpx.HTTPTransport, _PreopenedBackend | None]:
    """httpx's transport with :class:`_PreopenedBackend` under its pool (None if httpx changed);
    every connection probes with TCP keepalive every ``keepalive_s`` seconds (0: none)."""
    options = keepalive_options(keepalive_s)
    transport = httpx.HTTPTransport(
        limits=httpx.Limits(max_keepalive_connections=0), socket_options=options or None
    )
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(inner, httpcore.NetworkBackend):
        return transport, None
    backend = _PreopenedBackend(inner, options)
    pool._network_backend = backend  # type: ignore[union-attr]
    return transport, backend
