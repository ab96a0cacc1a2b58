"""Lengths past the model's trained positions (``max_position_embeddings``): named per length
by the plan, with what vLLM does there, and kept on the records."""

from __future__ import annotations

import dataclasses
import json

from longctx_testing import plan_settings

from pytest_longctx.core.records import Record
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import build_plan
from pytest_longctx.profiles import load_profile

V32_POSITIONS = 163_840  # DeepSeek-V3.2's config.json


def _plan(profile):  # noqa: ANN001, ANN202
    return build_plan(plan_settings(profile=profile.name), profile)


def test_the_plan_names_the_lengths_past_the_trained_positions() -> None:
    profile = load_profile("deepseek-v3.2-mi355x")
    plan = _plan(profile)
    assert capacity_check.trained_positions(profile) == V32_POSITIONS
    assert capacity_check.past_positions(profile, V32_POSITIONS) is None
    assert capacity_check.past_positions(profile, V32_POSITIONS + 1) == V32_POSITIONS
    (line,) = capacity_check.positions_lines(plan, plan.lengths)
    past = [n for n in plan.lengths if n + plan.tokens_after_prefix > V32_POSITIONS]
    assert past and past[0] == 256 * 1024
    assert line.startswith("positions: 256Ki, 512Ki, 1Mi") and "128Ki" not in line
    assert "NaN or out-of-range" in line and "past_positions" in line


def test_without_long_max_model_len_the_plan_says_vllm_refuses() -> None:
    profile = load_profile("deepseek-v3.2-mi355x")
    env = {k: v for k, v in profile.serving.env.items() if k != "VLLM_ALLOW_LONG_MAX_MODEL_LEN"}
    bare = dataclasses.replace(profile, serving=dataclasses.replace(profile.serving, env=env))
    plan = _plan(bare)
    (line,) = capacity_check.positions_lines(plan, plan.lengths)
    assert "vLLM refuses such a --max-model-len" in line
    assert capacity_check.positions_lines(plan, [1024, 64 * 1024]) == []


def test_the_record_keeps_past_positions_through_its_line() -> None:
    record = Record(
        run_id="r",
        nodeid="n",
        length=256 * 1024,
        repeat=0,
        outcome="passed",
        past_positions=V32_POSITIONS,
    )
    again = Record.from_json(json.loads(json.dumps(record.to_json())))
    assert again.past_positions == V32_POSITIONS
    assert Record.from_json({**record.to_json(), "past_positions": None}).past_positions is None
