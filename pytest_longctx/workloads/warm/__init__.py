"""The warm workload: follow-up questions on each cold point's prompt while the server still
caches it: the prompt exactly, then a suffix of new tokens, the prefix served from the cache."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_longctx.core.metrics import Metric
from pytest_longctx.core.records import Record
from pytest_longctx.measure.cache_state import PlannedBytes
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import WARM, WARM_MARK, Point, SweepPlan
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.profiles import Profile
from pytest_longctx.prompts import Prompt, PromptBuilder
from pytest_longctx.workloads.warm import reuse
from pytest_longctx.workloads.workload import PointStep, ReportSection, ServerNeeds, Workload

if TYPE_CHECKING:  # what measures: imported where a follow-up is measured
    from pytest_longctx.measure.measurement import PointMeasurement, PointSettings


def prefix_point(point: Point) -> Point:
    """The cold point whose prompt a follow-up opens with: its length and pass."""
    return Point(point.length, point.repeat)


class WarmWorkload(Workload):
    name = WARM
    #: Gated only against the baseline's warm points, with TTFT's tolerance unless set.
    gate_metrics = (
        Metric("warm_ttft", "ttft", "warm TTFT", True, 10.0, "regressed", "improved", WARM, "ttft"),
    )
    report = ReportSection(
        "reuse: questions on a cached prefix (warm follow-ups)",
        reuse.markdown_lines,
        reuse.html_fragment,
        reuse.terminal_table,
        (reuse.draw_reuse_plot,),
    )
    mark = WARM_MARK
    mark_help = "a warm follow-up on a cold point's cached prefix"
    grows_ttft_budget = False

    def record_words(self, record: Record) -> str:
        return f" warm {record.question}"

    def points(self, plan: SweepPlan, passes: Sequence[Point]) -> tuple[Point, ...]:
        """Q follow-ups after each cold point, each its prompt exactly and a new suffix."""
        return tuple(
            Point(p.length, p.repeat, question, plan.suffix_tokens, workload=self.name)
            for p in passes
            for question in range(1, plan.warm_questions + 1)
        )

    def sized_for(self, plan: SweepPlan, selected: Sequence[Point]) -> SweepPlan:
        """With no follow-up among ``selected`` (``-k "not warm"``) the cold plan: the server's
        ``--max-model-len``, its flags and the capacity plan are a cold-only run's."""
        if not selected or any(p.cache_state == self.name for p in selected):
            return plan
        return dataclasses.replace(
            plan,
            warm_questions=0,
            suffix_tokens=0,
            workloads=tuple(name for name in plan.workloads if name != self.name),
        )

    def launch_refusal(self, plan: SweepPlan) -> str | None:
        return capacity_check.warm_refusal(plan)

    def mark_kwargs(self, point: Point) -> dict[str, int]:
        return {"warm": point.question}

    def identity(self, point: Point) -> dict[str, Any]:
        return {"cache": {"question": point.question, "suffix_tokens": point.suffix}}

    def reuses(self, point: Point) -> Point | None:
        return prefix_point(point)

    def plan_lines(self, run: RunDescription, sized: SweepPlan) -> list[str]:
        plan = run.plan
        return [
            f"workload cold,warm: {plan.warm_questions} follow-up(s) after each cold point, "
            f"each its prompt exactly + {plan.suffix_tokens} new tokens, the prefix served "
            "from the cache; "
            + (
                f"--max-model-len and the capacity plan count length + {plan.suffix_tokens} "
                f"+ {plan.decode_tokens} decode"
                if self.planned(sized)
                else "no follow-up selected: the server and the capacity plan are a cold run's"
            )
        ]

    def fingerprint(self, run: RunDescription) -> dict[str, Any]:
        return {
            "warm_questions": run.plan.warm_questions,
            "suffix_tokens": run.plan.suffix_tokens,
        }

    def server_needs(self, run: RunDescription, sized: SweepPlan) -> ServerNeeds:
        # the usage says how much of a follow-up's prompt the cache served
        return ServerNeeds(usage_details=self.planned(sized))

    def progress_tokens(self, point: Point) -> int:
        return point.suffix

    def settings(
        self, run: RunDescription, server: ServerInfo, point: Point, settings: PointSettings
    ) -> PointSettings:
        return dataclasses.replace(
            super().settings(run, server, point, settings),
            prefix_tokens=point.length,
            # a launched server serves the profile's layout; an attached one, its own
            planned_bytes=planned_bytes(run.plan.profile) if server.mode == "launched" else None,
        )

    def prompt(
        self,
        run: RunDescription,
        builder: PromptBuilder,
        point: Point,
        nonce: Sequence[int],
        build: Callable[[RunDescription, PromptBuilder, Point], Prompt],
    ) -> Prompt | None:
        """Its cold point's prompt exactly, then a suffix opening with its own nonce; follow-up
        Q asks the needle of key Q."""
        tag = (
            f"Question {point.question} on the prompt of {point.length} tokens, pass "
            f"{point.repeat}, run {run.run_id}."
        )
        cold = build(run, builder, prefix_point(point))
        return builder.extend(cold, point.suffix, tag, nonce, ask=point.question)

    def measure(self, step: PointStep) -> PointMeasurement:
        """The follow-up; first its cold point's prompt, unmeasured, where this server has not
        computed it (resumed elsewhere, or not selected: ``-k warm``)."""
        from pytest_longctx.measure.measurement import measure_point

        point, memory = step.point, step.memory
        settings = step.setup.settings
        primed = prefix_point(point) not in memory.prefix_sent
        if primed:
            send_prefix(step, settings.decode_tokens)
            memory.note_sent(prefix_point(point))
        sent = memory.prefix_sent[prefix_point(point)]
        settings = dataclasses.replace(settings, prefix_sent_s_ago=time.monotonic() - sent)
        result = measure_point(step.client, step.server, point, step.prompt, settings, **step.hooks)
        if primed:  # its cold point was not measured by this server: the follow-up sent it
            result = dataclasses.replace(
                result, cache={**result.cache, "prefix_sent_by": "follow-up"}
            )
        return result


def send_prefix(step: PointStep, decode_tokens: int) -> None:
    """The cold point's prompt, sent as the cold point would have been: the cache then holds
    what it would hold after the cold point."""
    from pytest_longctx.client import CompletionRequest, MeasurementError
    from pytest_longctx.measure.measurement import PointFailure

    point, settings = step.point, step.setup.settings
    request = CompletionRequest(
        model=step.server.model_name,
        prompt=step.prompt.ids[: point.length],
        decode_tokens=decode_tokens,
    )
    try:
        step.client.measure(
            request,
            first_token_budget_s=settings.first_token_budget_s,
            budget_source=settings.budget_source,
            check_count=False,
        )
    except MeasurementError as exc:
        raise PointFailure(
            f"the {prefix_point(point).id} prompt this follow-up reuses could not be sent first: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def planned_bytes(profile: Profile) -> PlannedBytes | None:
    """The capacity plan's bytes one request of N tokens holds (growing and state, on the
    fullest rank) at a block size: the resident KV of a follow-up's prefix, where vLLM does
    not export its cache's size. None without the model's config."""
    try:
        layout = capacity_check.layout_for(profile)
    except ValueError:
        return None
    if layout is None or layout.allocation is None:
        return None

    def request_bytes(tokens: int, block_size: int | None) -> float:
        served = layout.with_changes(block_size=block_size) if block_size else layout
        return float(sum(served.request_bytes(tokens)))

    return request_bytes
