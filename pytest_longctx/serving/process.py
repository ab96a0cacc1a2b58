"""The server a session measures: launched from a profile, or attached to by URL.

A launched server runs in its own process group with its log in the run folder; its death is
noticed at once (every remaining item errors with the log tail) and teardown ends the whole
group, also on Ctrl-C, SIGTERM, SIGHUP and failures. A session killed outright (SIGKILL, the
OOM killer) runs no teardown, so a small guard process, in a session of its own, holds a pipe
from the session: when the pipe closes without a word, the session is gone, and the guard
ends the server's group. The run folder's ``server.json`` names the server's pid and group,
so a server that outlived its session anyway is named by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httpx

from pytest_longctx.client import ClientConfig, CompletionClient
from pytest_longctx.core.files import write_atomically
from pytest_longctx.measure import outcomes
from pytest_longctx.measure.target import ServerError
from pytest_longctx.serving.vllm_command import ServerCommand

LOG_TAIL_LINES = 40

#: The guard: waits on its stdin; end of file without the word "stopped" means the session
#: died, and the server's process group gets SIGTERM, then SIGKILL after the grace period.
_GUARD = """
import os, signal, sys, time
group, grace = int(sys.argv[1]), float(sys.argv[2])
for name in ("SIGINT", "SIGHUP", "SIGTERM"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
if sys.stdin.buffer.read() == b"stopped":
    sys.exit(0)
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        sys.exit(0)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.2)
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES, since: int = 0) -> str:
    """The log's last lines (from byte ``since``: one server start's own part of the log)."""
    if path is None or not path.exists():
        return "(no server log)"
    return "".join(log_lines(path, since, lines)).rstrip()


def log_lines(path: Path | None, since: int = 0, limit: int | None = None) -> list[str]:
    """Lines of the log from byte ``since``, the last ``limit`` of them."""
    if path is None or not path.exists():
        return []
    with open(path, "rb") as handle:
        handle.seek(since)
        text = handle.read().decode("utf-8", "replace")
    return list(deque(text.splitlines(keepends=True), maxlen=limit))


