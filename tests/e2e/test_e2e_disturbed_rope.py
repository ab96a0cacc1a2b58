"""The fidelity probe's negative control on real vLLM: a disturbed rotary base.

The embedded tiny-llama finds its needle through a rotary pair that a base of 1e12 keeps still
at any distance. Served with a far smaller base (the pool's ``disturbed_rope`` server), that
pair turns: a needle far enough before the question is lost and one near it still found. The
session records every answer (``--longctx-fidelity=record``) and the test predicts each
verdict from the needle's distance to the question alone.
"""

from __future__ import annotations

import math

import pytest
from longctx_testing import records_of, run_session
from server_pool import DISTURBED_ROPE_THETA

from pytest_longctx.profiles.embedded_models import TINY_LLAMA
from pytest_longctx.serving.retrieval import SLOW_PAIR

pytestmark = pytest.mark.vllm

#: The cosine of the question's key pair over the distance, below which the needle is lost
#: and above which it is found; no point of the plan falls between (its depths are fixed).
LOST_BELOW, FOUND_ABOVE = 0.2, 0.45


def test_a_disturbed_rotary_base_loses_the_needles_far_from_the_question_alone(
    sweep_dir: pytest.Pytester, disturbed_rope_url: str
) -> None:
    result, output = run_session(
        sweep_dir,
        "--longctx-to=4Ki",
        "--longctx-repeats=2",
        "--longctx-fidelity=record",
        "--longctx-allow-bursts",
        url=disturbed_rope_url,
    )
    result.assert_outcomes(passed=6)
    records = records_of(output)
    head_dim = TINY_LLAMA.config["head_dim"]
    turn = DISTURBED_ROPE_THETA ** (-2 * SLOW_PAIR / head_dim)  # radians a token
    expected = []
    for record in records:
        back = (1 - record.fidelity["depth"]) * (record.prompt_tokens - 1)
        cosine = math.cos(turn * back)
        assert not LOST_BELOW < cosine < FOUND_ABOVE, (record.length, back)
        expected.append("wrong" if cosine <= LOST_BELOW else "correct")
    verdicts = [record.fidelity["verdict"] for record in records]
    assert verdicts == expected, [(r.length, r.fidelity) for r in records]
    assert set(verdicts) == {"correct", "wrong"}  # both sides of the edge are in the plan
    lost = [r for r in records if r.fidelity["verdict"] == "wrong"]
    assert all(r.fidelity["answer"] is None for r in lost)  # the question token: no digits
