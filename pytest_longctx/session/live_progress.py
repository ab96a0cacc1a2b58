"""Progress inside points, shown the pytest way: a live line on a terminal, throttled plain
lines in a CI log, nothing with ``--longctx-progress=off``; ``progress.json`` in the run folder
at every sample, the ETA before each point and in the summary.

Everything shown is rendered from a :class:`~pytest_longctx.progress.state.ProgressState`, so
where a session cannot print (a pytest-xdist worker) the state still goes to the file, and
whoever reads the file can print it. Lines are written through the terminal reporter with
pytest's capture suspended (``global_and_fixture_disabled``), from the sampler's thread while
the point's request is in flight: the test's own thread is then inside the client and writes
nothing, and the thread is joined before the item goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pytest_longctx.campaign.run import Run
from pytest_longctx.campaign.server import device_scope
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.progress.eta import CostModel, format_duration
from pytest_longctx.progress.sampler import Outlook, PointWatch
from pytest_longctx.progress.samples import samples_path
from pytest_longctx.progress.state import (
    BETWEEN,
    DECODE,
    FINISHED,
    PREFILL,
    PROGRESS_FILE,
    ProgressState,
    RemainingPoint,
    combined_state,
    read_worker_states,
    upcoming_line,
    write_progress_file,
)
from pytest_longctx.progress.telemetry import DeviceTelemetry
from pytest_longctx.serving.process import control_client
from pytest_longctx.workloads import workload_of

PREFIX = "longctx"
#: The display modes once ``auto`` is resolved; ``file`` only writes progress.json.
LINE, PLAIN, OFF, FILE = "line", "plain", "off", "file"


class Display:
    """Shows states on the session's terminal; called from the sampler's thread."""

    def __init__(self, config: pytest.Config, mode: str, throttle_s: float) -> None:
        self.config = config
        self.mode = mode
        self.throttle_s = throttle_s
        self._lock = threading.Lock()
        self._line_open = False
        self._last_plain = 0.0

    @contextlib.contextmanager
    def _terminal(self) -> Iterator[Any]:
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        capture = self.config.pluginmanager.getplugin("capturemanager")
        if reporter is None:
            yield None
            return
        suspended = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with self._lock, suspended:
            yield reporter

    def _width(self, reporter: Any) -> int:
        writer = getattr(reporter, "_tw", None)
        return max(20, int(getattr(writer, "fullwidth", 80)) - 1)

    def upcoming(self, state: ProgressState) -> None:
        """Before a point: said in plain mode (a live line says it as it goes)."""
        self._last_plain = time.monotonic()
        if self.mode == PLAIN:
            self._plain(upcoming_line(state))

    def show(self, state: ProgressState) -> None:
        self._show(state.line)

    def show_text(self, text: str) -> None:
        """A line made elsewhere (the xdist controller's merge of its workers' states)."""
        self._show(
            lambda width=None: (
                text if width is None or len(text) <= width else text[: max(0, width - 1)] + "…"
            )
        )

    def _show(self, render: Any) -> None:
        """``render(width)`` rewritten in place on a terminal; a plain line when due."""
        if self.mode == LINE:
            with self._terminal() as reporter:
                if reporter is None:
                    return
                if not self._line_open:
                    reporter.ensure_newline()
                    self._line_open = True
                reporter.rewrite(render(self._width(reporter)), erase=True)
                reporter.flush()
        elif self.mode == PLAIN:
            now = time.monotonic()
            if now - self._last_plain >= self.throttle_s:
                self._last_plain = now
                self._plain(render())

    def _plain(self, text: str) -> None:
        with self._terminal() as reporter:
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_line(text)
                reporter.flush()

    def point_finished(self) -> None:
        """Clear the live line, leaving the cursor where pytest's own output continues."""
        if self.mode != LINE or not self._line_open:
            return
        with self._terminal() as reporter:
            self._line_open = False
            if reporter is not None:
                reporter.rewrite("", erase=True)
                reporter.write("\r")
                reporter.flush()


def _is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("localhost", "::1") or host.startswith("127.")