def memory_events_path(pid: int, root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """Where the kernel counts a process's OOM kills: cgroup v2's ``memory.events``, or v1's
    ``memory.oom_control`` (both have an ``oom_kill`` line). Inside a cgroup namespace the
    process's own cgroup is the root of the mount, so the root's file is tried last."""
    try:
        entries = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for entry in entries:
        _, controllers, path = entry.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":
            for base in (root, root / "unified"):
                candidates += [base / relative / "memory.events", base / "memory.events"]
        elif "memory" in controllers.split(","):
            base = root / "memory"
            candidates += [base / relative / "memory.oom_control", base / "memory.oom_control"]
    return next((path for path in candidates if oom_kill_count(path) is not None), None)


def oom_kill_count(path: Path | None) -> int | None:
    """The ``oom_kill`` line of ``memory.events`` or ``memory.oom_control`` (None: unreadable)."""
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def control_client(
    base_url: str, api_key: str | None, timeout_s: float | None = None
) -> CompletionClient:
    """The one HTTP client, for the server's control endpoints (health, models, metrics);
    ``timeout_s`` bounds each call (default: the client's control timeout)."""
    if timeout_s is None:
        return CompletionClient(ClientConfig(base_url=base_url, api_key=api_key))
    return CompletionClient(
        ClientConfig(
            base_url=base_url,
            api_key=api_key,
            connect_timeout_s=timeout_s,
            control_timeout_s=timeout_s,
        )
    )


class LaunchedServer:
    """A vLLM process this session started and must stop."""

    def __init__(
        self,
        command: ServerCommand,
        log_path: Path,
        startup_timeout_s: float,
        grace_s: float = 20.0,
    ):
        self.command = command
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.process: subprocess.Popen[bytes] | None = None
        self.guard: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        #: Where this start's part of the log begins: a relaunch appends to the same log.
        self.log_offset = 0
        #: The cgroup's OOM-kill count when the server started (``memory.events``).
        self.memory_events: Path | None = None
        self.oom_kills_at_start: int | None = None

    @property
    def pgid(self) -> int | None:
        """The server's process group (it leads its own), None before it starts: stopping
        the server signals the whole group, its engine's processes included."""
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        port = self.command.argv[self.command.argv.index("--port") + 1]
        host = self.command.argv[self.command.argv.index("--host") + 1]
        self.base_url = f"http://{host}:{port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                list(self.command.argv),
                env={**os.environ, **self.command.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown reaches every child
            )
        # Started after the server, so the server never holds the guard's pipe open.
        self.guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, str(self.process.pid), str(self.grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a closed terminal's SIGHUP must not reach it
        )
        self.memory_events = memory_events_path(self.process.pid)
        self.oom_kills_at_start = oom_kill_count(self.memory_events)
        # A relaunch rewrites the same file: the earlier start's stop no longer holds.
        self._write_server_file(started_at=time.time(), stopped_at=None)

    def _write_server_file(self, **fields: object) -> None:
        """The server's pid and group in the run folder, for whoever finds it still running."""
        path = self.log_path.with_suffix(".json")  # server.json; server-gw1.json per worker
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text()) if path.exists() else {}
            if self.process is not None:
                data.update(pid=self.process.pid, pgid=self.process.pid, url=self.base_url)
                data.update(session_pid=os.getpid())
            data.update(fields)
            write_atomically(path, json.dumps(data, indent=2) + "\n")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        with control_client(self.base_url, None) as client:
            while True:
                self.check_alive("exited while starting")
                if client.health():
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerError(
                        f"vLLM did not become healthy within {self.startup_timeout_s:.0f} s "
                        f"(log {self.log_path}); last lines:\n{self.tail()}",
                        "start_failed",
                    )
                time.sleep(0.5)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """This start's last log lines."""
        return log_tail(self.log_path, lines, since=self.log_offset)

    def oom_kills(self) -> int:
        """OOM kills in the server's cgroup since it started (0 when unknown)."""
        now = oom_kill_count(self.memory_events)
        if now is None or self.oom_kills_at_start is None:
            return 0
        return max(0, now - self.oom_kills_at_start)

    def death(self) -> outcomes.Failure | None:
        """How the server ended, from its exit status, its log and the OOM killer; None while
        it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        lines = log_lines(self.log_path, self.log_offset)
        return outcomes.death(lines, self.process.returncode, self.oom_kills())

    def check_alive(self, what: str = "is gone") -> None:
        """Raise a classed :class:`ServerError` when the server has exited.

        While starting, the class is ``start_failed`` (``oom`` when vLLM's words name the
        memory) and the message names the exception that ends vLLM's log in one line.
        """
        if self.process is None:
            raise ServerError("the vLLM server was never started", "start_failed")
        failure = self.death()
        if failure is None:
            return
        code = self.process.returncode
        starting = what != "is gone"
        lines = log_lines(self.log_path, self.log_offset)
        cause = outcomes.final_exception(lines)
        where = f"the vLLM server {what} (exit code {code}; log {self.log_path})"
        if starting:
            klass = "oom" if failure.failure_class == "oom" else "start_failed"
            evidence = failure.evidence + (
                (cause,) if cause and cause not in failure.evidence else ()
            )
            if cause:
                raise ServerError(f"{where}: {cause}", klass, evidence)
            raise ServerError(f"{where}; last lines:\n{self.tail()}", klass, evidence)
        raise ServerError(
            f"{where}; last lines:\n{self.tail()}",
            failure.failure_class,
            failure.evidence,
        )

    def stop(self) -> None:
        """TERM the whole process group, then KILL whatever is left after the grace period."""
        process = self.process
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # Children that outlived the leader are still in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        self._release_guard()
        self._write_server_file(stopped_at=time.time())

    def _release_guard(self) -> None:
        guard, self.guard = self.guard, None
        if guard is None or guard.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            guard.stdin.write(b"stopped")
            guard.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=5)


def leftover_servers(output_root: Path, this_run: Path) -> list[str]:
    """Servers that earlier runs under ``output_root`` launched and that are still running.

    On a GPU node such a server holds the devices and their memory, and the next server
    fails to start for a reason its log does not name.
    """
    found = []
    for path in sorted(output_root.glob("*/server*.json")):
        if path.parent.resolve() == this_run.resolve():
            continue
        try:
            data = json.loads(path.read_text())
            pid, group = int(data["pid"]), int(data["pgid"])  # server.json, server-gw1.json
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if data.get("stopped_at") or not _is_server_process(pid):
            continue
        session = data.get("session_pid")
        if isinstance(session, int) and is_alive(session):
            found.append(
                f"run {path.parent.name} (session pid {session}) is serving vLLM on this "
                f"machine at the same time (pid {pid}): the two share its cores and memory"
            )
            continue
        found.append(
            f"a vLLM server launched by run {path.parent.name} is still running (pid {pid}, "
            f"process group {group}); it holds this machine's memory and devices: stop it "
            f"with `kill -- -{group}`"
        )
    return found


def is_alive(pid: int, group: bool = False) -> bool:
    """Whether the process (or, with ``group``, any process of its group) still exists; for a
    group, see :func:`group_alive`."""
    if group:
        return group_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[tuple[int, int, str]] | None:
    """``(pid, parent pid, state)`` of every process in group ``pgid``, from
    ``/proc/<pid>/stat``; None where ``/proc`` cannot be listed."""
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return None
    members = []
    for entry in entries:
        try:
            stat = (proc / entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[2] == str(pgid):
            members.append((int(entry), int(fields[1]), fields[0]))
    return members


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs.

    ``killpg(pgid, 0)`` also succeeds while the group holds only zombies: processes that have
    ended and wait for their parent to read their exit. In a container where pytest is PID 1
    a killed server's workers are re-parented to it and nothing reaps them, so they do not
    count; those that are this process's children are reaped here (the group's leader is
    left to its ``Popen``, which reads its exit code)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = group_members(pgid)
    if members is None:  # no /proc: killpg's answer stands
        return True
    alive = False
    for pid, parent, state in members:
        if state != "Z":
            alive = True
        elif parent == os.getpid() and pid != pgid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
    return alive


def wait_group_gone(pgid: int, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Wait until no process of group ``pgid`` runs (zombies aside); False after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


#: How long a dead server's process group, port and device memory may take to be released.
RELEASE_TIMEOUT_S = 60.0
#: How far above its level before the first start a device's used memory may stay (the
#: driver's own, another tool's context) and still count as released.
DEVICE_MEMORY_MARGIN_BYTES = 1024**3
DEVICE_POLL_S = 1.0


def wait_released(
    pgid: int | None, host: str, port: int, timeout_s: float = RELEASE_TIMEOUT_S
) -> None:
    """The dead server's process group gone (zombies aside) and its port free, or a
    ServerError (``start_failed``) saying which is still held after ``timeout_s``.

    On a CPU the kernel takes a process's memory and cores back when the process ends, so
    the group being gone is the whole of it there; a GPU's memory is waited on apart
    (:func:`wait_device_memory`)."""
    deadline = time.monotonic() + timeout_s
    if pgid is not None and not wait_group_gone(pgid, timeout_s):
        raise ServerError(
            f"the dead server's process group {pgid} is still alive after {timeout_s:g} s",
            "start_failed",
        )
    while not port_free(host, port):
        if time.monotonic() > deadline:
            raise ServerError(f"port {port} is still taken after {timeout_s:g} s", "start_failed")
        time.sleep(0.2)


def wait_device_memory(
    before: dict[int, int],
    read: Callable[[], dict[int, int] | None],
    timeout_s: float = RELEASE_TIMEOUT_S,
    poll_s: float = DEVICE_POLL_S,
) -> dict[int, int]:
    """Poll ``read()`` (bytes used per device) until every device of ``before`` is within
    :data:`DEVICE_MEMORY_MARGIN_BYTES` of its level there; the devices that still hold more
    after ``timeout_s``, with the bytes they use (empty: released). A reading that fails says
    nothing either way and is not waited on."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = read()
        if now is None:
            return {}
        held = {
            index: used
            for index, used in now.items()
            if index in before and used > before[index] + DEVICE_MEMORY_MARGIN_BYTES
        }
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(poll_s)


