"""A TCP connection opened just before t0, so connecting is not timed as TTFT."""

from __future__ import annotations

import threading
from typing import Any

import httpcore
import httpx

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


class _PreopenedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, able to hand over a TCP connection opened in advance.

    :meth:`CompletionClient.measure` opens its request's connection just before ``t0`` and
    stages it here; the pool, which keeps no idle connection, takes it instead of connecting
    inside the timed window. Any other connection, or a staged one for another address, is
    opened as usual.
    """

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._staged: tuple[str, int, httpcore.NetworkStream] | None = None

    def open(self, host: str, port: int, timeout: float) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout=timeout)
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
            if staged[:2] == (host, port) and local_address is None and not socket_options:
                return staged[2]
            staged[2].close()
        return self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _preopening_transport() -> tuple[httpx.HTTPTransport, _PreopenedBackend | None]:
    """httpx's transport with :class:`_PreopenedBackend` under its pool (None if httpx changed)."""
    transport = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(inner, httpcore.NetworkBackend):
        return transport, None
    backend = _PreopenedBackend(inner)
    pool._network_backend = backend  # type: ignore[union-attr]
    return transport, backend
