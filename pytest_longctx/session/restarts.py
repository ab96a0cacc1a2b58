"""A campaign that outlives its server: before each point, the server is brought back.

A launched server that died (or hung, and was stopped) is started again with the same command
and warm-up once its process group is gone and its port is free, and its fingerprint must
match the run's; the point is then measured, not failed. An attached server cannot be started
again: the session waits a bounded time for it to answer, checks it is the same server, and
goes on, else its points fail at once as ``server_gone``. Limits: relaunches per session
(``--longctx-max-relaunches``) and crashes per length (``--longctx-max-crashes-per-length``),
after which that length's remaining repeats are skipped with the reason.
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
from pytest_longctx.serving.process import check_attached, control_client, is_alive
from pytest_longctx.session import points
from pytest_longctx.session import server as session_server
from pytest_longctx.session.run import Run

#: Classes that mean the point took the server down with it; they count against its length.
CRASH_CLASSES = ("engine_died", "oom", "hang", "server_gone")
#: On a worker's report of a point it hands back, for the controller (controller.py).
HANDED_BACK_ATTRIBUTE = "longctx_handed_back"
#: How long a dead server's process group and port may take to be released.
RELEASE_TIMEOUT_S = 60.0
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
        handed = pytest.skip.Exception(
            f"{exc}\n{run.worker} takes no more points: handed to the other workers",
            _use_item_location=True,
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
    """Skip a length vLLM refused at start-up, or one that took the server down too often."""
    refused = run.start_refused.get(point.length)
    if refused is not None:
        raise skip(str(refused), refused.failure_class, refused.evidence)
    crashes = run.crashes.get(point.length, [])
    limit = run.settings.max_crashes_per_length
    if len(crashes) >= limit:
        # A consequence, not a failure of its own: the crashes carry the classes.
        times = "once" if len(crashes) == 1 else f"{len(crashes)} times"
        raise pytest.skip.Exception(
            f"{format_size(point.length)} took the server down {times} in this "
            f"session ({', '.join(crashes)}); its remaining repeats are skipped "
            f"(--longctx-max-crashes-per-length={limit})",
            _use_item_location=True,
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


def _cause_line(cause: ServerError) -> str:
    first = str(cause).splitlines()[0] if str(cause) else cause.failure_class
    detail = cause.evidence[-1] if cause.evidence else ""
    return f"{cause.failure_class}: {first}" + (f" ({detail})" if detail else "")


def _relaunch(config: pytest.Config, run: Run, cause: ServerError) -> None:
    assert run.launched is not None
    old = run.launched
    run.restart_cause = None
    # A server started for the other workload (a switch) is no relaunch.
    used = sum(1 for start in run.starts[1:] if not start.get("switched"))
    limit = run.settings.max_relaunches
    if used >= limit:
        run.server = ServerError(
            f"{cause}\nnot started again: this session's relaunches are spent ({used} of "
            f"--longctx-max-relaunches={limit})",
            cause.failure_class,
            cause.evidence,
        )
        raise PointFailure(str(run.server), cause.failure_class, cause.evidence, sent=False)
    old.stop()
    _bring_up_again(
        config,
        run,
        old,
        old.command,
        _cause_line(cause),
        what="the relaunched server",
        failed=f"relaunching the server after {_cause_line(cause)} failed",
    )


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
    _bring_up_again(
        config,
        run,
        old,
        session_server.server_command(config, run, port, build=True, serves=serves),
        cause,
        what=f"the server for the {serves} workload",
        failed=f"starting the server for the {serves} workload failed",
        adopt=True,
        switched=True,
        workload=serves,
    )


def _bring_up_again(
    config: pytest.Config,
    run: Run,
    old: Any,
    command: Any,
    cause: str,
    *,
    what: str,
    failed: str,
    adopt: bool = False,
    **noted: Any,
) -> None:
    """Start ``command`` once the old server's process group and port are free, check that
    it measures what the run measures and warm it up; ``adopt``: its fingerprint (command,
    workload) is the run's from here on. A failure fails the point, never sent."""
    try:
        _wait_released(old.process.pid if old.process else None, command.argv)
        info = session_server.bring_up(run, command, cause=cause, **noted)
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
    except ServerError as exc:
        run.server = ServerError(f"{failed}: {exc}", "start_failed", exc.evidence)
        raise PointFailure(str(run.server), "start_failed", exc.evidence, sent=False) from None
    run.server = info


def _wait_released(pgid: int | None, argv: tuple[str, ...]) -> None:
    """The dead server's process group gone and its port free, or a ServerError."""
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while pgid is not None and is_alive(pgid, group=True):
        if time.monotonic() > deadline:
            raise ServerError(
                f"the dead server's process group {pgid} is still alive after "
                f"{RELEASE_TIMEOUT_S:g} s",
                "start_failed",
            )
        time.sleep(0.1)
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    while not _port_free(host, port):
        if time.monotonic() > deadline:
            raise ServerError(
                f"port {port} is still taken after {RELEASE_TIMEOUT_S:g} s", "start_failed"
            )
        time.sleep(0.2)


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
    session_server.note_start(
        run,
        None,
        f"server_gone: {str(gone).splitlines()[0]}; answered again after "
        f"{time.monotonic() - waited:.1f} s",
        attached=server.base_url,
    )
