"""Questions for vLLM, torch or transformers are answered by one warm Python, not one Python
per question: it is started on the first, kept between sessions, replaced when it died, and
bypassed when the user turns it off."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

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
def test_a_question_the_python_was_stopped_under_is_answered_by_a_new_one() -> None:
    """Two sessions share the warm Python; one ends and stops it while the other's question
    runs: that question is asked again of a new one, not failed."""
    pid = answering_pid()
    answers: list[int] = []
    asking = threading.Thread(
        target=lambda: answers.append(warm_python.ask(MODULE, "process_id", 2.0, timeout_s=60))
    )
    asking.start()
    time.sleep(0.5)  # the question is in its two seconds
    assert warm_python.stop()
    asking.join(60)
    assert answers and answers[0] not in (pid, os.getpid())


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
