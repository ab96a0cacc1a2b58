"""The fidelity probe on real vLLM: the embedded default answers at every length and depth.

Attached to the suite's shared server (the embedded tiny-llama, weights built to retrieve).
Points whose stream a busy host held back are kept (``--longctx-allow-bursts``): the answer
is their subject, not the stream.
"""

from __future__ import annotations

import pytest
from longctx_testing import records_of, run_session

pytestmark = pytest.mark.vllm


def test_the_embedded_default_answers_at_every_length_and_depth(
    sweep_dir: pytest.Pytester, vllm_url: str
) -> None:
    result, output = run_session(
        sweep_dir,
        "--longctx-to=4Ki",
        "--longctx-repeats=2",
        "--longctx-fidelity=check",
        "--longctx-allow-bursts",
        url=vllm_url,
    )
    result.assert_outcomes(passed=6)
    records = records_of(output)
    verdicts = [r.fidelity for r in records]
    assert [v["verdict"] for v in verdicts] == ["correct"] * 6, verdicts
    assert all(v["answer"] == v["expected"] for v in verdicts)
    assert {r.length for r in records} == {1024, 2048, 4096}
    depths = sorted(v["depth"] for v in verdicts)
    # depth 0 sits right after the nonce and the run tag (about 30 tokens), depth 1 before the end
    assert len(set(depths)) == 6 and depths[0] < 0.05 and depths[-1] > 0.99, depths