def _resolve_mode(config: pytest.Config, mode: str) -> str:
    if hasattr(config, "workerinput"):
        return FILE  # a pytest-xdist worker: the controller prints
    if mode != "auto":
        return mode
    reporter = config.pluginmanager.getplugin("terminalreporter")
    tty = getattr(reporter, "isatty", False)
    tty = tty() if callable(tty) else tty
    return LINE if tty and os.environ.get("TERM") != "dumb" else PLAIN


class SessionProgress:
    """One session's progress: the model, the device tool, the display, the file."""

    def __init__(self, config: pytest.Config, run: Run) -> None:
        settings = run.settings
        self.config = config
        self.run = run
        self.mode = _resolve_mode(config, settings.progress)
        self.display = Display(config, self.mode, settings.progress_throttle_s)
        self.interval_s = settings.progress_interval_s or None
        self._telemetry: DeviceTelemetry | None = None
        self.started = time.monotonic()
        self.last_model: CostModel | None = None
        self.problems: list[str] = []

    @property
    def telemetry(self) -> DeviceTelemetry | None:
        """This host's device tool; none when sampling is off or the server is elsewhere."""
        if self.interval_s is None:
            return None
        if self._telemetry is None:
            slot = getattr(self.run, "slot", None)  # a worker's own endpoint under xdist
            url = (slot.endpoint if slot is not None else None) or self.run.settings.url
            if url is not None and not _is_local(url):
                why = f"the server ({url}) is not on this host, whose devices would be read"
                self._telemetry = DeviceTelemetry(tool=None, missing=why)
            else:
                self._telemetry = DeviceTelemetry.detect(device_scope(self.run.description))
        return self._telemetry

    def describe_telemetry(self) -> dict[str, Any]:
        if self.telemetry is None:
            return {
                "tool": None,
                "missing": "progress sampling off (--longctx-progress-interval=0)",
            }
        return self.telemetry.describe()

    # -- the points --------------------------------------------------------------------------

    def _todo(self) -> list[Point]:
        written = self.run.results.written
        if self.run.worker is not None:  # the campaign's: every worker appends to the file
            since = self.run.started_at or 0.0
            written = [r for r in self.run.results.all_records() if (r.finished_at or 0) >= since]
        done = {Point.of_record(r) for r in written} | set(self.run.results.resumed)
        return [point for point in self.run.selected_points if point not in done]

    def outlook(self, point: Point) -> Outlook:
        run = self.run
        model = CostModel.fit(run.results.all_records(), run.plan.decode_tokens)
        self.last_model = model
        measured = [p for p in run.selected_points if p not in run.results.resumed]
        index = measured.index(point) + 1 if point in measured else len(measured) + 1
        remaining = tuple(
            RemainingPoint(p.length, p.repeat, point_cost(model, p))
            for p in self._todo()
            if p != point
        )
        return Outlook(run.run_id, index, max(len(measured), index), model, remaining)

    def watch(self, server: ServerInfo, point: Point) -> PointWatch:
        interval = self.interval_s
        # Its own connection, with a timeout that never holds the point up for long.
        client = (
            control_client(server.base_url, server.api_key, timeout_s=max(5.0, interval))
            if interval is not None
            else None
        )
        watch = _SessionWatch(
            self,
            client=client,
            length=point.length,
            repeat=point.repeat,
            question=point.question,
            background=point.background,
            decode_tokens=self.run.plan.decode_tokens,
            interval_s=interval,
            outlook=self.outlook(point),
            read_metrics=client.metrics_text if client is not None else None,
            telemetry=self.telemetry,
            publish=self.publish,
            samples_path=samples_path(self.run.run_dir, point.id) if interval else None,
            tokens_for_blocks=self._tokens_for_blocks(server),
        )
        state = watch.state()
        self.run.results.open()
        self._write(state)
        self.display.upcoming(state)
        return watch

    def _tokens_for_blocks(self, server: ServerInfo) -> Any:
        """For a launched model of several KV-cache groups (windows, state), the plan's
        allocator turns the blocks the gauge counts into prompt tokens; None otherwise."""
        if server.mode != "launched":
            return None
        from pytest_longctx.plan import capacity_check

        try:
            layout = capacity_check.layout_for(self.run.plan.profile)
        except ValueError:
            return None
        if layout is None or layout.allocation is None or len(layout.allocation.groups) < 2:
            return None
        layouts: dict[int, Any] = {}

        def tokens(used_blocks: int, block_size: int) -> int:
            if block_size not in layouts:
                layouts[block_size] = layout.with_changes(block_size=block_size).allocation
            return layouts[block_size].tokens_for_blocks(used_blocks)

        return tokens

    def publish(self, state: ProgressState) -> None:
        self._write(state)
        self.display.show(state)

    def _write(self, state: ProgressState) -> None:
        try:
            write_progress_file(self.run.run_dir, state, worker=self.run.worker)
        except OSError as exc:
            problem = f"progress.json not written: {exc}"
            if problem not in self.problems:
                self.problems.append(problem)

    def point_finished(self, watch: PointWatch) -> None:
        self.display.point_finished()
        for problem in watch.problems:
            if problem not in self.problems:
                self.problems.append(problem)
        remaining = watch.outlook.remaining
        self._write(
            ProgressState(
                run_id=self.run.run_id,
                phase=BETWEEN,
                remaining=remaining,
                sweep_eta_s=watch.outlook.remaining_cost_s,
            )
        )

    def finish(self) -> None:
        """The session is over: the file says so, with what is left unmeasured."""
        if not self.run.run_dir.is_dir() or self.run.settings.plan_only:
            return
        model = CostModel.fit(self.run.results.all_records(), self.run.plan.decode_tokens)
        left = tuple(RemainingPoint(p.length, p.repeat, point_cost(model, p)) for p in self._todo())
        costs = [point.predicted_s for point in left if point.predicted_s is not None]
        eta = sum(costs) if len(costs) == len(left) else None
        self._write(ProgressState(self.run.run_id, FINISHED, remaining=left, sweep_eta_s=eta))

    # -- the summary -------------------------------------------------------------------------

    def summary_lines(self) -> list[str]:
        run = self.run
        records = [r for r in run.results.written if r.outcome != "interrupted"]
        if not records and not self._todo():
            return []
        lines = []
        model = CostModel.fit(run.results.all_records(), run.plan.decode_tokens)
        if model.ttft is not None:
            lines.append(f"ETA model: {model.ttft.describe()}")
        compared = _predicted_vs_measured(records)
        if compared:
            lines.append("predicted vs measured TTFT: " + "; ".join(compared))
        left = self._todo()
        took = format_duration(time.monotonic() - self.started)
        if left:
            eta = model.sweep_cost(p.length for p in left)
            one = len(left) == 1
            lines.append(
                f"sweep: {len(left)} selected point{'' if one else 's'} not measured, "
                f"~{format_duration(eta)} to measure {'it' if one else 'them'} "
                f"(session took {took})"
            )
        else:
            lines.append(f"sweep: every selected point measured (session took {took})")
        lines.append(energy_line(records, self.describe_telemetry()))
        lines.extend(self.problems)
        return lines


