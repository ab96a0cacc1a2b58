"""Questions for vLLM, torch or transformers are answered by one warm Python, not one Python
per question: it is started on the first, kept between sessions, replaced when it died, and
bypassed when the user turns it off."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_longctx.core import warm_python

pytestmark = pytest.mark.oracle

MODULE = "pytest_longctx.core.warm_python"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A warm Python of this test's own (its socket in a folder of its own), stopped after."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        monkeypatch.setattr(tempfile, "tempdir", folder)
        yield
        warm_python.stop()


def answering_pid() -> int:
    return warm_python.ask(MODULE, "process_id", None, timeout_s=60)


@pytest.mark.usefixtures("fresh")
def test_one_python_answers_question_after_question() -> None:
    first = answering_pid()
    assert first != os.getpid()
    assert answering_pid() == first
    assert warm_python.socket_path().exists()


@pytest.mark.usefixtures("fresh")
def test_a_caller_that_holds_its_connection_does_not_hold_up_the_others() -> None:
    """A question in progress (here a caller that connected and has not asked yet) leaves
    the others answered by the same Python, not taken for a dead one and replaced."""
    pid = answering_pid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.connect(str(warm_python.socket_path()))
        assert warm_python.ask(MODULE, "process_id", None, timeout_s=10) == pid


@pytest.mark.usefixtures("fresh")
def test_a_question_that_raises_says_why_and_the_python_goes_on() -> None:
    pid = answering_pid()
    with pytest.raises(warm_python.QuestionFailed, match="has no attribute 'no_such_function'"):
        warm_python.ask(MODULE, "no_such_function", None, timeout_s=60)
    assert answering_pid() == pid


@pytest.mark.usefixtures("fresh")
def test_a_dead_warm_python_is_replaced_on_the_next_question() -> None:
    pid = answering_pid()
    os.kill(pid, signal.SIGKILL)  # its socket file stays behind
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    assert warm_python.socket_path().exists()
    replacement = answering_pid()
    assert replacement not in (pid, os.getpid())


@pytest.mark.usefixtures("fresh")
def test_stop_ends_it_and_the_next_question_starts_another() -> None:
    pid = answering_pid()
    assert warm_python.stop()
    assert not warm_python.stop()  # nothing listens any more
    assert answering_pid() != pid


@pytest.mark.usefixtures("fresh")
def test_a_stop_answers_the_questions_that_reached_the_python_first() -> None:
    """Two sessions share the warm Python; one ends and stops it while the other's question
    runs: that question is answered by the Python it reached (asked again elsewhere, it could
    meet the next session's stop too, and a config transformers rejects would be described
    as "exited without answering"). A question after the stop starts a new one."""
    pid = answering_pid()
    question = {"module": MODULE, "function": "process_id", "request": 2.0, "cwd": "/"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asking:
        asking.connect(str(warm_python.socket_path()))  # the question has reached it
        asking.sendall(json.dumps(question).encode() + b"\n")
        asking.shutdown(socket.SHUT_WR)
        assert warm_python.stop()  # another session ends
        asking.settimeout(60)
        reply = b"".join(iter(lambda: asking.recv(65536), b""))
    assert json.loads(reply) == {"answer": pid}
    assert answering_pid() not in (pid, os.getpid())
    deadline = time.monotonic() + 30  # and the stopped one exits once it has answered
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.05)
    assert not running(pid)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (not exited, nor a zombie this process has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.usefixtures("fresh")
def test_a_question_asked_while_another_is_stopped_under_is_answered() -> None:
    """Through :func:`warm_python.ask`: a question in its two seconds, a stop, a question
    after it; both answered, the first by the Python it was asked."""
    pid = answering_pid()
    answers: list[int] = []
    asking = threading.Thread(
        target=lambda: answers.append(warm_python.ask(MODULE, "process_id", 2.0, timeout_s=60))
    )
    asking.start()
    time.sleep(0.5)  # (a host too busy to have sent it by now has it answered by a new one)
    assert warm_python.stop()
    after = answering_pid()
    asking.join(60)
    assert answers and answers[0] in (pid, after) and after not in (pid, os.getpid())


@pytest.mark.usefixtures("fresh")
def test_turned_off_every_question_gets_a_python_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(warm_python.WARM_ENV, "0")
    first, second = answering_pid(), answering_pid()
    assert len({first, second, os.getpid()}) == 3
    assert not warm_python.socket_path().exists()
    with pytest.raises(warm_python.QuestionFailed, match="no_such_function"):
        warm_python.ask(MODULE, "no_such_function", None, timeout_s=60)


def test_a_temporary_folder_too_deep_for_a_socket_falls_back_to_tmp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", "/tmp/" + "deep/" * 30)
    path = warm_python.socket_path()
    assert str(path).startswith("/tmp/pytest-longctx-") and len(str(path)) < 107


def test_only_this_packages_functions_are_asked() -> None:
    with pytest.raises(ValueError, match=r"os: only pytest_longctx\.\* functions"):
        warm_python.ask("os", "getpid", None, timeout_s=5)
