"""The interference workload in a session on real vLLM: the suite's shared server, the study's
(``--max-num-seqs 1``), probed and refused with the reason. The session's own handling of the
workload, against a fake server: tests/unit/session/test_interference_session.py."""

from __future__ import annotations

import pytest
from longctx_testing import records_of, run_session

pytestmark = pytest.mark.vllm


def test_a_server_that_runs_one_sequence_at_a_time_is_refused_with_the_reason(
    sweep_dir: pytest.Pytester, vllm_url: str
) -> None:
    """The suite's shared server is the study's, --max-num-seqs 1: real vLLM, probed."""
    result, output = run_session(
        sweep_dir, "-m", "len==1Ki", "--longctx-workload=interference", url=vllm_url
    )
    result.assert_outcomes(failed=1)
    (record,) = records_of(output)
    assert record.failure_class == "refused"
    assert f"the server at {vllm_url} cannot run 5 requests at once" in record.reason
    assert "at most 1 ran at once" in record.reason
    assert "serve it with --max-num-seqs 5 or more" in record.reason
