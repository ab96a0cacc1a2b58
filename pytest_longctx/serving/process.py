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
from pathlib import Path

from pytest_longctx.client import ClientConfig, CompletionClient
from pytest_longctx.core.files import write_atomically
from pytest_longctx.measure.target import ServerError
from pytest_longctx.serving.vllm_command import ServerCommand

LOG_TAIL_LINES = 40
SERVER_FILE = "server.json"

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


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no server log)"
    with open(path, encoding="utf-8", errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines)).rstrip()


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

    def start(self) -> None:
        port = self.command.argv[self.command.argv.index("--port") + 1]
        host = self.command.argv[self.command.argv.index("--host") + 1]
        self.base_url = f"http://{host}:{port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
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
        self._write_server_file(started_at=time.time())

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
                        f"(log {self.log_path}); last lines:\n{log_tail(self.log_path)}"
                    )
                time.sleep(0.5)

    def check_alive(self, what: str = "is gone") -> None:
        if self.process is None:
            raise ServerError("the vLLM server was never started")
        code = self.process.poll()
        if code is not None:
            raise ServerError(
                f"the vLLM server {what} (exit code {code}; log {self.log_path}); "
                f"last lines:\n{log_tail(self.log_path)}"
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
        if isinstance(session, int) and _is_alive(session):
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


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_server_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm" in cmdline


def check_attached(base_url: str, api_key: str | None, key_env: str | None = None) -> None:
    """The attached server answers ``/health``; a refusal names where the key comes from."""
    with control_client(base_url, api_key) as client:
        status = client.health_status()
    if status == 200:
        return
    if status is None:
        raise ServerError(
            f"the server at {base_url} does not answer /health: is it running and listening there?"
        )
    if status in (401, 403):
        source = f"the API key from ${key_env}" if key_env else "the request (no API key sent)"
        hint = f"check the key in {key_env}" if key_env else "set --longctx-api-key-env=VAR"
        raise ServerError(f"the server at {base_url} refused {source} (HTTP {status}): {hint}")
    raise ServerError(f"the server at {base_url} is unhealthy (HTTP {status} from /health)")
