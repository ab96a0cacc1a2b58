"""What the test run cost: the vLLM servers it started, the other processes it ran, and the
tests that used the most CPU.

Servers are started by this process (the shared pool), by the sweep session it runs, and by
sessions it runs in subprocesses; only the process table sees them all. A thread looks at it
twice a second, follows each new vLLM API server process until its ``/health`` answers 200 or
it exits (one stopped between two looks is ready if its log says it served), and the terminal
summary prints the count and the seconds spent starting. A server
that failed to start is counted apart (some tests start one on purpose). The same look counts
pytest sessions run in subprocesses and the Pythons that import vLLM or torch to answer
questions (vLLM's parser, its capacity figures, a config class: ``core/warm_python.py``).

Wall time ranks tests by what they waited for; on a busy host it ranks them by the load. CPU
seconds (this process and every process under it during the test: subprocess sessions, the
shared servers' work for it) depend far less on the load, so the summary lists the tests that
used the most.
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
#: What a vLLM API server writes to its log once it serves (uvicorn's line).
READY_LINE = b"Application startup complete"
POLL_S = 0.5
#: Other processes the run starts, by what their command line names.
HELPER_KINDS = {
    "pytest sessions in subprocesses": (b"-mpytest\x00",),
    "warm Pythons for vLLM and transformers questions": (b"pytest_longctx.core.warm_python",),
    "embedded model builds": (b"build-model", b"build_embedded_model"),
}
#: How many of the tests that used the most CPU the summary lists.
CPU_SHOWN = 25
#: The teardown report's user property that carries a test's CPU seconds.
CPU_PROPERTY = "cpu_s"


@dataclass
class Start:
    pid: int
    label: str
    port: str | None
    seen_at: float
    log: Path | None = None
    ready_s: float | None = None
    #: Ready by its log only: stopped before a look asked ``/health`` (``ready_s`` is then
    #: the most it can have taken).
    ready_by_log: bool = False
    gone_at: float | None = None


@dataclass
class Census:
    starts: dict[int, Start] = field(default_factory=dict)
    helpers: dict[str, set[int]] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    #: What names a server in a command line (a test of the census names its own).
    markers: tuple[bytes, ...] = SERVER_MARKERS

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
            if pid in self.seen:
                continue
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                if any(marker in argv for marker in self.markers) and _ours(pid, self.markers):
                    self.starts[pid] = Start(pid, _label(argv), _port(argv), now, _log(pid))
                    alive.add(pid)
                    continue
                if _forked_not_yet_run(pid, argv):
                    continue  # looked at again once it runs its own command
                self.seen.add(pid)
                kind = _helper_kind(argv)
                if kind is not None and _ours(pid, self.markers):
                    self.helpers.setdefault(kind, set()).add(pid)
        for start in self.starts.values():
            if start.gone_at is None and start.pid not in alive:
                start.gone_at = now
                if start.ready_s is None and _log_says_ready(start.log):
                    start.ready_s, start.ready_by_log = now - start.seen_at, True
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
            if start.ready_by_log:  # a test stopped it within a look of its start-up
                until = f"ready in at most {start.ready_s:.1f} s (by its log)"
            lines.append(f"  pid {start.pid}: {until}, {start.label}")
        counted = ", ".join(f"{len(self.helpers.get(kind, ()))} {kind}" for kind in HELPER_KINDS)
        lines.append(f"other processes (seen at least {POLL_S} s): {counted}")
        return lines


def _helper_kind(argv: bytes) -> str | None:
    for kind, markers in HELPER_KINDS.items():
        if any(marker in argv for marker in markers):
            return kind
    return None


def cpu_seconds() -> float:
    """CPU time of this process and of every process under it: the children it has reaped,
    and those still running (the servers it started, with their engines, and what a session
    in a subprocess runs). A child's time moves from the second to the first when it is
    reaped, so a test's difference counts each once, whenever its processes end: the work a
    test had a shared server do is that test's, not the one during which the server stops."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _descendants(root: int) -> list[int]:
    """Every process under ``root``, from the kernel's list of each thread's children."""
    found: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    children = Path(f"{task.path}/children").read_text().split()
                    found.extend(int(c) for c in children)
                    pending.extend(int(c) for c in children)
    return found


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ours(pid: int, markers: tuple[bytes, ...]) -> bool:
    """A server this run started (a descendant of this process), counted once: its first
    process, not the engine or workers that carry the same command line in some modes."""
    try:
        parent = _parent(pid)
        if any(m in Path(f"/proc/{parent}/cmdline").read_bytes() for m in markers):
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


def _forked_not_yet_run(pid: int, argv: bytes) -> bool:
    """A child between its fork and its exec carries its parent's command line, and one in
    its exec none (a pool server, looked at in such a moment and never again, was once left
    out of the count). Kernel threads have none either: they are looked at each time."""
    if not argv:
        return True
    try:
        return argv == Path(f"/proc/{_parent(pid)}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False


def _log(pid: int) -> Path | None:
    """The file the server writes its output to (the launcher sends both streams there)."""
    with contextlib.suppress(OSError):
        path = Path(os.readlink(f"/proc/{pid}/fd/1"))
        return path if path.is_file() else None
    return None


def _log_says_ready(log: Path | None) -> bool:
    if log is None:
        return False
    try:
        return READY_LINE in log.read_bytes()
    except OSError:
        return False


def _healthy(port: str | None) -> bool:
    if port is None:
        return False
    try:  # a server starting beside two others on a busy host can take over a second to
        # answer (a layer-kinds server, up for a minute, was once counted never ready)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3.0) as answer:
            return answer.status == 200
    except OSError:
        return False


class CensusPlugin:
    """The census in the session that prints it (the controller under xdist) and the CPU
    count in every process that runs tests: a worker hands each test's figure to the
    controller on the test's teardown report (``user_properties``, which xdist carries)."""

    def __init__(self, watch: bool = True) -> None:
        self.census = Census() if watch else None
        self.thread = threading.Thread(
            target=self.census.watch if self.census else None, daemon=True, name="vllm-census"
        )
        #: CPU seconds at the start of each running test, and per test id once it ended.
        self.started: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def pytest_sessionstart(self) -> None:
        if self.census is not None:
            self.thread.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.started[item.nodeid] = cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item) -> object:
        report = yield
        if report.when == "teardown" and item.nodeid in self.started:
            used = cpu_seconds() - self.started.pop(item.nodeid)
            report.user_properties.append((CPU_PROPERTY, round(used, 3)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for name, value in report.user_properties:
                if name == CPU_PROPERTY:
                    self.cpu[report.nodeid] = float(value)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.census is None:
            return
        self.census.stop.set()
        self.thread.join(timeout=5)
        terminalreporter.write_sep("=", "vLLM server starts")
        for line in self.census.summary():
            terminalreporter.write_line(line)
        terminalreporter.write_sep("=", f"the {CPU_SHOWN} tests that used the most CPU")
        terminalreporter.write_line(
            f"{sum(self.cpu.values()):.0f} s of CPU in {len(self.cpu)} tests "
            "(the process that ran each and every process under it, its servers' work included)"
        )
        for nodeid, seconds in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:CPU_SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")
