"""Why a point did not pass: one class (``core.records.FAILURE_CLASSES``) from evidence.

The evidence is what the server said and did: the HTTP status, the words of vLLM's error frame,
the lines of its log, how its process ended, and the cgroup's ``memory.events``. vLLM's error
frame for a dead engine is the same text whatever killed it (``EngineDeadError``, vLLM 0.32:
"EngineCore encountered an issue. See stack trace (above) for the root cause."), so only the
log or the OOM killer's count can tell an out-of-memory from another death; without them (an
attached server whose log is not readable here) the class is ``engine_died``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pytest_longctx.client import (
    ClientConfig,
    CompletionClient,
    ErrorFrameError,
    MeasurementError,
    MeasurementTimeoutError,
    NotConnectedError,
    RequestRejectedError,
    ServerUnavailableError,
    TruncatedStreamError,
)
from pytest_longctx.measure.server_metrics import REQUESTS_RUNNING, MetricsSnapshot
from pytest_longctx.measure.target import ServerError, ServerInfo

#: ``vllm.v1.engine.exceptions.EngineDeadError``'s message, inside error frames and bodies.
ENGINE_DEAD_WORDS = "EngineCore encountered an issue"

#: Lines that name an out-of-memory: torch on CUDA and ROCm, vLLM's KV check at start-up,
#: the C++ allocator and Python's own.
_OOM_RE = re.compile(
    r"CUDA out of memory|HIP out of memory|OutOfMemoryError|out of memory"
    r"|KV cache is needed, which is larger than the available KV cache memory"
    r"|No available memory for the cache blocks|Cannot allocate memory|std::bad_alloc"
    r"|\bMemoryError\b",
    re.IGNORECASE,
)
#: An exception as Python prints it last in a traceback: ``ValueError: ...``, possibly after
#: vLLM's per-process prefix ``(EngineCore_DP0 pid=7) ``.
_EXCEPTION_RE = re.compile(
    r"(?:^|\s|\))((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)): (\S.*)$"
)
#: Wrappers that end vLLM's log after the real cause ("See root cause above").
_WRAPPERS = (
    "Engine core initialization failed",
    "See root cause above",
    "See stack trace (above)",
)
#: vLLM's start-up refusal (``v1/core/kv_cache_utils._check_enough_kv_cache_memory``).
_ESTIMATED_MAX_RE = re.compile(r"the estimated maximum model length is (\d+)")


@dataclass(frozen=True)
class Failure:
    """A class and the lines that show it."""

    failure_class: str
    evidence: tuple[str, ...] = ()


def oom_lines(lines: Iterable[str]) -> tuple[str, ...]:
    """The lines that name an out-of-memory, in order, each once."""
    return tuple(dict.fromkeys(line.strip() for line in lines if _OOM_RE.search(line)))


def names_oom(text: str) -> bool:
    return bool(_OOM_RE.search(text))


def engine_dead(text: str) -> bool:
    return ENGINE_DEAD_WORDS in text


def final_exception(lines: Iterable[str]) -> str | None:
    """The exception that ends a log, in one line: the root cause, not vLLM's wrapper around it.

    A traceback ends with its exception; vLLM re-raises start-up failures as "Engine core
    initialization failed. See root cause above", so the last exception that is not such a
    wrapper is the cause.
    """
    found: list[str] = []
    for line in lines:
        match = _EXCEPTION_RE.search(line.rstrip())
        if match:
            found.append(f"{match.group(1)}: {match.group(2).strip()}")
    causes = [line for line in found if not any(words in line for words in _WRAPPERS)]
    if causes:
        return causes[-1]
    return found[-1] if found else None


def estimated_max_model_len(text: str) -> int | None:
    """The longest model length vLLM said at start-up that its KV cache holds, if it said so."""
    match = _ESTIMATED_MAX_RE.search(text)
    return int(match.group(1)) if match else None


def classify_server_message(message: str, default: str = "error") -> str:
    """An error frame's or a 5xx body's words: a dead engine, an out-of-memory, or ``default``."""
    if names_oom(message):
        return "oom"
    if engine_dead(message):
        return "engine_died"
    return default


def death(log_lines: Iterable[str], exit_code: int | None, oom_kills: int = 0) -> Failure:
    """How a launched server that died during a point is classed.

    ``oom`` needs evidence: a log line naming it, or the OOM killer's count in the cgroup's
    ``memory.events`` having grown; an exit by SIGKILL (-9) alone is not evidence (a person or
    a scheduler sends it too).
    """
    lines = list(log_lines)
    named = oom_lines(lines)
    evidence: list[str] = []
    if exit_code is not None:
        evidence.append(f"the server exited with code {exit_code}")
    if oom_kills:
        evidence.append(f"memory.events: oom_kill grew by {oom_kills} during the server's life")
    if named or oom_kills:
        return Failure("oom", (*evidence, *named))
    cause = final_exception(lines)
    return Failure("engine_died", (*evidence, *([cause] if cause else [])))


#: How long a server may take to answer ``/health`` after a failed point before it counts as
#: not answering (a hung server, or an attached one that is gone).
PROBE_TIMEOUT_S = 10.0
#: How long a working engine may take to drop a request whose client went away: vLLM aborts
#: a request when its client disconnects, at the engine's next step. Still running after
#: that, behind a front that answers ``/health``, the engine is stuck.
ABORT_GRACE_S = 5.0
ABORT_POLL_S = 0.25
#: The classes a dead engine's error frame replaces when the check after it only shows the
#: server unhealthy (vLLM's ``/health`` answers 503 once its engine is dead), gone or silent.
_FRAME_WINS_OVER = ("error", "engine_died", "server_gone", "hang")


def _probe(server: ServerInfo) -> CompletionClient:
    config = ClientConfig(
        base_url=server.base_url,
        api_key=server.api_key,
        connect_timeout_s=PROBE_TIMEOUT_S,
        control_timeout_s=PROBE_TIMEOUT_S,
    )
    return CompletionClient(config)


def _answers(server: ServerInfo) -> bool:
    with _probe(server) as client:
        return client.health_status() is not None


def stuck_engine(server: ServerInfo, since: float, others: int = 0) -> tuple[str, ...] | None:
    """The evidence that the engine is stuck after a request's budget ran out: ``/metrics``
    still counts more than ``others`` requests running (the background streams of an
    interference point) :data:`ABORT_GRACE_S` after the client abandoned its request at
    ``since`` (monotonic). None when the request was dropped, or ``/metrics`` cannot say.

    One engine step longer than the grace (an unchunked prefill of millions of tokens) reads
    the same: the server could not take the next point before that step ends either."""
    running: float | None = None
    with _probe(server) as client:
        while True:
            try:
                running = MetricsSnapshot.from_text(client.metrics_text()).total(REQUESTS_RUNNING)
            except (MeasurementError, ValueError):
                return None
            if running is None or running <= others:
                return None
            if time.monotonic() >= since + ABORT_GRACE_S:
                break
            time.sleep(ABORT_POLL_S)
    besides = f", {others} of them the background streams'" if others else ""
    evidence = [
        f"{REQUESTS_RUNNING} was {running:g}{besides} {time.monotonic() - since:.1f} s after "
        "the client abandoned the request, while /health answers: the engine did not drop it "
        "(vLLM aborts a request whose client disconnected at its next step), so it is stuck"
    ]
    if server.mode != "launched":
        evidence.append(
            f"the server at {server.base_url} is attached: it cannot be restarted from here, "
            "and its later points wait behind the stuck request"
        )
    return tuple(evidence)


def failed_request(
    exc: MeasurementError,
    server: ServerInfo,
    check_alive: Callable[[float], None],
    others: int = 0,
) -> tuple[str, str, tuple[str, ...], bool]:
    """A failed request's (message, class, evidence, sent), from the error and from the
    server's state after it.

    A dead launched server is classed by its death (its log and the OOM killer); a dead
    engine's error frame is ``engine_died`` (or ``oom``) whatever the check after it shows of
    an attached server (unhealthy, gone, silent). A budget that ran out is a ``timeout``
    while the server still answers and drops the abandoned request, and a ``hang`` when it
    does not answer, or answers with the request still running (:func:`stuck_engine`;
    ``others``: requests of other clients expected to run); a broken connection to a server
    that still answers was cut between the two.
    """
    abandoned = time.monotonic()
    text = f"{type(exc).__name__}: {exc}"
    sent = not isinstance(exc, NotConnectedError)
    said = getattr(exc, "server_message", None) or str(exc)
    frame = (
        (classify_server_message(said),)
        if isinstance(exc, (ErrorFrameError, RequestRejectedError))
        else ()
    )
    try:
        check_alive(5.0)
    except ServerError as gone:
        evidence = (*([said] if frame else []), *gone.evidence)
        klass = gone.failure_class
        if frame and frame[0] in ("engine_died", "oom") and klass in _FRAME_WINS_OVER:
            klass = frame[0]
        return f"{text}\n{gone}", klass, evidence, sent
    if frame:
        return text, frame[0], (said,), sent
    if isinstance(exc, MeasurementTimeoutError):
        if _answers(server):
            stuck = stuck_engine(server, abandoned, others)
            if stuck:
                return text, "hang", stuck, sent
            return text, "timeout", (), sent
        return (
            text,
            "hang",
            (
                f"{server.base_url} did not answer /health within {PROBE_TIMEOUT_S:g} s after the "
                "budget ran out",
            ),
            sent,
        )
    if isinstance(exc, (TruncatedStreamError, ServerUnavailableError)) and _answers(server):
        return (
            text,
            "connection_cut",
            (
                f"the connection broke while the server at {server.base_url} stayed up and still "
                "answers /health: something between the two (a NAT, proxy or load balancer) cut "
                "it",
            ),
            sent,
        )
    return text, "error", (), sent