def _predicted_vs_measured(records: list[Record]) -> list[str]:
    parts = []
    for record in records:
        predicted, measured = record.figures.get("predicted_ttft"), record.figures.get("ttft")
        if predicted is None or measured is None or record.outcome != "passed":
            continue
        error = (predicted - measured) / measured * 100 if measured else 0.0
        parts.append(
            f"{format_size(record.length)} rep {record.repeat} {format_duration(predicted)} vs "
            f"{format_duration(measured)} ({error:+.0f}%)"
        )
    return parts


def energy_line(records: list[Record], telemetry: dict[str, Any]) -> str:
    """The summary's energy line: the total and the longest point's figures, what share of a
    server's GPUs they cover, and how many points have no energy measured, with why."""
    with_energy = [r for r in records if r.figures.get("energy") is not None]
    covers = f" [{telemetry['coverage']}]" if telemetry.get("coverage") else ""
    unmeasured = [r for r in records if (r.energy.get("not_measured") or {}).get("energy")]
    if unmeasured:
        first = unmeasured[0].energy["not_measured"]
        why = first.get("prefill_energy") or first.get("decode_energy") or first["energy"]
        covers += f"; {len(unmeasured)} point(s) without energy, e.g. {why}"
    if not with_energy:
        why = telemetry.get("missing") or "no device reported power"
        if unmeasured:
            return f"energy: not measured{covers}"
        return f"energy: not measured ({why})"
    total = sum(r.figures["energy"] for r in with_energy)
    longest = max(with_energy, key=lambda r: r.length)
    per_prompt = longest.figures.get("energy_per_prompt_token")
    per_token = longest.figures.get("energy_per_generated_token")
    detail = f"; {format_size(longest.length)}: {longest.figures['energy']:,.1f} J"
    if per_prompt is not None:
        detail += f", {per_prompt:.3g} J/prompt token"
    if per_token is not None:
        detail += f", {per_token:.3g} J/generated token"
    return (
        f"energy: {total:,.1f} J over {len(with_energy)} points ({telemetry.get('tool')})"
        f"{detail}{covers}"
    )


