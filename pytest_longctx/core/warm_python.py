"""Questions that need a heavy import, answered by a Python kept warm between sessions.

vLLM's parser, its capacity functions and transformers' config classes answer in
milliseconds, but importing them costs 10-20 s of CPU, and they must not be imported into a
pytest session (torch cannot be imported twice once a test runner's module snapshot dropped
it; vLLM brings its platform's logging and state). So each question is a call
``module.function(request)`` in another Python. Asked one process per question, every
``--longctx-plan`` session and every launch paid that import again (a plan session on a GPU
profile, three times).

A question is sent to a Python that stays up: started on the first question, detached, it
listens on a Unix socket named by the interpreter and the installed code (a changed
``pytest_longctx``, vLLM or transformers gets a new one), answers one question at a time, and
exits after :data:`IDLE_S` without one, or when asked to (:func:`stop`), once it has answered
every question that reached it. Where it cannot be started, or
``PYTEST_LONGCTX_WARM_PYTHON=0``, each question runs in a Python of its own, as before.
Answers are JSON; a question's exception comes back as :class:`QuestionFailed` with its last
line.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .files import exclusive_lock

#: Set to ``0`` to answer every question in a Python of its own.
WARM_ENV = "PYTEST_LONGCTX_WARM_PYTHON"
#: A warm Python with no question for this long exits.
IDLE_S = 300.0
#: How long a newly started warm Python may take to listen (it imports nothing heavy first).
LISTEN_TIMEOUT_S = 60.0
#: A longer temporary folder (a deep TMPDIR) leaves too little of a socket path's 107 bytes.
SOCKET_FOLDER_MAX = 70
#: How often a Python draining before it exits looks for questions that reached it.
DRAIN_POLL_S = 0.2
#: Only this package's functions are called.
PACKAGE = "pytest_longctx."


class QuestionFailed(RuntimeError):
    """The function raised, or its Python exited: the message is its last line."""


class QuestionTimeout(TimeoutError):
    """No answer within the caller's timeout."""


def ask(
    module: str, function: str, request: Any, timeout_s: float, python: str = sys.executable
) -> Any:
    """``module.function(request)`` in ``python``, warm where it can be: its JSON answer."""
    if not module.startswith(PACKAGE):
        raise ValueError(f"{module}: only {PACKAGE}* functions are asked")
    message = {"module": module, "function": function, "request": request, "cwd": os.getcwd()}
    if os.environ.get(WARM_ENV, "1") != "0":
        path = socket_path(python)
        for attempt in (_exchange, _start_and_exchange):
            try:
                return _reply(attempt(path, message, timeout_s, python))
            except QuestionTimeout:
                raise
            except _Gone:  # it died while it asked (a stop answers what reached it first)
                if attempt is _start_and_exchange:
                    raise QuestionFailed("the warm Python exited without answering") from None
                continue  # a new one answers
            except (_NotListening, OSError):  # not started yet; or a socket this host refuses
                continue
    return _reply(_ask_once(message, timeout_s, python))


def stop(python: str = sys.executable) -> bool:
    """Ask the warm Python of ``python`` and the installed code to exit; whether one did."""
    try:
        _exchange(socket_path(python), {"quit": True}, 10.0)
    except (_NotListening, _Gone, QuestionTimeout, QuestionFailed, OSError):  # gone, or going
        return False
    return True


def process_id(request: Any) -> int:
    """The answering Python's process id (shows which process answered), after ``request``
    seconds when it is a number (a question that stays open that long)."""
    if isinstance(request, (int, float)) and not isinstance(request, bool):
        time.sleep(request)
    return os.getpid()


def socket_path(python: str = sys.executable) -> Path:
    """The socket of the warm Python for ``python`` and the code installed now."""
    stamp = json.dumps([python, *(_stamp(name) for name in ("pytest_longctx", "vllm"))])
    stamp += _stamp("transformers")
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:20]
    folder = Path(tempfile.gettempdir()) / f"pytest-longctx-{os.getuid()}"
    if len(str(folder)) > SOCKET_FOLDER_MAX:  # a Unix socket's path is at most 107 bytes
        folder = Path("/tmp") / f"pytest-longctx-{os.getuid()}"
    return folder / f"warm-{digest}.sock"