def port_free(host: str, port: int) -> bool:
    """Whether vLLM could bind the port again (it binds with SO_REUSEADDR, as here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _is_server_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm" in cmdline


def check_attached(
    base_url: str, api_key: str | None, key_env: str | None = None, timeout_s: float | None = None
) -> None:
    """The attached server answers ``/health``; a refusal names where the key comes from.

    One that does not answer is ``server_gone`` when nothing accepts its connections, and
    ``hang`` when something still does (the process is there, stuck); one that answers 503,
    as vLLM's ``/health`` does once its engine died, is ``engine_died``.
    """
    with control_client(base_url, api_key, timeout_s) as client:
        status = client.health_status()
    if status == 200:
        return
    if status is None:
        if accepts_connections(base_url):
            raise ServerError(
                f"the server at {base_url} accepts connections but does not answer /health"
                + (f" within {timeout_s:g} s" if timeout_s else ""),
                "hang",
                (f"{base_url}/health: connected, no answer",),
            )
        raise ServerError(
            f"the server at {base_url} does not answer /health: is it running and listening there?",
            "server_gone",
            (f"{base_url}: connection refused",),
        )
    if status in (401, 403):
        source = f"the API key from ${key_env}" if key_env else "the request (no API key sent)"
        hint = f"check the key in {key_env}" if key_env else "set --longctx-api-key-env=VAR"
        raise ServerError(
            f"the server at {base_url} refused {source} (HTTP {status}): {hint}", "refused"
        )
    if status == 503:  # vLLM's /health: 503 once the engine is dead (EngineDeadError)
        raise ServerError(
            f"the server at {base_url} answers /health with HTTP 503: vLLM does so once its "
            "engine is dead, before its API server exits",
            "engine_died",
            (f"{base_url}/health: HTTP 503",),
        )
    raise ServerError(f"the server at {base_url} is unhealthy (HTTP {status} from /health)")


def accepts_connections(base_url: str, timeout_s: float = 5.0) -> bool:
    """Whether anything accepts a TCP connection at the URL's host and port."""
    url = httpx.URL(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
