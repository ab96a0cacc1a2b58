"""A point's prompt: the served model's tokenizer (resolved once per session, by the
lifecycle), and each point's exact-length prompt (its nonce, its tag, the probe's needles).
"""

from __future__ import annotations

from typing import Any

from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.measure.measurement import client_for
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.run_description import RunDescription
from pytest_longctx.prompts import LocalTokenSource, Prompt, PromptBuilder, ServerTokenSource
from pytest_longctx.prompts.needle import NEEDLE_KEYS
from pytest_longctx.prompts.probe import probe_depth
from pytest_longctx.serving import model_description
from pytest_longctx.serving.model_description import ModelDescription
from pytest_longctx.workloads import points_of, workload_of


def prompt_builder(
    run: RunDescription, model: ModelDescription | None, server: ServerInfo
) -> PromptBuilder:
    """The served model's tokenizer: a local copy when there is one, else the server's own.

    Local: the profile's (launched, or attached to the profile's model) or the server's model
    folder when it is readable here (``model``: the served model as the lifecycle described
    it). Otherwise ``/tokenize`` encodes and ``/detokenize`` decodes (text prompts).
    """
    from pytest_longctx.profiles.embedded_models import cache_root

    profile = run.plan.profile
    described_by = getattr(model, "described_by", model_description.BY_PROFILE)
    source: Any
    if described_by == model_description.BY_PROFILE:
        source = LocalTokenSource(
            campaign_server.tokenizer_location(profile, build=True),
            revision=None if profile.model.embedded_name else profile.model.revision,
            trust_remote_code=profile.model.trust_remote_code,
        )
    elif described_by == model_description.BY_FOLDER and server.model_root:
        source = LocalTokenSource(server.model_root, trust_remote_code=True)
    else:
        client = client_for(server)  # lives as long as the builder, for /tokenize
        source = ServerTokenSource(
            server.model_name,
            lambda text, special: client.tokenize(text, add_special_tokens=special),
            lambda ids: client.detokenize(server.model_name, ids),
        )
    return PromptBuilder(source, cache_root() / "prompts", seed=run.settings.seed)


def build_prompt(run: RunDescription, builder: PromptBuilder, point: Point) -> Prompt:
    """The point's own nonce first (its index in the plan), then a readable tag. A warm
    follow-up is its cold point's prompt exactly, then a suffix opening with its own nonce.
    A measured prompt carries the fidelity probe (unless ``--longctx-fidelity=off``): a
    needle at a depth that changes from one point to the next, and the question last. With
    warm follow-ups planned the cold prompt holds a needle for each of them too, under keys
    of their own at other depths, and follow-up Q asks the needle of key Q."""
    points = points_of(run.plan)
    index = points.index(point) if point in points else len(points)
    nonce = builder.nonce(run.run_id, index)
    reused = workload_of(point).prompt(run, builder, point, nonce, build_prompt)
    if reused is not None:
        return reused
    tag = f"Run {run.run_id}, prompt of {point.length} tokens, pass {point.repeat}."
    probed = run.settings.fidelity != "off"
    return builder.build(
        point.length,
        tag,
        text=run.settings.prompt_format == "text",
        nonce=nonce,
        probe_key=f"{run.run_id}:{index}" if probed else None,
        depth=probe_depth(index),
        needles=needles_per_prompt(run.plan),
    )


def needles_per_prompt(plan: SweepPlan) -> int:
    """One needle for the cold question and one for each warm follow-up, up to the keys
    there are (follow-ups beyond ask the needles again, in turn)."""
    return min(1 + plan.warm_questions, len(NEEDLE_KEYS))
