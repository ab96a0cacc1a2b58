"""How many vLLM servers the test run started, and what their start-ups cost.

Servers are started by this process (the shared pool), by the sweep session it runs, and by
sessions it runs in subprocesses; only the process table sees them all. A thread looks at it
twice a second, follows each new vLLM API server process until its ``/health`` answers 200 or
it exits, and the terminal summary prints the count and the seconds spent starting. A server
that failed to start is counted apart (some tests start one on purpose).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: What names a vLLM API server in a command line (module or console script).
SERVER_MARKERS = (b"vllm.entrypoints.openai.api_server", b"vllm\x00serve")
POLL_S = 0.5


@dataclass
class Start:
    pid: int
    label: str
    port: str | None
    seen_at: float
    ready_s: float | None = None
    gone_at: float | None = None


@dataclass
class Census:
    starts: dict[int, Start] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        while not self.stop.wait(POLL_S):
            self.look()

    def look(self) -> None:
        now = time.monotonic()
        alive = set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in self.starts:
                alive.add(pid)
                continue
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                if any(marker in argv for marker in SERVER_MARKERS) and _ours(pid):
                    self.starts[pid] = Start(pid, _label(argv), _port(argv), now)
                    alive.add(pid)
        for start in self.starts.values():
            if start.gone_at is None and start.pid not in alive:
                start.gone_at = now
            elif start.gone_at is None and start.ready_s is None and _healthy(start.port):
                start.ready_s = now - start.seen_at

    def summary(self) -> list[str]:
        ready = [s for s in self.starts.values() if s.ready_s is not None]
        failed = [s for s in self.starts.values() if s.ready_s is None]
        total = sum(s.ready_s or 0.0 for s in ready)
        lines = [
            f"vLLM servers started by this run: {len(self.starts)} "
            f"({len(ready)} ready, {len(failed)} never ready); "
            f"{total:.0f} s of start-up until /health answered"
        ]
        for start in sorted(self.starts.values(), key=lambda s: s.seen_at):
            until = f"ready in {start.ready_s:.1f} s" if start.ready_s else "never ready"
            lines.append(f"  pid {start.pid}: {until}, {start.label}")
        return lines


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ours(pid: int) -> bool:
    """A server this run started (a descendant of this process), counted once: its first
    process, not the engine or workers that carry the same command line in some modes."""
    try:
        parent = _parent(pid)
        if any(m in Path(f"/proc/{parent}/cmdline").read_bytes() for m in SERVER_MARKERS):
            return False
        while parent > 1:
            if parent == os.getpid():
                return True
            parent = _parent(parent)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _port(argv: bytes) -> str | None:
    parts = argv.split(b"\x00")
    with contextlib.suppress(ValueError, IndexError):
        return parts[parts.index(b"--port") + 1].decode()
    return None


def _label(argv: bytes) -> str:
    """The served name and the flags that tell the pool's servers apart."""
    parts = [p.decode(errors="replace") for p in argv.split(b"\x00") if p]
    shown = []
    for flag in ("--served-model-name", "--max-model-len", "--max-num-batched-tokens",
                 "--stream-interval", "--kv-cache-memory-bytes"):  # fmt: skip
        if flag in parts[:-1]:
            shown.append(f"{flag} {parts[parts.index(flag) + 1]}")
    return " ".join(shown) or " ".join(parts[-4:])


def _healthy(port: str | None) -> bool:
    if port is None:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.3) as answer:
            return answer.status == 200
    except OSError:
        return False


class CensusPlugin:
    def __init__(self) -> None:
        self.census = Census()
        self.thread = threading.Thread(target=self.census.watch, daemon=True, name="vllm-census")

    def pytest_sessionstart(self) -> None:
        self.thread.start()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self.census.stop.set()
        self.thread.join(timeout=5)
        terminalreporter.write_sep("=", "vLLM server starts")
        for line in self.census.summary():
            terminalreporter.write_line(line)
