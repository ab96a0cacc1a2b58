"""Deadlines for a stream: httpx fixes one read timeout, a long prefill needs two."""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]


class _Exchange:
    """httpcore trace hook: phase times and the socket, so a watchdog can cut a stalled stream."""

    def __init__(self, on_socket: Any) -> None:
        self.times: dict[str, float] = {}
        self._on_socket = on_socket

    def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        self.times[name] = time.perf_counter()
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                self._on_socket(sock)

    def span(self, begin: str, end: str) -> float | None:
        if begin in self.times and end in self.times:
            return self.times[end] - self.times[begin]
        return None


class _Watchdog:
    """Shuts the socket down when the current deadline passes; the blocked read then returns.

    httpx fixes one read timeout per response, but the first token may take hours while later
    tokens should follow within the inter-token limit: this thread enforces both.
    """

    def __init__(self) -> None:
        self._deadline = math.inf
        self._phase = ""
        self._sleeping_until = math.inf
        self._socket: socket.socket | None = None
        self._stopped = False
        self.expired_phase: str | None = None
        self._wake = threading.Condition()
        self._waiting = threading.Event()
        self._thread = threading.Thread(target=self._run, name="longctx-watchdog", daemon=True)

    def start(self, deadline: float, phase: str) -> None:
        """Start the thread and return once it sleeps, so it takes no time from the caller."""
        self.extend(deadline, phase)
        self._thread.start()
        self._waiting.wait()
        with self._wake:  # acquired once the thread's wait() released it
            pass

    def extend(self, deadline: float, phase: str) -> None:
        """Move the deadline; the thread is woken only when it must fire sooner."""
        with self._wake:
            self._deadline, self._phase = deadline, phase
            if deadline < self._sleeping_until:
                self._wake.notify()

    def attach(self, sock: socket.socket) -> None:
        with self._wake:
            self._socket = sock
            if self.expired_phase is not None:
                _shutdown(sock)

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while not self._stopped:
                remaining = self._deadline - time.perf_counter()
                if remaining <= 0:
                    self.expired_phase = self._phase
                    if self._socket is not None:
                        _shutdown(self._socket)
                    return
                self._sleeping_until = self._deadline
                self._waiting.set()
                self._wake.wait(None if math.isinf(remaining) else remaining)
                self._sleeping_until = math.inf


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: nothing left to wake
        sock.shutdown(socket.SHUT_RDWR)


_FIRST_TOKEN = "first_token"
_INTER_TOKEN = "inter_token"
_BACKSTOP_S = 30.0  # httpx's own limits trail the watchdog's by this much
