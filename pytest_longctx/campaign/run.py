"""One session's run: its id and folder, the plan, and the records it has written."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_longctx.core.file_names import LATEST, RESULTS_FILE, server_file_stem
from pytest_longctx.core.files import exclusive_lock
from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.gate import GateState
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.run_description import Placement, RunDescription
from pytest_longctx.plan.servers import ServerSlot
from pytest_longctx.plan.settings import Settings

if TYPE_CHECKING:  # annotations only: a run is made before any of these is needed
    from pytest_longctx.campaign.signals import SessionSignals
    from pytest_longctx.plan.capacity_check import ServerCapacityCheck
    from pytest_longctx.prompts import ProbeLesson
    from pytest_longctx.serving.model_description import ModelDescription


class ResumeError(ValueError):
    pass


def new_run_id() -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def resolve_resume(output_root: Path, resume: str) -> Path:
    """``latest`` or a run id -> that run's folder, which must hold a results file."""
    run_dir = output_root / (LATEST if resume == "latest" else resume)
    if not (run_dir / RESULTS_FILE).exists():
        raise ResumeError(
            f"--longctx-resume={resume}: no run with results at {run_dir}; expected "
            f"'latest' or a run id under {output_root}"
        )
    return run_dir.resolve()


def end_last_line(path: Path) -> None:
    """End a half-written last line (a crash mid-write) so the next record gets its own line.

    Appended to directly, the next record would join the half line and be lost with it. The
    half line itself stays as it is: readers report and skip it, nothing rewrites it away.
    """
    with contextlib.suppress(FileNotFoundError), open(path, "rb+") as handle:
        if handle.seek(0, os.SEEK_END) == 0:
            return
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) != b"\n":
            handle.write(b"\n")


@dataclass
class RecordLog:
    """The run's results file as this session sees it: the passed records it resumed from,
    and the records it appended (only the recorder and, under pytest-xdist, the controller
    append)."""

    output_root: Path
    run_dir: Path
    #: Passed records of a resumed run, by point: reported, not measured again.
    resumed: dict[Point, Record] = field(default_factory=dict)
    #: The records this session appended, in order.
    written: list[Record] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.run_dir / RESULTS_FILE

    def read_resumed(self, records: list[Record] | None = None) -> None:
        """The passed points of the file as it stands (or of ``records`` read from it)."""
        if records is None:
            records = list(read_records(self.path).records)
        for record in records:
            point = Point.of_record(record)
            if record.outcome == "passed":
                self.resumed[point] = record
            else:
                self.resumed.pop(point, None)  # re-measured later wins over earlier pass

    def measure_again(self, point: Point) -> None:
        """A resumed passed point is measured again: its new record will answer for it."""
        del self.resumed[point]

    def open(self) -> None:
        """Create the folder and point ``latest`` at it; only once there is something to keep."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        latest = self.output_root / LATEST
        with contextlib.suppress(OSError):
            tmp = self.output_root / f".{LATEST}.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            tmp.symlink_to(self.run_dir.name)
            os.replace(tmp, latest)

    def append(self, record: Record) -> None:
        """Append under a lock: several workers of one campaign share the results file."""
        self.open()
        with exclusive_lock(self.run_dir / ".results.lock"):
            end_last_line(self.path)
            append_record(self.path, record)
        self.written.append(record)

    def all_records(self) -> list[Record]:
        """What reports show: the resumed run's file as it stands, corrupt lines skipped."""
        if not self.path.exists():
            return []
        return list(read_records(self.path).records)


@dataclass(frozen=True)
class Sizing:
    """What a launched server is sized for, read when its command is built: the points
    selected, the lengths its ``--max-model-len`` holds (those neither the capacity plan nor
    vLLM refused) and the run's records so far (the TTFT model that plans vLLM's step limit
    is fitted to them). See :meth:`Run.sizing`."""

    points: tuple[Point, ...] = ()
    lengths: tuple[int, ...] = ()
    records: tuple[Record, ...] = ()


@dataclass
class Findings:
    """What the session learns of the server it measures, for the records and the summary:
    the problems it shows, the fingerprint, the capacity plan against it, the model as it
    describes it and whether that model answers the probe. Written by the server's lifecycle
    alone (lifecycle.py, the warm-up's lesson included)."""

    problems: list[str] = field(default_factory=list)
    #: What was measured (server.py's ``fingerprint``); each record carries it.
    fingerprint: dict[str, Any] = field(default_factory=dict)
    #: The capacity plan against the launched server's own report (plan/capacity_check.py).
    capacity_check: ServerCapacityCheck | None = None
    #: The measured model as the server describes it (serving/model_description.py), once known.
    model: ModelDescription | None = None
    #: Whether the served model answers the fidelity probe, as the warm-ups showed it
    #: (warm_up.py); None before them, or when the prompts carry no probe.
    probe: ProbeLesson | None = None

    def add_problems(self, problems: Iterable[str]) -> None:
        """Add what is not said already: a relaunched server is checked again, and its
        findings are the same ones."""
        for problem in problems:
            if problem not in self.problems:
                self.problems.append(problem)