def _stamp(package: str) -> str:
    """Where ``package`` is and when its files last changed, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return f"{package}: none"
    root = Path(spec.origin).parent
    files = root.rglob("*.py") if package == "pytest_longctx" else [Path(spec.origin)]
    newest = max((f.stat().st_mtime_ns for f in files), default=0)
    return f"{root}:{newest}"


class _NotListening(Exception):
    pass


class _Gone(Exception):
    """The warm Python closed the connection without an answer: stopped, or it died."""


def _reply(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        raise QuestionFailed(reply["error"])
    return reply["answer"]


def _exchange(
    path: Path, message: dict[str, Any], timeout_s: float, python: str = ""
) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise _NotListening from exc
        conn.settimeout(timeout_s)
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            data = b"".join(iter(lambda: conn.recv(65536), b""))
        except TimeoutError:
            raise QuestionTimeout(f"no answer in {timeout_s:g} s") from None
    if not data:
        raise _Gone
    return json.loads(data)


def _start_and_exchange(
    path: Path, message: dict[str, Any], timeout_s: float, python: str
) -> dict[str, Any]:
    _start(path, python)
    return _exchange(path, message, timeout_s)


def _start(path: Path, python: str) -> None:
    """Start the warm Python (one, whoever asks first), and wait until it listens."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    with exclusive_lock(path.with_suffix(".lock")):
        with contextlib.suppress(_NotListening, _Gone, QuestionTimeout, QuestionFailed, OSError):
            _exchange(path, {"ping": True}, 5.0)
            return
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with open(path.with_suffix(".log"), "ab") as log:
            process = subprocess.Popen(
                [python, "-m", __name__, "serve", str(path), str(IDLE_S)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
            )
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while not path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise _NotListening
            time.sleep(0.02)


def _ask_once(message: dict[str, Any], timeout_s: float, python: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [python, "-m", __name__, "once"],
            input=json.dumps(message),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise QuestionTimeout(f"no answer in {timeout_s:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": tail}
    return json.loads(lines[-1])


def answer(message: dict[str, Any]) -> dict[str, Any]:
    """Call the function a message names; its answer or its error's last line."""
    try:
        module = message["module"]
        if not module.startswith(PACKAGE):
            raise ValueError(f"{module}: only {PACKAGE}* functions are asked")
        with contextlib.suppress(OSError):
            os.chdir(message.get("cwd") or "/")
        function = getattr(importlib.import_module(module), message["function"])
        return {"answer": function(message["request"])}
    except Exception as exc:  # noqa: BLE001 - said to the caller, the Python goes on
        return {"error": " ".join(str(exc).split()) or type(exc).__name__}


def serve(path: Path, idle_s: float) -> int:
    """Listen on ``path``; answer each question; exit when idle or asked to.

    Each connection has a thread, so a ping is answered while a question runs (a caller that
    found it silent would start another); the questions themselves run one at a time. Exiting
    is a drain: the socket is released first (a later caller starts a new Python), then every
    question that reached this one, running, waiting or not yet accepted, is answered: a
    session that ends and stops it never costs another session's question its answer."""
    one_question = threading.Lock()
    stop = threading.Event()
    activity = {"open": 0, "last": time.monotonic()}
    counting = threading.Lock()

    def handle(conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(60.0)
                message = json.loads(b"".join(iter(lambda: conn.recv(65536), b"")) or b"{}")
                if message.get("quit"):
                    release()  # no later caller finds a Python about to exit
                    conn.sendall(b'{"answer": "bye"}')
                    stop.set()  # after the reply: the main thread exits the process once set
                elif message.get("ping"):
                    conn.sendall(b'{"answer": "pong"}')
                else:
                    with one_question:
                        reply = answer(message)
                    conn.sendall(json.dumps(reply, default=str).encode())
        except (OSError, ValueError):
            pass  # the caller gave up or sent nothing readable: it is told nothing
        finally:
            with counting:
                activity["open"] -= 1
                activity["last"] = time.monotonic()

    def release() -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == mine:  # not a successor's
                path.unlink()

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        listener.bind(str(staging))
        listener.listen(16)
        os.replace(staging, path)  # appears only once it accepts
        mine = os.stat(path).st_ino
        listener.settimeout(1.0)
        try:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    with counting:
                        idle = time.monotonic() - activity["last"]
                        if activity["open"] == 0 and idle > idle_s:
                            break
                    continue
                with counting:
                    activity["open"] += 1
                threading.Thread(target=handle, args=(conn,), daemon=True).start()
            # a drain: no new caller finds this Python; those that reached it are answered
            release()
            listener.settimeout(DRAIN_POLL_S)
            while True:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    with counting:
                        if activity["open"] == 0:
                            return 0
                    continue
                with counting:
                    activity["open"] += 1
                threading.Thread(target=handle, args=(conn,), daemon=True).start()
        finally:
            release()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        return serve(Path(args[1]), float(args[2]))
    if args[:1] == ["once"]:
        print(json.dumps(answer(json.loads(sys.stdin.read())), default=str))
        return 0
    print("usage: python -m pytest_longctx.core.warm_python serve SOCKET IDLE_S | once")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
