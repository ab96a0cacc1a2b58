"""The interference workload: each length's cold prompt again, on a server of its own that
also carries K short background streams; what the long prefill costs them (their gaps, in
windows the server's own figures confirm) and what they cost it (its TTFT under load)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.records import Record
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import (
    IDLE_REFERENCE_S,
    INTERFERENCE,
    INTERFERENCE_MARK,
    Point,
    SweepPlan,
)
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.profiles.extra_args import cache_flags
from pytest_longctx.workloads.interference import interference_report
from pytest_longctx.workloads.workload import (
    PointStep,
    ReportSection,
    ServerNeeds,
    Workload,
    background_spec,
)

if TYPE_CHECKING:  # what measures: imported where an interference point is measured
    from pytest_longctx.measure.measurement import PointMeasurement, PointSettings


class InterferenceWorkload(Workload):
    name = INTERFERENCE
    #: Gated only against the baseline's interference points.
    gate_metrics = (
        Metric(
            "load_ttft", "ttft", "TTFT under load", True, 10.0, "regressed", "improved",
            INTERFERENCE, "ttft",
        ),
        Metric(
            "stall", "bg_itl_prefill_p99", "background p99 inter-token gap during the prefill",
            True, 10.0, "rose", "fell", INTERFERENCE, "itl",
        ),
    )  # fmt: skip
    report = ReportSection(
        "interference: the prefill beside background streams, and what it cost them",
        interference_report.markdown_lines,
        interference_report.html_fragment,
        interference_report.terminal_table,
        (interference_report.draw_itl_plot, interference_report.draw_ttft_plot),
    )
    server = INTERFERENCE
    mark = INTERFERENCE_MARK
    mark_help = "a cold prefill on a server that also carries background streams"
    schedule_rank = 1
    checked_under_load = True
    record_section = "interference"

    def record_words(self, record: Record) -> str:
        return f" under {record.background_streams} background streams"

    def points(self, plan: SweepPlan, passes: Sequence[Point]) -> tuple[Point, ...]:
        """Each length again beside K background streams, on a server of its own (one
        switch, after the study's points)."""
        return tuple(
            Point(p.length, p.repeat, background=plan.background_streams, workload=self.name)
            for p in passes
        )

    def mark_kwargs(self, point: Point) -> dict[str, int]:
        return {"interference": point.background}

    def identity(self, point: Point) -> dict[str, Any]:
        return {"cache": {}, "interference": {"background_streams": point.background}}

    def plan_lines(self, run: RunDescription, sized: SweepPlan) -> list[str]:
        requests, each = run.plan.background_load
        return [
            f"workload interference: each length again beside {requests} background streams "
            f"(requests of {each} tokens each, re-issued as they end), on a server of its own "
            f"with room for {requests + 1} sequences; the capacity plan counts them"
        ]

    def capacity_lines(self, plan: SweepPlan, lengths: Sequence[int]) -> list[str]:
        return capacity_check.beside_background_lines(plan, lengths)

    def header_words(self, plan: SweepPlan) -> str:
        return f" ({plan.background_streams} background streams)"

    def fingerprint(self, run: RunDescription) -> dict[str, Any]:
        profile = run.plan.profile
        return {
            "background_streams": run.plan.background_streams,
            "max_num_batched_tokens": run.settings.max_num_batched_tokens
            or cache_flags(profile.serving).max_num_batched_tokens,
        }

    def server_needs(self, run: RunDescription, sized: SweepPlan) -> ServerNeeds:
        """Room for the K background streams beside the long prompt, usage that says what the
        cache served (the only proof the long prompt is cold under load), the chunk asked for
        and the scheduler's config readable (``/server_info``)."""
        return ServerNeeds(
            room=run.plan.background_streams + 1,
            usage_details=True,
            max_num_batched_tokens=run.settings.max_num_batched_tokens,
            server_info=True,
        )

    def server_words(self, run: RunDescription) -> str:
        return f"room for {run.plan.background_streams} background streams beside the long prompt"

    def extra_seconds(self) -> float:
        return IDLE_REFERENCE_S

    def settings(
        self, run: RunDescription, server: ServerInfo, point: Point, settings: PointSettings
    ) -> PointSettings:
        # its streams are judged by the load's settings (PointSetup), not the point's
        return settings

    def measure(self, step: PointStep) -> PointMeasurement:
        """The long prompt beside K background streams. What the server shows them (whether
        it runs K + 1 requests at once, probed, and its effective chunk, ``/server_info``) is
        found once per server start."""
        from pytest_longctx.workloads.interference.under_load import (
            LoadSettings,
            measure_under_load,
            probe_sequences,
        )
        from pytest_longctx.workloads.interference.windows import chunk_from_server_info

        setup = step.setup

        def find() -> dict[str, Any]:
            streams = setup.background_streams + 1
            return {
                "sequence_limit": probe_sequences(
                    step.client, step.server, background_spec(step, streams)
                ),
                "server_config": chunk_from_server_info(step.client.server_info()),
            }

        known = step.memory.shown_to(self.name, find)
        load = LoadSettings(
            background=background_spec(step, step.point.background),
            tolerance=setup.stream_tolerance,
            keep_disagreeing=setup.keep_disagreeing,
            keep_unconfirmed=setup.keep_unconfirmed,
            server_config=known["server_config"],
            sequence_limit=known["sequence_limit"],
        )
        return measure_under_load(
            step.client, step.server, step.point, step.prompt, setup.settings, load, **step.hooks
        )
