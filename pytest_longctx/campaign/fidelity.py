"""Judging a point's answer to the fidelity probe: which lengths are checked or only recorded,
what ``--longctx-plan`` says of it, and the verdict on what came back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_longctx.campaign.prompting import needles_per_prompt
from pytest_longctx.campaign.run import Findings, RunDescription
from pytest_longctx.campaign.warm_up import warm_up_length
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.measurement import PointFailure, PointMeasurement
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.settings import Settings
from pytest_longctx.prompts import (
    ProbeLesson,
    Prompt,
    fidelity_verdict,
    judgement,
    requests_verdict,
)
from pytest_longctx.prompts.needle import NEEDLE_KEYS
from pytest_longctx.prompts.probe import DEPTHS, probe_depth, probe_texts, probe_value
from pytest_longctx.serving import model_description
from pytest_longctx.serving.model_description import ModelDescription
from pytest_longctx.workloads import points_of, workload_of

#: Where a model's config.json states the context it was made for, in order of preference.
ADVERTISED_CONTEXT_KEYS = ("max_position_embeddings", "model_max_length")


def advertised_context(plan: SweepPlan, model: ModelDescription | None) -> int | None:
    """The context the served model claims (its config's ``max_position_embeddings``, or the
    ``model_max_length`` some configs give instead), when the profile describes the served
    model; None when unknown."""
    described_by = getattr(model, "described_by", model_description.BY_PROFILE)
    if described_by != model_description.BY_PROFILE:
        return None
    config = capacity_check.model_config(plan.profile) or {}
    for key in ADVERTISED_CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def plan_lines(run: RunDescription, selected: Sequence[Point]) -> list[str]:
    """What ``--longctx-plan`` says of the probe: its form as text (the tokenizer is not at
    hand without the model) and which lengths are checked or recorded."""
    if run.settings.fidelity == "off":
        return ["fidelity: off (--longctx-fidelity=off): no probe in the prompts"]
    kind = "tokens" if run.plan.profile.model.embedded_name else "text"
    value = probe_value(f"{run.run_id}:0", kind)
    needle, question = probe_texts(kind, value)
    advertised = advertised_context(run.plan, None)  # no server yet: the profile's model
    lengths = sorted({p.length for p in selected})
    modes = {length: judgement(run.settings.fidelity, length, advertised) for length in lengths}
    checked = [format_size(n) for n in lengths if modes[n] == "check"]
    recorded = [format_size(n) for n in lengths if modes[n] == "record"]
    within = (
        f"the model's advertised context is {format_size(advertised)} tokens"
        if advertised
        else "the model's advertised context is unknown"
    )
    others = needles_per_prompt(run.plan) - 1
    points = points_of(run.plan)
    return [
        f"fidelity probe ({kind}): each measured prompt, still exactly its length, carries "
        f"the needle {needle.strip()!r} at a depth that changes from point to point "
        f"({', '.join(f'{d:g}' for d in DEPTHS[:5])}, ...) and ends with the question "
        f"{question.strip()!r}; expected answer for the first point: {value}"
        + (
            f"; a cold prompt holds {others} more needle(s) under other keys "
            f"({', '.join(NEEDLE_KEYS[1 : 1 + others])}) at other depths, each asked by a "
            "warm follow-up"
            if others
            else ""
        ),
        f"fidelity --longctx-fidelity={run.settings.fidelity} ({within}): "
        f"checked {', '.join(checked) or 'none'}; recorded only {', '.join(recorded) or 'none'}",
        *learning_lines(run, selected),
        "needle depths: "
        + ", ".join(
            f"{point.id} {probe_depth(points.index(point)):g}"
            for point in selected
            if workload_of(point).reuses(point) is None and point in points
        ),
    ]


def learning_lines(run: RunDescription, selected: Sequence[Point]) -> list[str]:
    """What ``--longctx-plan`` says of how ``auto`` learns whether the model answers."""
    if run.settings.fidelity != "auto":
        return []
    if not run.plan.warmup_prompts:
        return [
            "fidelity auto: no warm-up (--longctx-warmup-prompts=0) asks the probe, so whether "
            "the served model answers it is not known: every answer is recorded, not checked"
        ]
    return [
        f"fidelity auto: the {run.plan.warmup_prompts} warm-up(s) at "
        f"{format_size(warm_up_length(selected))} tokens carry the probe; a served model that does "
        "not answer it there has every point's answer recorded as not_checked, its figures "
        "kept; one that does has each point checked as above"
    ]


def unjudged_reason(settings: Settings, lesson: ProbeLesson | None) -> str:
    """Why ``auto`` records the points' answers without judging them: the served model did not
    answer the probe in the warm-ups ('' when it did, or under another mode)."""
    if settings.fidelity != "auto" or lesson is None:
        return ""
    return lesson.reason


def judge(
    run: RunDescription,
    findings: Findings,
    point: Point,
    prompt: Prompt,
    result: PointMeasurement,
) -> PointMeasurement:
    """``result`` with its probe's verdict; raises :class:`PointFailure` (``wrong_answer``)
    for a wrong answer on a point whose answers are checked."""
    advertised = advertised_context(run.plan, findings.model)
    how = judgement(run.settings.fidelity, point.prompt_tokens, advertised)
    unjudged = unjudged_reason(run.settings, findings.probe)
    if result.request_heads:  # a concurrency level: every request's answer
        verdict = requests_verdict(prompt.probe, result.request_heads, how, unjudged=unjudged)
    else:
        verdict = fidelity_verdict(prompt.probe, result.completion_head, how, unjudged=unjudged)
    result = dataclasses.replace(result, fidelity=verdict)
    if verdict["verdict"] == "wrong" and how == "check":
        which = (
            f" ({len(verdict['wrong_requests'])} of {verdict['requests']} requests sent at "
            f"once; the first, request {verdict['wrong_requests'][0]}, shown)"
            if "wrong_requests" in verdict
            else ""
        )
        raise WrongAnswer(
            f"wrong answer at {point.prompt_tokens} tokens{which}: expected "
            f"{verdict['expected']}, answered {verdict['answer']} (completion "
            f"{verdict['completion'][:40]!r}; needle at depth {verdict['depth']:.3f})",
            result,
        )
    return result


class WrongAnswer(PointFailure):
    """Measured, but the probe's answer was wrong on a point whose answers are checked."""

    def __init__(self, message: str, measurement: PointMeasurement) -> None:
        super().__init__(message, "wrong_answer")
        self.measurement = measurement
