"""The sweep in any CI on real vLLM: a gated session's JUnit XML carries each point's figures
and the gate's verdicts. The ini lists, off switches and report header, against a fake server:
tests/unit/session/test_any_ci.py."""

from __future__ import annotations

import pytest
from longctx_testing import SWEEP_TEST, junit_cases, records_of, run_folder, run_session

pytestmark = pytest.mark.vllm


def test_junit_xml_carries_each_points_figures_and_the_gates_verdicts(
    pytester: pytest.Pytester, vllm_url: str
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    first, first_output = run_session(pytester, "--longctx-to=2Ki", url=vllm_url)
    first.assert_outcomes(passed=2)
    baseline = run_folder(first_output)
    junit = pytester.path / "junit.xml"
    (pytester.path / "reports").rename(pytester.path / "baseline-reports")
    baseline = pytester.path / "baseline-reports" / baseline.name
    # Tolerances that only keep the mechanism under test, not this shared host's noise.
    result, output = run_session(
        pytester,
        "--longctx-to=2Ki",
        f"--longctx-baseline={baseline}",
        "--longctx-tolerance=ttft=100000%,decode=99%,itl=100000%",
        f"--junitxml={junit}",
        url=vllm_url,
    )
    result.assert_outcomes(passed=4)
    cases = junit_cases(junit)
    records = records_of(output)
    assert len(records) == 2
    for record in records:
        assert record.figures["server_request_itl"] > 0  # the server timed each request
        properties = cases[record.nodeid.rsplit("::", 1)[-1]]
        assert properties["longctx_outcome"] == "passed"
        assert int(properties["longctx_length"]) == record.length
        assert int(properties["longctx_repeat"]) == record.repeat
        assert float(properties["longctx_ttft_s"]) == record.figures["ttft"]
        assert float(properties["longctx_decode_tok_s"]) == record.figures["decode_throughput"]
        assert int(properties["longctx_prompt_tokens"]) == record.length
        assert properties["longctx_run_id"] == record.run_id
    for size, length in (("1Ki", 1024), ("2Ki", 2048)):
        gate = cases[f"test_regression[len={size}]"]
        assert int(gate["longctx_gate_length"]) == length
        assert gate["longctx_gate_status"] in ("ok", "improved")
        # every metric judged: where a busy host left a side's streams without a gap of one
        # token, ITL is the server's own mean per request, which every point here carries
        for metric in ("ttft", "decode", "itl"):
            assert gate[f"longctx_gate_{metric}"] in ("ok", "improved")
            assert float(gate[f"longctx_gate_{metric}_change_pct"]) > -100
        assert float(gate["longctx_gate_ttft_tolerance_pct"]) == 100000
