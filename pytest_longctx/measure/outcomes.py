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
from pytest_longctx.measure.server_metrics import (
    GENERATION_TOKENS,
    ITERATION_TOKENS,
    KV_CACHE_USAGE,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    MetricsSnapshot,
)
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
#: The least a working engine may take to drop a request whose client went away: vLLM aborts
#: a request when its client disconnects, at the engine's next step. Still running after
#: that, behind a front that answers ``/health``, the engine is stuck. A point whose steps
#: were, or are planned to be, slower gets two of its slowest steps instead
#: (:func:`abort_grace_s`).
ABORT_GRACE_S = 5.0
ABORT_POLL_S = 0.25
#: How many graces an engine that keeps stepping is waited for to drop the request; past
#: that the point is still a timeout, with the request said to be still running.
STEPPING_GRACES = 10
#: Counters and gauges that move with each engine step: a prefill chunk allocates KV blocks
#: (the usage gauge) and a step's tokens count in the token counters and the per-step
#: histogram. Any of them moving while the abandoned request runs shows the engine stepping.
_STEP_SIGNS = (KV_CACHE_USAGE, PROMPT_TOKENS, GENERATION_TOKENS, f"{ITERATION_TOKENS}_count")
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


def abort_grace_s(slowest_step_s: float | None, planned_step_s: float | None = None) -> float:
    """How long the engine may keep an abandoned request before it counts as stuck: two of
    the slowest steps the point showed (an abort waits for the step in progress, and a
    prefill's last steps over the longest context are its slowest), never under two of the
    steps the TTFT model plans for the point's length (``planned_step_s``: the progress
    sampler off, or a first step still running, shows none) nor :data:`ABORT_GRACE_S`."""
    return max(ABORT_GRACE_S, 2.0 * (slowest_step_s or 0.0), 2.0 * (planned_step_s or 0.0))


def _grace_words(grace: float, slowest_step_s: float | None, planned_step_s: float | None) -> str:
    """What set the grace, for the evidence; empty for the least grace."""
    if grace <= ABORT_GRACE_S:
        return ""
    if slowest_step_s is not None and grace == 2.0 * slowest_step_s:
        return f"two of the point's slowest steps ({slowest_step_s:.1f} s)"
    return (
        f"two of the point's planned slowest step ({planned_step_s or 0:.1f} s, its last "
        "prefill chunk by the TTFT model)"
    )


def _step_signs(snapshot: MetricsSnapshot) -> tuple[float | None, ...]:
    return tuple(snapshot.total(name) for name in _STEP_SIGNS)


