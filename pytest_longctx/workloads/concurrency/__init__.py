"""The concurrency workload: each level's c prompts of one length sent at once, the fit of the
server that serves them, the probe of an attached server, and the length's verdict so far.

A launched server is started for these points with room for the highest level
(``--max-num-seqs``, :class:`ConcurrencyWorkload`'s server needs). An attached server
serves with its own limits: it is probed once per start with the highest level selected
(short requests sent at once, the scheduler's gauges watched, as the interference points
probe theirs) and a level it cannot run at once is refused with the reason, never measured as
a fit it did not test. What a server showed is kept with what it holds of this session
(:class:`workload.ServerMemory`, a new one per start); the levels measured so far, which
outlive a server start, by this module's :class:`LevelsMeasured`, one per session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_longctx.capacity import fit_verdict
from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.records import Record
from pytest_longctx.measure.agreement import STRICT_OPTION
from pytest_longctx.measure.server_metrics import cache_config_labels
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import CONCURRENCY, CONCURRENCY_MARK, Point, SweepPlan
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.prompts import Prompt
from pytest_longctx.workloads.concurrency import concurrency_report
from pytest_longctx.workloads.workload import (
    PointStep,
    ReportSection,
    ServerNeeds,
    Workload,
    background_spec,
)

if TYPE_CHECKING:  # what measures: imported where a level is measured
    from pytest_longctx.client import CompletionClient
    from pytest_longctx.measure.background import BackgroundSpec
    from pytest_longctx.measure.measurement import PointMeasurement


@dataclass(frozen=True)
class LevelSetup:
    """What the session decides for a concurrency level before it is measured (built by
    :func:`level_setup`): the plan (its fits and decode tokens), the highest level selected
    (what an attached server is probed with) and how the streams are judged."""

    plan: SweepPlan
    run_id: str
    highest_level: int
    stream_tolerance: float
    strict_stream: bool
    tcp_keepalive_s: float


def highest_level(plan: SweepPlan, selected: Sequence[Point]) -> int:
    """The highest level ``selected`` in this session (the plan's limit when none is)."""
    return max((p.concurrency for p in selected), default=0) or plan.max_concurrency


def level_setup(run: RunDescription, selected: Sequence[Point]) -> LevelSetup:
    """A concurrency level's setup from what the run is and the points ``selected``."""
    return LevelSetup(
        plan=run.plan,
        run_id=run.run_id,
        highest_level=highest_level(run.plan, selected),
        stream_tolerance=run.settings.stream_tolerance,
        strict_stream=run.settings.strict_stream,
        tcp_keepalive_s=run.settings.tcp_keepalive_s,
    )


@dataclass
class LevelsMeasured:
    """The levels this session measured so far, per length, and whether each ran at once:
    a record's verdict covers them (reports recompute it from all records)."""

    by_length: dict[int, dict[int, bool]] = field(default_factory=dict)

    def note(self, length: int, level: int, ran_at_once: bool) -> dict[int, bool]:
        """``level`` measured at ``length``; the length's levels so far."""
        levels = self.by_length.setdefault(length, {})
        levels[level] = ran_at_once
        return dict(levels)

    def of(self, length: int) -> dict[int, bool]:
        """The levels measured so far at ``length``."""
        return dict(self.by_length.get(length, {}))


def refusal(base_url: str, level: int, found: dict[str, Any]) -> str:
    """Why an attached server cannot run ``level`` requests at once."""
    return (
        f"the server at {base_url} cannot run {level} requests at once: with "
        f"{found.get('wanted')} short requests in flight, at most "
        f"{found.get('most_running')} ran at once while {found.get('most_waiting')} waited "
        "(vllm:num_requests_running, vllm:num_requests_waiting). The concurrency workload "
        f"sends {level} prompts together; serve it with --max-num-seqs {level} or more, or "
        "lower --longctx-max-concurrency"
    )


def server_state(
    client: CompletionClient,
    server: ServerInfo,
    setup: LevelSetup,
    probe_spec: Callable[[int], BackgroundSpec],
) -> dict[str, Any]:
    """What a server shows the concurrency points (asked once per start, see
    :meth:`workload.ServerMemory.shown_to`): its cache (``vllm:cache_config_info``)
    and, attached, how many requests it runs at once."""
    from pytest_longctx.workloads.interference.under_load import probe_sequences

    try:
        labels = cache_config_labels(client.metrics_text())
    except Exception:  # noqa: BLE001 - no /metrics: the plan's fit alone
        labels = None
    known: dict[str, Any] = {"cache_labels": labels}
    if server.mode != "launched":
        known["sequence_limit"] = probe_sequences(client, server, probe_spec(setup.highest_level))
    return known


def fits_for(
    plan: SweepPlan, server: ServerInfo, length: int, labels: dict[str, str] | None
) -> dict:
    """The length's planned fit and vLLM's figure: a launched server's plan is the
    profile's; an attached one's is the plan's model of the cache it reports."""
    planned = dict(plan.planned_fits).get(length)
    try:
        served = capacity_check.concurrency_fits(plan, [length], labels).get(length)
    except ValueError:
        served = None
    if served is not None and served.source == "server":
        if planned is None or server.mode != "launched":
            planned = served.fit
        return {
            "fit_planned": planned,
            "fit_server_blocks": served.fit,
            "fit_vllm": round(served.vllm_concurrency, 4),
            "num_blocks": served.num_blocks,
            "block_size": served.block_size,
            "blocks_per_request": served.blocks_per_request,
        }
    return {"fit_planned": planned, "fit_vllm": None}


def measure(
    server: ServerInfo,
    point: Point,
    prompt: Prompt,
    setup: LevelSetup,
    budget_s: float,
    source: str,
    nonce_pool: Sequence[int],
    known: dict[str, Any],
    measured: LevelsMeasured,
) -> PointMeasurement:
    """One level: ``point.concurrency`` prompts of the point's length, each its own nonce
    first, sent at once, on a server that showed ``known`` (:func:`server_state`); the level
    joins the session's ``measured`` levels unless its contract failed."""
    from pytest_longctx.client import ClientConfig
    from pytest_longctx.measure.measurement import PointFailure, PointMeasurement
    from pytest_longctx.workloads.concurrency.concurrent import level_prompts, measure_level

    limit = known.get("sequence_limit") or {}
    if limit and not limit.get("ran_at_once"):
        most = int(limit.get("most_running") or 0)
        if point.concurrency > most:
            raise PointFailure(
                refusal(server.base_url, point.concurrency, limit), "refused", sent=False
            )
    config = ClientConfig(
        base_url=server.base_url,
        api_key=server.api_key,
        tcp_keepalive_s=setup.tcp_keepalive_s,
    )
    prompts = level_prompts(
        list(prompt.ids), nonce_pool, f"{setup.run_id}:{point.id}", point.concurrency
    )
    decode_tokens = setup.plan.decode_tokens
    result = measure_level(config, server.model_name, prompts, decode_tokens, budget_s, source)
    problems = result.contract_problems()
    agreement = result.stream_agreement(setup.stream_tolerance)
    if agreement.get("problem") and setup.strict_stream:
        problems.append(f"{agreement['problem']} ({STRICT_OPTION})")
    levels = (
        measured.of(point.length)
        if problems
        else measured.note(point.length, point.concurrency, result.ran_at_once)
    )
    fits = fits_for(setup.plan, server, point.length, known.get("cache_labels"))
    verdict = fit_verdict(point.length, levels, fits["fit_planned"], fits.get("fit_vllm"))
    record = {
        **result.to_json(),
        **fits,
        **verdict.to_json(),
        "levels_measured": {str(c): ran for c, ran in sorted(levels.items())},
    }
    if limit:
        record["sequence_limit"] = limit
    if agreement:
        record["stream_agreement"] = agreement
    done = [r for r in result.requests if not r.error]
    counted = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    odd = [n for n in counted if n != point.length]
    cached = [r.cached_prompt_tokens for r in done if r.cached_prompt_tokens is not None]
    return PointMeasurement(
        length=point.length,
        requested_tokens=decode_tokens,
        prompt_tokens=odd[0] if odd else point.length,
        completion_tokens=min((r.completion_tokens for r in done), default=0)
        if len(done) == len(result.requests)
        else 0,
        ttft_s=result.last_request_ttft_s or 0.0,
        stream_figures=result.figures(),
        cached_prompt_tokens=max(cached) if cached else None,
        server_requests=None if result.server_requests is None else int(result.server_requests),
        concurrency=record,
        concurrency_problem="; ".join(problems) or None,
        request_heads=tuple(None if r.error else r.completion_head for r in result.requests),
        server_timing=result.server_timing(setup.stream_tolerance),
    )


class ConcurrencyWorkload(Workload):
    name = CONCURRENCY
    #: Each level's aggregate decode throughput against the baseline's at the same length and
    #: level.
    gate_metrics = (
        Metric(
            "concurrent_decode", "aggregate_decode_throughput", "aggregate decode throughput",
            False, 5.0, "fell", "rose", CONCURRENCY, "decode", per_level=True,
        ),
    )  # fmt: skip
    report = ReportSection(
        "concurrency: how many long requests fit at once",
        concurrency_report.markdown_lines,
        concurrency_report.html_fragment,
        concurrency_report.terminal_table,
        (concurrency_report.draw_plot,),
    )
    server = CONCURRENCY
    mark = CONCURRENCY_MARK
    mark_help = "c cold prompts of one length sent at once (a concurrency level)"
    schedule_rank = 2
    watched = False
    record_section = "concurrency"

    def record_words(self, record: Record) -> str:
        return f" at {record.concurrency_level} requests at once"

    def points(self, plan: SweepPlan, passes: Sequence[Point]) -> tuple[Point, ...]:
        """Each length's levels (:meth:`SweepPlan.levels`), on a server with room for the
        highest: after every other point."""
        return tuple(
            Point(p.length, p.repeat, concurrency=level, workload=self.name)
            for p in passes
            for level in plan.levels(p.length)
        )

    def mark_kwargs(self, point: Point) -> dict[str, int]:
        return {"conc": point.concurrency}

    def identity(self, point: Point) -> dict[str, Any]:
        return {"cache": {}, "concurrency": {"level": point.concurrency}}

    def fitted(self, plan: SweepPlan) -> SweepPlan:
        return capacity_check.with_planned_fits(plan)

    def capacity_lines(self, plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
        return capacity_check.concurrency_lines(plan, lengths)

    def fingerprint(self, run: RunDescription) -> dict[str, Any]:
        return {"max_concurrency": run.plan.max_concurrency}

    def server_needs(self, run: RunDescription, sized: SweepPlan) -> ServerNeeds:
        """Room for the highest level, and usage that says what the cache served (each of its
        prompts must be cold)."""
        return ServerNeeds(room=run.plan.max_concurrency, usage_details=True)

    def server_words(self, run: RunDescription) -> str:
        return f"room for {run.plan.max_concurrency} requests at once"

    def requests(self, point: Point) -> int:
        return point.concurrency

    def own_setup(self, run: RunDescription, selected: Sequence[Point]) -> LevelSetup:
        return level_setup(run, selected)

    def measure(self, step: PointStep) -> PointMeasurement:
        """A level: c prompts of the point's length at once. What the server shows them (its
        cache's blocks and, attached, whether it runs the highest level at once) is found
        once per server start."""
        level, levels = step.setup.own, step.levels
        if not isinstance(level, LevelSetup) or not isinstance(levels, LevelsMeasured):
            raise ValueError(f"{step.point.id}: a concurrency level needs its setup and levels")

        def probe_spec(streams: int) -> BackgroundSpec:
            return background_spec(step, streams)

        known = step.memory.shown_to(
            self.name, lambda: server_state(step.client, step.server, level, probe_spec)
        )
        settings = step.setup.settings
        return measure(
            step.server,
            step.point,
            step.prompt,
            level,
            settings.first_token_budget_s,
            settings.budget_source,
            step.builder.nonce_pool(),
            known,
            levels,
        )