def point_cost(model: CostModel, point: Point) -> float | None:
    """A cold point's cost at its length; a warm one's prefills only its suffix; an
    interference one's adds its idle reference."""
    workload = workload_of(point)
    cost = model.point_cost(workload.progress_tokens(point))
    return None if cost is None else cost + workload.extra_seconds()


class _SessionWatch(PointWatch):
    """A point's watch that tells the session when it stops and closes its HTTP client."""

    def __init__(self, session: SessionProgress, client: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._session = session
        self._client = client

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._client is not None:
                self._client.close()
            self._session.point_finished(self)


class ControllerProgress:
    """Under pytest-xdist: the controller prints what its workers write, and merges it.

    Workers cannot print (xdist captures them); each writes ``progress-gwN.json``. The
    controller reads those about once an interval, writes the run's ``progress.json`` (the
    serial file's fields plus every server's state) and shows one line per refresh.
    """

    def __init__(self, progress: SessionProgress, servers: int) -> None:
        self.progress = progress
        self.servers = servers
        self.interval_s = progress.interval_s or 1.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="longctx-progress", daemon=True)
        self._shown: dict[str, float] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.tick()
        self.progress.display.point_finished()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # progress must never break the run
                self.tick()

    def tick(self) -> None:
        run = self.progress.run
        states = read_worker_states(run.run_dir)
        if not states:
            return
        fresh = {w: s for w, s in states.items() if s.updated_at > self._shown.get(w, 0.0)}
        if not fresh:
            return
        self._shown.update({w: s.updated_at for w, s in fresh.items()})
        data = combined_state(run.run_id, states, self.servers)
        with contextlib.suppress(OSError):
            write_atomically(run.run_dir / PROGRESS_FILE, json.dumps(data, indent=2) + "\n")
        active = {w: s for w, s in states.items() if s.phase in (PREFILL, DECODE)}
        shown = active or states
        text = " || ".join(
            f"{worker}: " + " | ".join(p for p in state.parts()[:-1] if p)
            for worker, state in sorted(shown.items())
        )
        eta = data.get("sweep_eta_s")
        text = f"longctx {text} || sweep ~{format_duration(eta)} left"
        self.progress.display.show_text(text)


# -- what the rest of the session calls ------------------------------------------------------


def watch(progress: SessionProgress | None, server: ServerInfo, point: Point) -> PointWatch | None:
    """The watch for one point's measurement (None without progress: ``--longctx-plan``)."""
    return progress.watch(server, point) if progress is not None else None


# -- what the sweep session calls at its start, for the fingerprint and at its end -----------


def start(
    config: pytest.Config, run: Run, controller: bool
) -> tuple[SessionProgress | None, ControllerProgress | None]:
    """Progress for an active sweep and, on an xdist controller, the follower of its workers."""
    if run.settings.plan_only:
        return None, None
    progress = SessionProgress(config, run)
    if not controller:
        return progress, None
    follower = ControllerProgress(progress, len(run.servers))
    follower.start()
    return progress, follower


def add_to_fingerprint(progress: SessionProgress | None, fingerprint: dict[str, Any]) -> None:
    if progress is not None:
        fingerprint["device_telemetry"] = progress.describe_telemetry()


def finish(progress: SessionProgress | None, follower: ControllerProgress | None) -> None:
    if follower is not None:
        follower.stop()
        return  # the workers wrote their own final states; progress.json merges them
    if progress is not None and (progress.run.results.written or progress.run.results.resumed):
        progress.finish()


def summary(terminalreporter: Any, progress: SessionProgress | None) -> None:
    if progress is None or progress.mode in (OFF, FILE):
        return
    for line in progress.summary_lines():
        terminalreporter.write_line(f"pytest-{PREFIX} progress: {line}")