def abandoned_request(
    server: ServerInfo,
    since: float,
    others: int = 0,
    slowest_step_s: float | None = None,
    planned_step_s: float | None = None,
) -> tuple[str, tuple[str, ...]]:
    """What the engine did with a request whose budget ran out, abandoned at ``since``
    (monotonic): ``timeout`` when ``/metrics`` stops counting it running beyond ``others``
    (the background streams of an interference point) or cannot say, and ``hang`` when it
    still counts it after readings that span a grace (:func:`abort_grace_s`) saw no step.

    An engine still stepping (a KV or token counter moved since the request was abandoned)
    is slow, not stuck: it is waited for while it steps, up to :data:`STEPPING_GRACES`
    graces, and the point is a ``timeout`` even if the request still runs then. A step
    longer than the grace that shows no counter move reads as stuck: the server could not
    take the next point before that step ends either."""
    grace = abort_grace_s(slowest_step_s, planned_step_s)
    words = _grace_words(grace, slowest_step_s, planned_step_s)
    first: tuple[float | None, ...] | None = None
    signs: tuple[float | None, ...] = ()
    moved_at: float | None = None
    first_at = since
    with _probe(server) as client:
        while True:
            try:
                snapshot = MetricsSnapshot.from_text(client.metrics_text())
            except (MeasurementError, ValueError):
                return "timeout", ()
            running = snapshot.total(REQUESTS_RUNNING)
            now = time.monotonic()
            if running is None or running <= others:
                return "timeout", _dropped_late(now - since, grace, words, first, signs)
            seen = _step_signs(snapshot)
            if first is None:
                first, first_at = seen, now
            elif seen != signs:
                moved_at = now
            signs = seen
            # Stuck needs readings that span a whole grace without a move: the first one
            # comes only after the check that the process lives, which takes a while.
            if now >= (moved_at or first_at) + grace or now >= since + STEPPING_GRACES * grace:
                break
            time.sleep(ABORT_POLL_S)
    waited = now - since
    besides = f", {others} of them the background streams'" if others else ""
    if moved_at is not None and now < moved_at + grace:
        return "timeout", (
            f"{REQUESTS_RUNNING} was {running:g}{besides} {waited:.1f} s after the client "
            f"abandoned the request, but the engine is still stepping "
            f"({_moves(first, signs)}): it drops the request at a later step; the server is "
            "kept",
        )
    step = f" ({words})" if words else ""
    evidence = [
        f"{REQUESTS_RUNNING} was {running:g}{besides} {waited:.1f} s after "
        f"the client abandoned the request, while /health answers and no step counter moved "
        f"for {grace:.1f} s{step}: the engine did not drop it (vLLM aborts a request whose "
        "client disconnected at its next step), so it is stuck"
    ]
    if server.mode != "launched":
        evidence.append(
            f"the server at {server.base_url} is attached: it cannot be restarted from here, "
            "and its later points wait behind the stuck request"
        )
    return "hang", tuple(evidence)


def _moves(first: tuple[float | None, ...] | None, last: tuple[float | None, ...]) -> str:
    """The step signs that moved, as ``name before -> after``."""
    return ", ".join(
        f"{name} {before:g} -> {after:g}"
        for name, before, after in zip(_STEP_SIGNS, first or (), last, strict=False)
        if before is not None and after is not None and before != after
    )


def _dropped_late(
    waited: float,
    grace: float,
    words: str,
    first: tuple[float | None, ...] | None,
    last: tuple[float | None, ...],
) -> tuple[str, ...]:
    """What a timeout keeps when the engine dropped the request later than the least grace:
    how long it took, and what showed it working meanwhile (``words``: what set the
    grace)."""
    if waited <= ABORT_GRACE_S:
        return ()
    moves = _moves(first, last)
    within = f"within {grace:.1f} s" + (f", {words}" if words else "")
    why = f"stepping meanwhile ({moves})" if moves else within
    return (
        f"the engine dropped the abandoned request {waited:.1f} s after its client left it, "
        f"{why}: a slow step, not a stuck engine; the server is kept",
    )


def failed_request(
    exc: MeasurementError,
    server: ServerInfo,
    check_alive: Callable[[float], None],
    others: int = 0,
    slowest_step_s: float | None = None,
    planned_step_s: float | None = None,
) -> tuple[str, str, tuple[str, ...], bool]:
    """A failed request's (message, class, evidence, sent), from the error and from the
    server's state after it.

    A dead launched server is classed by its death (its log and the OOM killer); a dead
    engine's error frame is ``engine_died`` (or ``oom``) whatever the check after it shows of
    an attached server (unhealthy, gone, silent). A budget that ran out is a ``timeout``
    while the server still answers and drops the abandoned request, and a ``hang`` when it
    does not answer, or answers with the request still running and the engine not stepping
    (:func:`abandoned_request`; ``others``: requests of other clients expected to run;
    ``slowest_step_s``: the slowest engine step the point showed, and ``planned_step_s``: the
    TTFT model's for its length, which set the grace); a
    broken connection to a server that still answers was cut between the two.
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
            klass, evidence = abandoned_request(
                server, abandoned, others, slowest_step_s, planned_step_s
            )
            return text, klass, evidence, sent
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
