"""A campaign that outlives its server: before each point, the server is brought back.

A launched server that died (or hung, and was stopped) is started again with the same command
and warm-up once its process group is gone, its port free and, on GPUs, its devices' memory
back near where it was before the first start; its fingerprint must match the run's, and the
point is then measured, not failed. A relaunch whose start fails counts as one and is tried
again while relaunches are left. An attached server cannot be started again: the session
waits a bounded time for it to answer, checks it is the same server, and goes on, else its
points fail at once as ``server_gone``. Limits: relaunches per session
(``--longctx-max-relaunches``), after which the points left are never sent (``start_failed``),
and crashes per length (``--longctx-max-crashes-per-length``), after which that length's
remaining repeats are skipped, carrying the class of its last crash.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

import pytest

from pytest_longctx.core.sizes import format_size
from pytest_longctx.gate import fingerprint_mismatch
from pytest_longctx.measure.point import PointFailure
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan.sweep import INTERFERENCE, Point
from pytest_longctx.progress import telemetry
from pytest_longctx.reporting.reuse import format_bytes
from pytest_longctx.serving.process import check_attached, control_client, wait_group_gone
from pytest_longctx.session import points
from pytest_longctx.session import server as session_server
from pytest_longctx.session.run import Run

#: Classes that mean the point took the server down with it; they count against its length.
CRASH_CLASSES = ("engine_died", "oom", "hang", "server_gone")
#: On a worker's report of a point it hands back, for the controller (controller.py).
HANDED_BACK_ATTRIBUTE = "longctx_handed_back"
#: How long a dead server's process group, port and device memory may take to be released.
RELEASE_TIMEOUT_S = 60.0
#: How far above its level before the first start a device's used memory may stay (the
#: driver's own, another tool's context) and still count as released.
DEVICE_MEMORY_MARGIN_BYTES = 1024**3
DEVICE_POLL_S = 1.0
REATTACH_POLL_S = 2.0


def skip(reason: str, failure_class: str, evidence: tuple[str, ...] = ()) -> BaseException:
    """A skip that carries its class to the record."""
    exc = pytest.skip.Exception(reason, _use_item_location=True)
    exc.failure_class = failure_class  # type: ignore[attr-defined]
    exc.evidence = evidence  # type: ignore[attr-defined]
    return exc


def failed(exc: ServerError) -> BaseException:
    """A fixture's failure (``pytest.fail``) that carries the server error's class."""
    failure = pytest.fail.Exception(str(exc), pytrace=False)
    failure.failure_class = exc.failure_class  # type: ignore[attr-defined]
    failure.evidence = exc.evidence  # type: ignore[attr-defined]
    return failure


def before_point(config: pytest.Config, run: Run, point: Point) -> None:
    """Make the point measurable, or say why it cannot be: skip a length vLLM refused or
    that crashed the server too often, bring a dead server back, fail fast when it cannot.

    Under pytest-xdist a worker whose launched server is lost for good hands its points back
    (a skip saying so), and the controller gives them to the other workers."""
    try:
        _before_point(config, run, point)
    except PointFailure as exc:
        if exc.sent or run.worker is None or run.launched is None:
            raise
        handed = skip(
            f"{exc}\n{run.worker} takes no more points: handed to the other workers",
            exc.failure_class,
            exc.evidence,
        )
        handed.handed_back = True  # type: ignore[attr-defined]
        raise handed from None


def _before_point(config: pytest.Config, run: Run, point: Point) -> None:
    check_skips(run, point)
    if isinstance(run.server, ServerError):
        raise PointFailure(str(run.server), run.server.failure_class, run.server.evidence, False)
    if not isinstance(run.server, ServerInfo):
        return
    if run.launched is not None:
        cause = run.restart_cause
        if cause is None:
            try:
                run.launched.check_alive()
            except ServerError as exc:
                cause = exc
        if cause is not None:
            _relaunch(config, run, cause)
        wanted = session_server.workload_of(point)
        if wanted != run.serves:
            _switch(config, run, wanted)
    elif run.settings.url:
        _reattach(run, run.server)


def check_skips(run: Run, point: Point) -> None:
    """Skip a length vLLM refused at start-up, or one that took the server down too often;
    the skip carries the class of the failure that caused it (the length's last crash)."""
    refused = run.start_refused.get(point.length)
    if refused is not None:
        raise skip(str(refused), refused.failure_class, refused.evidence)
    crashes = run.crashes.get(point.length, [])
    limit = run.settings.max_crashes_per_length
    if len(crashes) >= limit:
        times = "once" if len(crashes) == 1 else f"{len(crashes)} times"
        said = (
            f"{format_size(point.length)} took the server down {times} in this session "
            f"({', '.join(crashes)})"
        )
        raise skip(
            f"{said}; its remaining repeats are skipped (--longctx-max-crashes-per-length={limit})",
            crashes[-1],
            (said,),
        )


def server_down(run: Run) -> bool:
    """Whether the launched server has died (or must be started again)."""
    if run.launched is None or not isinstance(run.server, ServerInfo):
        return False
    return run.restart_cause is not None or run.launched.death() is not None


def after_failure(run: Run, point: Point, failure: PointFailure) -> None:
    """Count a crash against its length; a hung launched server is stopped, to be started
    again before the next point."""
    if not failure.sent or failure.failure_class not in CRASH_CLASSES:
        return
    run.crashes.setdefault(point.length, []).append(failure.failure_class)
    if failure.failure_class == "hang" and run.launched is not None:
        run.restart_cause = ServerError(
            f"the server hung during {point.id}", "hang", failure.evidence
        )
        with contextlib.suppress(Exception):
            run.launched.stop()


def _first_line(error: ServerError) -> str:
    return str(error).splitlines()[0] if str(error) else error.failure_class


def _cause_line(cause: ServerError) -> str:
    first = _first_line(cause)
    detail = cause.evidence[-1] if cause.evidence else ""
    return f"{cause.failure_class}: {first}" + (f" ({detail})" if detail else "")


def _relaunch(config: pytest.Config, run: Run, cause: ServerError) -> None:
    """Start the dead server again; a start that fails counts as a relaunch and is tried
    again while relaunches are left (a switch to the other workload's server is none).

    Once they are spent the point is never sent: ``start_failed``, saying so, not the
    class of the death (that is the crashed point's), so a length's counts show no crash
    where nothing ran."""
    assert run.launched is not None
    command = run.launched.command
    run.restart_cause = None
    limit = run.settings.max_relaunches
    failed: list[ServerError] = []
    while run.relaunches < limit:
        run.relaunches += 1
        run.launched.stop()
        tried = (
            f"; {len(failed)} start(s) failed before it, the last: {_first_line(failed[-1])}"
            if failed
            else ""
        )
        try:
            _bring_up_again(
                config,
                run,
                run.launched,
                command,
                _cause_line(cause) + tried,
                "the relaunched server",
            )
            return
        except ServerError as exc:
            failed.append(exc)
    why = (
        f"relaunching the server after {_cause_line(cause)} failed: {failed[-1]}"
        if failed
        else str(cause)
    )
    run.server = ServerError(
        f"{why}\nnever sent: the server is down and not started again: this session's "
        f"relaunches are spent ({run.relaunches} of --longctx-max-relaunches={limit})",
        "start_failed",
        failed[-1].evidence if failed else cause.evidence,
    )
    raise PointFailure(str(run.server), "start_failed", run.server.evidence, sent=False)


def _switch(config: pytest.Config, run: Run, serves: str) -> None:
    """Stop the server of one workload and start the other's: the interference points run on
    a server with room for their background streams, so the cold points keep the study's
    one-sequence server and its fingerprint."""
    assert run.launched is not None
    old = run.launched
    old.stop()
    port = int(old.command.argv[old.command.argv.index("--port") + 1])
    run.serves = serves
    cause = (
        f"the {serves} workload: room for {run.plan.background_streams} background streams "
        "beside the long prompt"
        if serves == INTERFERENCE
        else f"the {serves} workload: the study's server again"
    )
    try:
        _bring_up_again(
            config,
            run,
            old,
            session_server.server_command(config, run, port, build=True, serves=serves),
            cause,
            f"the server for the {serves} workload",
            adopt=True,
            switched=True,
            workload=serves,
        )
    except ServerError as exc:
        run.server = ServerError(
            f"starting the server for the {serves} workload failed: {exc}",
            "start_failed",
            exc.evidence,
        )
        raise PointFailure(str(run.server), "start_failed", exc.evidence, sent=False) from None


def _bring_up_again(
    config: pytest.Config,
    run: Run,
    old: Any,
    command: Any,
    cause: str,
    what: str,
    *,
    adopt: bool = False,
    **noted: Any,
) -> None:
    """Start ``command`` once the old server's resources are released, check that it
    measures what the run measures and warm it up; ``adopt``: its fingerprint (command,
    workload) is the run's from here on. A failure is a :class:`ServerError`, the server
    it started stopped."""
    _wait_released(run, old.process.pid if old.process else None, command.argv)
    info = session_server.bring_up(run, command, cause=cause, **noted)
    try:
        fingerprint = session_server.fingerprint(config, run, info)
        differences = fingerprint_mismatch(run.fingerprint, fingerprint)
        if differences:
            raise ServerError(
                f"{what} differs from the one this run measured:\n  " + "\n  ".join(differences),
                "start_failed",
            )
        if adopt:
            kept = {k: run.fingerprint[k] for k in ("kv_cache_check",) if k in run.fingerprint}
            run.fingerprint = {**fingerprint, **kept}
        points.warm_up(run, info)
    except ServerError:
        if run.launched is not None:
            run.launched.stop()
        raise
    run.use_server(info)
    session_server.announce_ready(config, run, info)


def _wait_released(run: Run, pgid: int | None, argv: tuple[str, ...]) -> None:
    """The dead server's process group gone (zombies aside), its port free and its devices'
    memory back near its level before the first start (GPU profiles), or a ServerError.

    On a CPU the kernel takes a process's memory and cores back when the process ends, so
    the group being gone is the whole of it: nothing else is polled there."""
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    if pgid is not None and not wait_group_gone(pgid, RELEASE_TIMEOUT_S):
        raise ServerError(
            f"the dead server's process group {pgid} is still alive after {RELEASE_TIMEOUT_S:g} s",
            "start_failed",
        )
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    while not _port_free(host, port):
        if time.monotonic() > deadline:
            raise ServerError(
                f"port {port} is still taken after {RELEASE_TIMEOUT_S:g} s", "start_failed"
            )
        time.sleep(0.2)
    if run.device_memory_before:
        scope = session_server.device_scope(run)
        wait_device_memory(run.device_memory_before, lambda: telemetry.memory_used(scope))


def wait_device_memory(
    before: dict[int, int],
    read: Any,
    timeout_s: float = RELEASE_TIMEOUT_S,
    poll_s: float = DEVICE_POLL_S,
) -> None:
    """Poll ``read()`` (bytes used per device) until every device of ``before`` is within
    :data:`DEVICE_MEMORY_MARGIN_BYTES` of its level there; a ServerError naming the devices
    that still hold memory after ``timeout_s``. A reading that fails says nothing either way
    and is not waited on."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = read()
        if now is None:
            return
        held = {
            index: used
            for index, used in now.items()
            if index in before and used > before[index] + DEVICE_MEMORY_MARGIN_BYTES
        }
        if not held:
            return
        if time.monotonic() > deadline:
            devices = "; ".join(
                f"device {index}: {format_bytes(used)} used, {format_bytes(before[index])} "
                "before the first start"
                for index, used in sorted(held.items())
            )
            raise ServerError(
                f"the dead server's device memory is not released after {timeout_s:g} s "
                f"({devices}): a process of it may outlive its group, or the driver holds it",
                "start_failed",
            )
        time.sleep(poll_s)


def _port_free(host: str, port: int) -> bool:
    """Whether vLLM could bind the port again (it binds with SO_REUSEADDR, as here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _reattach(run: Run, server: ServerInfo) -> None:
    """An attached server that stopped answering: wait for it, and check it is the same."""
    try:
        check_attached(server.base_url, server.api_key, session_server.api_key_env_name(run))
        return
    except ServerError as exc:
        if exc.failure_class not in ("server_gone", "hang", "engine_died"):
            raise PointFailure(str(exc), exc.failure_class, exc.evidence, sent=False) from None
        gone = exc
    waited = time.monotonic()
    deadline = waited + run.settings.reattach_timeout_s
    while True:
        try:
            check_attached(server.base_url, server.api_key, session_server.api_key_env_name(run))
            break
        except ServerError:
            if time.monotonic() > deadline:
                run.server = ServerError(
                    f"{gone}\nit did not answer again within {run.settings.reattach_timeout_s:g} "
                    "s (--longctx-reattach-timeout)",
                    "server_gone",
                )
                raise PointFailure(str(run.server), "server_gone", sent=False) from None
            time.sleep(REATTACH_POLL_S)
    with control_client(server.base_url, server.api_key) as client:
        try:
            served, version = client.models(), client.version()
        except Exception as exc:  # noqa: BLE001 - any failure to describe it is a gone server
            served, version = None, f"unreadable ({exc})"
    differences = []
    if served is None or served.id != server.model_name:
        differences.append(f"model {served.id if served else None!r} != {server.model_name!r}")
    elif served.max_model_len != server.max_model_len:
        differences.append(f"max_model_len {served.max_model_len} != {server.max_model_len}")
    if version != server.engine_version:
        differences.append(f"version {version!r} != {server.engine_version!r}")
    if differences:
        run.server = ServerError(
            f"the server at {server.base_url} answers again, but it is not the server this run "
            "measured: " + "; ".join(differences),
            "server_gone",
        )
        raise PointFailure(str(run.server), "server_gone", sent=False)
    run.use_server(server)
    session_server.note_start(
        run,
        None,
        f"server_gone: {str(gone).splitlines()[0]}; answered again after "
        f"{time.monotonic() - waited:.1f} s",
        attached=server.base_url,
    )
