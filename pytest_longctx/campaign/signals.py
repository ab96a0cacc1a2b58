"""SIGTERM and SIGHUP end a session the way Ctrl-C does.

CI cancelling a job, a Slurm or Kubernetes time limit and a closed ssh terminal send these, not
SIGINT. Turned into :class:`KeyboardInterrupt` in the main thread, they take pytest's own
interrupt path: the point in flight is recorded as interrupted, the reports are written, the
server's process group is ended, and the exit status is pytest's "interrupted". A second
signal during that teardown is ignored, so it cannot cut the teardown short.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class SessionSignals:
    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self._interrupt)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            return  # already ending: let the teardown finish
        self.received = name
        raise KeyboardInterrupt(f"{name} received")
