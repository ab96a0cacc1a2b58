"""The seam every workload sits behind (as pytest-xdist's schedulers sit behind one protocol):
what its points are called and marked, which server it needs and what that server must allow,
how the session sets up one of its points, and its measurement, with one signature for all.

The session, the campaign and the reports ask a point's :class:`Workload` (``workload_of``
in this package) instead of testing what kind of point it is. The defaults are a point alone
on the study's server; each workload's home overrides what it does differently.

The plan's parts of a workload (its points, sizing, capacity) are asked in every session,
sweep or not: the homes import what measures (the HTTP client, numpy) only where they
measure, so a session without a sweep loads none of it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.records import Record
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import (
    BACKGROUND_DECODE_TOKENS,
    BACKGROUND_PROMPT_TOKENS,
    COLD,
    Point,
    SweepPlan,
)
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.prompts import Prompt, PromptBuilder

if TYPE_CHECKING:  # what measures: imported where a point is measured
    from pytest_longctx.client import CompletionClient, RequestRejectedError
    from pytest_longctx.measure.background import BackgroundSpec
    from pytest_longctx.measure.measurement import PointMeasurement, PointSettings

#: The study's one-sequence server: the cold and warm points'. Other workloads run on one of
#: their own, named for them.
STUDY_SERVER = COLD


@dataclass
class ServerMemory:
    """What the server measured now holds of this session's prompts, and what it showed the
    session: kept by :class:`lifecycle.ServerLifecycle`, a new one for each server start (a
    server started again, or an attached one that stopped answering, holds none of it)."""

    #: When this server last computed each cold point's prompt (monotonic clock): the
    #: prefix its warm follow-ups find cached.
    prefix_sent: dict[Point, float] = field(default_factory=dict)
    #: What this server showed each workload that asks it something once per start (the
    #: interference points: its sequence limit and effective chunk; the concurrency points: its
    #: cache's blocks and, attached, its sequence limit), by the workload's name.
    shown: dict[str, dict[str, Any]] = field(default_factory=dict)

    def note_sent(self, point: Point) -> None:
        """This server has just computed ``point``'s prompt."""
        self.prefix_sent[point] = time.monotonic()

    def shown_to(self, workload: str, find: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What this server shows ``workload``'s points: ``find()`` the first time."""
        if workload not in self.shown:
            self.shown[workload] = find()
        return self.shown[workload]


@dataclass(frozen=True)
class PointSetup:
    """What the session decides for one point before it is measured
    (:func:`point_setup.prepare`): the measurement's settings, and the run's words a
    background needs (its nonces' key, its streams, how its stream is judged)."""

    settings: PointSettings
    run_id: str
    background_streams: int
    stream_tolerance: float
    keep_disagreeing: bool
    #: Keep and gate the background figures of a point whose gaps are refuted
    #: (--longctx-allow-unconfirmed).
    keep_unconfirmed: bool
    tcp_keepalive_s: float
    #: What the point's workload decides beyond these, once per point (a concurrency level's
    #: setup; None for the others).
    own: Any = None


@dataclass(frozen=True)
class PointStep:
    """One measurement of a point, whatever its workload: the client and server, the point and
    its prompt, its setup, the builder of any prompts of its own (background streams, a
    level's), what the server holds of this session (``memory``), the ``watch`` of its
    progress, the server's liveness check and 401/403 wording, and the session's ``levels``
    measured so far (the concurrency workload's)."""

    client: CompletionClient
    server: ServerInfo
    point: Point
    prompt: Prompt
    setup: PointSetup
    builder: PromptBuilder
    memory: ServerMemory
    watch: Any
    check_alive: Callable[[float], None]
    refusal: Callable[[RequestRejectedError], str]
    levels: Any = None

    @property
    def hooks(self) -> dict[str, Any]:
        """The callbacks the measure layer takes by keyword."""
        return {"check_alive": self.check_alive, "refusal": self.refusal, "watch": self.watch}


@dataclass(frozen=True)
class ServerNeeds:
    """What a workload asks of the server it runs on, beyond the profile's flags."""

    #: Sequences it runs at once (None: the profile's --max-num-seqs as it is).
    room: int | None = None
    #: Usage that says what the prefix cache served (``prompt_tokens_details``).
    usage_details: bool = False
    #: The scheduler's chunk asked for (--max-num-batched-tokens; None: the profile's).
    max_num_batched_tokens: int | None = None
    #: The scheduler's config readable (``/server_info``).
    server_info: bool = False


Plot = Callable[[Sequence[Record], Path], "Path | None"]


@dataclass(frozen=True)
class ReportSection:
    """One workload's part of every report, a plain object the report shell iterates: each
    renderer reads the records and says nothing where the workload has none."""

    #: The terminal summary's title above its table.
    title: str
    markdown_lines: Callable[[Sequence[Record]], list[str]]
    html_fragment: Callable[[Sequence[Record]], str]
    terminal_table: Callable[[Sequence[Record]], str | None]
    plots: tuple[Plot, ...]


class Workload:
    """One workload's behaviour at every step of a point's path. Subclasses set the class
    attributes and override what differs from a point measured alone."""

    #: The ``--longctx-workload`` word and the records' ``cache_state``.
    name: ClassVar[str] = COLD
    #: The server its points run on: the study's one-sequence server (``cold``) or one of its
    #: own, named for it.
    server: ClassVar[str] = STUDY_SERVER
    #: Its points' pytest mark, beside ``longctx`` (None: none).
    mark: ClassVar[str | None] = None
    #: What ``pytest --markers`` says of that mark.
    mark_help: ClassVar[str] = ""
    #: Under pytest-xdist, a worker measures its points after every point of a lower rank, so
    #: each server is started once.
    schedule_rank: ClassVar[int] = 0
    #: Whether the progress of its one measured request is sampled (a level's c requests are
    #: not watched one by one).
    watched: ClassVar[bool] = True
    #: Whether its TTFT grows the next points' first-token budgets (a follow-up's, served
    #: from the cache, would shrink nothing and proves nothing of a prefill).
    grows_ttft_budget: ClassVar[bool] = True
    #: Whether the capacity plan checks its points beside the background they carry.
    checked_under_load: ClassVar[bool] = False
    #: Its record's own section, filled from the measurement (``Record.<key>``).
    record_section: ClassVar[str | None] = None
    #: Its own part of every report (None: the summary, which every report opens with, is
    #: all it has).
    report: ClassVar[ReportSection | None] = None
    #: What the gate compares of its points with the baseline's points of the same workload.
    gate_metrics: ClassVar[tuple[Metric, ...]] = ()

    # -- the plan and the items ---------------------------------------------------------------

    def planned(self, plan: SweepPlan) -> bool:
        """Whether ``plan`` measures this workload."""
        return self.name in plan.workloads

    def points(self, plan: SweepPlan, passes: Sequence[Point]) -> tuple[Point, ...]:
        """Its points of each (length, repeat) of ``passes`` (the plan's order). The run
        measures them after every point of a lower :attr:`schedule_rank`, each right after
        the point of its pass (a follow-up after its cold point). Each point says its
        workload (``Point.workload``)."""
        return tuple(dataclasses.replace(point, workload=self.name) for point in passes)

    def fitted(self, plan: SweepPlan) -> SweepPlan:
        """``plan`` with what the capacity plan decides for this workload's points (the
        concurrency levels' fits)."""
        return plan

    def sized_for(self, plan: SweepPlan, selected: Sequence[Point]) -> SweepPlan:
        """What the server must hold for the ``selected`` points, as far as this workload
        decides (a follow-up's suffix only where a follow-up is selected). For sizing only."""
        return plan

    def capacity_lines(self, plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
        """Its own table in the capacity plan, after the study's."""
        return []

    def launch_refusal(self, plan: SweepPlan) -> str | None:
        """Why its points cannot be measured on the server the profile launches, known
        before it starts (None: they can, or the server's own report decides)."""
        return None

    def mark_kwargs(self, point: Point) -> dict[str, int]:
        """What its points' ``longctx`` mark carries beyond length and repeat (a follow-up's
        question, a level's requests at once)."""
        return {}

    def identity(self, point: Point) -> dict[str, Any]:
        """The record's fields beyond length, repeat and cache state that say which point."""
        return {"cache": {}}

    def measured_identity(
        self, identity: dict[str, Any], measurement: PointMeasurement
    ) -> dict[str, Any]:
        """``identity`` with what the measurement found (the cache's figures, and this
        workload's own record section)."""
        found = {**identity, "cache": {**identity["cache"], **measurement.cache}}
        if self.record_section is not None:
            key = self.record_section
            found[key] = {**identity[key], **getattr(measurement, key)}
        return found

    def record_words(self, record: Record) -> str:
        """What follows a record's repeat in the reports' words (its question, its load)."""
        return ""

    def reuses(self, point: Point) -> Point | None:
        """The point whose prompt this one's opens with, measured before it (None: its own)."""
        return None

    def plan_lines(self, run: RunDescription, sized: SweepPlan) -> list[str]:
        """What ``--longctx-plan`` says of this workload."""
        return []

    def header_words(self, plan: SweepPlan) -> str:
        """What pytest's header adds after the workload's name."""
        return ""

    def fingerprint(self, run: RunDescription) -> dict[str, Any]:
        """The run's fingerprint's words of this workload (compared run to run)."""
        return {}

    # -- its server -------------------------------------------------------------------------

    def server_needs(self, run: RunDescription, sized: SweepPlan) -> ServerNeeds:
        """What its points ask of their server (``sized``: the plan sized for the selection)."""
        return ServerNeeds()

    def server_words(self, run: RunDescription) -> str:
        """Why its server is started (the switch's cause, the plan's words)."""
        return "the study's server again"

    # -- a point ------------------------------------------------------------------------------

    def requests(self, point: Point) -> int:
        """Prompts of the point's length sent at once (what its first-token budget covers)."""
        return 1

    def progress_tokens(self, point: Point) -> int:
        """The prompt tokens it prefills (the live progress's cost model)."""
        return point.length

    def extra_seconds(self) -> float:
        """Seconds its point spends besides its request (the live progress's estimate)."""
        return 0.0

    def settings(
        self, run: RunDescription, server: ServerInfo, point: Point, settings: PointSettings
    ) -> PointSettings:
        """The measurement's settings for one of its points: a point alone has its stream
        judged against the server's decode."""
        return dataclasses.replace(
            settings,
            stream_tolerance=run.settings.stream_tolerance,
            strict_stream=run.settings.strict_stream,
        )

    def own_setup(self, run: RunDescription, selected: Sequence[Point]) -> Any:
        """What it decides for a point beyond the common setup (``PointSetup.own``)."""
        return None

    def prompt(
        self,
        run: RunDescription,
        builder: PromptBuilder,
        point: Point,
        nonce: Sequence[int],
        build: Callable[[RunDescription, PromptBuilder, Point], Prompt],
    ) -> Prompt | None:
        """The point's prompt where it is not its own exact-length prompt (a follow-up's:
        ``build`` makes the one it reuses); None: its own."""
        return None

    def measure(self, step: PointStep) -> PointMeasurement:
        """One point on its server."""
        raise NotImplementedError


def background_spec(step: PointStep, streams: int) -> BackgroundSpec:
    """Background streams beside ``step``'s point: short prompts of the served model's text,
    each request opening with a nonce of its own (drawn under a key of this run and point, so
    no background prompt shares a first block with a measured one)."""
    from pytest_longctx.measure.background import BackgroundSpec

    setup, builder, server, point = step.setup, step.builder, step.server, step.point
    run_id = setup.run_id
    base = builder.build(
        BACKGROUND_PROMPT_TOKENS,
        f"Background request beside {point.id} of run {run_id}.",
        nonce=builder.nonce(f"{run_id}:background", 0),
    )
    return BackgroundSpec(
        base_url=server.base_url,
        model=server.model_name,
        streams=streams,
        prompt_ids=tuple(base.ids),
        nonce_pool=builder.nonce_pool(),
        nonce_key=f"{run_id}:background:{point.id}",
        decode_tokens=BACKGROUND_DECODE_TOKENS,
        api_key=server.api_key,
        tcp_keepalive_s=setup.tcp_keepalive_s,
    )
