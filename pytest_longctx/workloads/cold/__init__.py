"""The cold workload: each length's prompt, new to the server, measured alone on the study's
one-sequence server: its prefill (TTFT) and a fixed-length decode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_longctx.core.metrics import Metric
from pytest_longctx.plan.points import COLD
from pytest_longctx.workloads.workload import PointStep, Workload

if TYPE_CHECKING:
    from pytest_longctx.measure.measurement import PointMeasurement


class ColdWorkload(Workload):
    name = COLD
    #: ITL gates the median gap: the p90 and max of a few hundred gaps swing with a single
    #: scheduler hiccup and would cry wolf.
    gate_metrics = (
        Metric("ttft", "ttft", "TTFT", True, 10.0, "regressed", "improved"),
        Metric("decode", "decode_throughput", "decode throughput", False, 5.0, "fell", "rose"),
        Metric("itl", "itl_median", "median inter-token latency", True, 10.0, "rose", "fell"),
    )

    def measure(self, step: PointStep) -> PointMeasurement:
        """The point alone; once it was computed (measured, or unverified) the server holds
        its prompt: the prefix its follow-ups reuse."""
        from pytest_longctx.measure.measurement import UnverifiedPoint, measure_point

        point, settings = step.point, step.setup.settings
        try:
            result = measure_point(
                step.client, step.server, point, step.prompt, settings, **step.hooks
            )
        except UnverifiedPoint:
            step.memory.note_sent(point)
            raise
        step.memory.note_sent(point)
        return result