@dataclass
class SweepProgress:
    """The sweep as it runs: the item being measured, the TTFT seen so far and the signals
    that stop it. Written by the recorder and the sweep session."""

    #: The sweep item being run: (nodeid, point, unix start), recorded as interrupted if the
    #: session is stopped before it reports.
    in_flight: tuple[str, Point, float] | None = None
    #: Client TTFT of points measured so far, by length, to size the next first-token budget.
    measured_ttft: dict[int, float] = field(default_factory=dict)
    #: SIGTERM/SIGHUP turned into Ctrl-C for this session (signals.py).
    signals: SessionSignals | None = None


@dataclass
class ReportState:
    """What the reports need beyond the records: the gate's baseline (gate_items.py), the
    plots written (outputs.py) and the problems found before any server (the resumed file's
    unreadable lines, the baseline's, an empty selection: items.py)."""

    #: The baseline and tolerances, with --longctx-baseline (see gate_items.py).
    gate: GateState | None = None
    plot_paths: list[Path] = field(default_factory=list)
    #: Said in the summary, before what the server showed (:attr:`Findings.problems`).
    problems: list[str] = field(default_factory=list)


@dataclass
class Run:
    """A session's run, by owner: what it is (:class:`RunDescription`), fixed at creation;
    its results file (:class:`RecordLog`); what it learns of its server (:class:`Findings`,
    the lifecycle's to write); the sweep as it runs (:class:`SweepProgress`); what the
    reports need (:class:`ReportState`); the points selected. The server's own state is
    :class:`lifecycle.ServerLifecycle`'s."""

    description: RunDescription
    #: This run's results file: the records resumed from it and those this session wrote.
    results: RecordLog
    findings: Findings = field(default_factory=Findings)
    sweep: SweepProgress = field(default_factory=SweepProgress)
    reports: ReportState = field(default_factory=ReportState)
    #: The points left after ``-m``/``-k``, in run order.
    selected_points: list[Point] = field(default_factory=list)
    #: Selected lengths the capacity plan says cannot fit: skipped, and left out of
    #: ``--max-model-len`` (items.py).
    unfit_lengths: set[int] = field(default_factory=set)

    @classmethod
    def create(
        cls,
        settings: Settings,
        plan: SweepPlan,
        rootdir: Path,
        controller_run: tuple[str, bool] | None = None,
        placement: Placement | None = None,
    ) -> Run:
        """A new or resumed run; on a pytest-xdist worker, the controller's (id, resumed)."""
        output_root = (
            settings.output if settings.output.is_absolute() else rootdir / settings.output
        )

        def new(run_id: str, run_dir: Path, problems: list[str] | None = None) -> Run:
            description = RunDescription(
                settings, plan, output_root, run_id, run_dir, placement or Placement()
            )
            reports = ReportState(problems=problems or [])
            return cls(description, RecordLog(output_root, run_dir), reports=reports)

        if controller_run is not None:
            run_id, resumed = controller_run
            run = new(run_id, output_root / run_id)
            if resumed and run.results.path.exists():
                run.results.read_resumed()
            return run
        if settings.resume:
            run_dir = resolve_resume(output_root, settings.resume)
            previous = read_records(run_dir / RESULTS_FILE)
            run = new(run_dir.name, run_dir, list(previous.problems))
            profiles = {
                str(name) for r in previous.records if (name := r.fingerprint.get("profile"))
            }
            if profiles and profiles != {plan.profile.name}:
                raise ResumeError(
                    f"--longctx-resume={settings.resume}: run {run_dir.name} measured profile "
                    f"{', '.join(sorted(profiles))}; this session selects {plan.profile.name}. "
                    "Resume with the same --longctx-profile, or start a new run"
                )
            run.results.read_resumed(list(previous.records))
            return run
        run_id = new_run_id()
        return new(run_id, output_root / run_id)

    def sizing(self, refused: Iterable[int] = ()) -> Sizing:
        """What a launched server is sized for now; ``refused``: lengths vLLM refused at its
        start, left out with those the capacity plan left out."""
        lengths = {p.length for p in self.selected_points} - self.unfit_lengths - set(refused)
        return Sizing(
            tuple(self.selected_points),
            tuple(sorted(lengths)),
            tuple(self.results.all_records()),
        )

    @property
    def settings(self) -> Settings:
        return self.description.settings

    @property
    def plan(self) -> SweepPlan:
        return self.description.plan

    @property
    def output_root(self) -> Path:
        return self.description.output_root

    @property
    def run_id(self) -> str:
        return self.description.run_id

    @property
    def run_dir(self) -> Path:
        return self.description.run_dir

    @property
    def placement(self) -> Placement:
        return self.description.placement

    @property
    def servers(self) -> tuple[ServerSlot, ...]:
        return self.placement.servers

    @property
    def slot(self) -> ServerSlot:
        return self.placement.slot

    @property
    def worker(self) -> str | None:
        return self.placement.worker

    @property
    def split_error(self) -> str | None:
        return self.placement.split_error

    @property
    def started_at(self) -> float | None:
        return self.placement.started_at

    @property
    def server_name(self) -> str:
        """``server`` in a serial session, ``server-gw1`` for a worker's: its log and files."""
        return server_file_stem(self.worker)
