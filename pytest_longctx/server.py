"""The server a session measures: launched from a profile, or attached to by URL.

A launched server runs in its own process group with its log in the run folder; its death is
noticed at once (every remaining item errors with the log tail) and teardown ends the whole
group, also on Ctrl-C and on failures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .vllm_command import ServerCommand

LOG_TAIL_LINES = 40


class ServerError(RuntimeError):
    """The server could not start, or went away."""


@dataclass(frozen=True)
class ServerInfo:
    """What the measurement needs to know about the server, whichever way it came."""

    base_url: str
    model_name: str
    max_model_len: int | None
    mode: str  # "launched" or "attached"
    api_key: str | None = field(default=None, repr=False)
    command: ServerCommand | None = None
    log_path: Path | None = None
    engine_version: str | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no server log)"
    with open(path, encoding="utf-8", errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines)).rstrip()


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_models(
    base_url: str, api_key: str | None, timeout: float = 30.0
) -> tuple[str, int | None]:
    """The served model name and its max_model_len, from ``/v1/models``."""
    response = httpx.get(f"{base_url}/v1/models", headers=_headers(api_key), timeout=timeout)
    response.raise_for_status()
    entries = response.json().get("data") or []
    if not entries:
        raise ServerError(f"{base_url}/v1/models lists no model")
    return str(entries[0]["id"]), entries[0].get("max_model_len")


def read_engine_version(base_url: str, api_key: str | None) -> str | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = httpx.get(f"{base_url}/version", headers=_headers(api_key), timeout=10)
        if response.status_code == 200:
            return response.json().get("version")
    return None


class LaunchedServer:
    """A vLLM process this session started and must stop."""

    def __init__(self, command: ServerCommand, log_path: Path, startup_timeout_s: float):
        self.command = command
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
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

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                self.check_alive("exited while starting")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
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

    def stop(self, grace_s: float = 20.0) -> None:
        """TERM the whole process group, then KILL whatever is left after the grace period."""
        process = self.process
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
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


def check_attached(base_url: str, api_key: str | None) -> None:
    try:
        response = httpx.get(f"{base_url}/health", headers=_headers(api_key), timeout=10)
    except httpx.HTTPError as exc:
        raise ServerError(f"the server at {base_url} does not answer ({exc})") from None
    if response.status_code != 200:
        raise ServerError(f"the server at {base_url} is unhealthy (HTTP {response.status_code})")
