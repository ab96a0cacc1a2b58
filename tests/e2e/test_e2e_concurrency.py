"""How many long requests fit at once, on real vLLM: a session of the concurrency workload
on the embedded default with a KV cache sized for about two 4Ki requests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, profile_copy, records_of, run_folder, run_session

from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import load_profile

pytestmark = pytest.mark.vllm

KI = 1024
#: The length of every request.
LENGTH = 4 * KI
#: Requests of 4Ki the cache is sized for: two fit, a third does not.
SIZED_FOR = 2.5
#: Tokens each request decodes: enough that the first request of a level still decodes when
#: the last one's prefill is scheduled on a busy host (a 4Ki prefill takes a few seconds
#: there; 256 tokens about ten). On a CPU the decode steps are what a level costs, not its
#: prefills: levels 1 to 4 at 8Ki with 512 tokens cost 266 CPU-s of a CI run.
DECODE = 256


def test_the_request_past_the_plans_fit_waits_or_is_preempted(pytester: pytest.Pytester) -> None:
    """At 4Ki, level 1, the plan's fit (2) and one past it. Every level up to the plan's
    fit runs at once and the next one does not (its last request waits for room
    or is preempted): the measured fit is the plan's, so a plan one request off either way
    fails here. vLLM decides the blocks (the cache size over its block's bytes): the session
    reads them from the server, the test never assumes them.

    It launches a server of its own: its subject is a KV cache sized for a few long requests
    and room for the levels (--max-num-seqs), which no shared server has."""
    profile = load_profile("cpu-tiny")
    decode = DECODE
    layout = capacity_check.layout_for(profile)
    assert layout is not None and layout.allocation is not None
    per_request = layout.allocation.blocks_per_request(LENGTH + decode)
    kv_bytes = int(SIZED_FOR * per_request) * layout.allocation.bytes_per_block()
    copy = profile_copy(
        pytester.path, "cpu-tiny", **{'kv_cache_memory = "1Gi"': f"kv_cache_memory = {kv_bytes}"}
    )
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result, output = run_session(
        pytester,
        f"--longctx-profile={copy}",
        "--longctx-from=4Ki",
        "--longctx-to=4Ki",
        "--longctx-workload=concurrency",
        "--longctx-max-concurrency=3",
        f"--longctx-decode-tokens={DECODE}",
        "--longctx-progress=off",
    )
    records = records_of(output)
    result.assert_outcomes(passed=len(records))
    for r in records:  # every request of every level carried the probe and answered it
        assert r.fidelity["verdict"] == "correct", (r.length, r.concurrency_level, r.fidelity)
        assert r.fidelity["correct_requests"] == r.concurrency_level
    rows = [
        {
            "length": r.length,
            "level": r.concurrency_level,
            "ran_at_once": r.concurrency["ran_at_once"],
            "aggregate_decode_tok_s": r.concurrency["aggregate_decode_throughput"],
            "request_decode_tok_s": [q.get("decode_throughput") for q in r.concurrency["requests"]],
            "last_request_ttft_s": r.concurrency["last_request_ttft_s"],
            "waiting_peak": r.concurrency["waiting_peak"],
            "waiting_capacity_peak": r.concurrency["waiting_capacity_peak"],
            "kv_usage_peak": r.concurrency["kv_usage_peak"],
            "preemptions": r.concurrency["preemptions"],
            "stream_agreement": r.concurrency.get("stream_agreement"),
        }
        for r in records
    ]
    last = {r.length: r.concurrency for r in records}  # each length's last level: its verdict
    if os.environ.get("LONGCTX_CONCURRENCY_TABLE"):
        Path(os.environ["LONGCTX_CONCURRENCY_TABLE"]).write_text(
            json.dumps({"rows": rows, "fits": last}, indent=1)
        )
    levels = {n: sorted(r.concurrency_level for r in records if r.length == n) for n in last}
    assert last[LENGTH]["fit_planned"] == 2, "the cache was sized for about two 4Ki requests"
    assert levels == {LENGTH: [1, 2, 3]}
    for length, fit in last.items():
        # the plan's figure and the server's blocks agree, and what ran says the same
        assert fit["fit_planned"] == fit["fit_server_blocks"], fit
        assert fit["verdict"] == "agrees", (length, fit, rows)
        assert fit["fit_measured"] == fit["fit_planned"]
        assert fit["fit_vllm"] >= fit["fit_planned"]
    past = next(r for r in records if r.length == LENGTH and r.concurrency_level == 3)
    assert not past.concurrency["ran_at_once"]
    # the third request waited for room or was preempted. The server's own figures say which:
    # a request the scheduler held back for blocks spends that wait queued (vLLM's per-request
    # queue_time), about another request's decode; the streams' overlap is the client's view,
    # which a loaded host delivers late.
    timings = past.server_timing["requests"]
    assert past.server_timing["source"] == "per_request" and len(timings) == 3, past.server_timing
    queued = max(t["queue_s"] for t in timings)
    decoding = min(t["decode_s"] for t in timings)
    assert past.concurrency["preemptions"] or queued > decoding / 2, (timings, rows)
    report = (run_folder(output) / "report.md").read_text()
    assert "## Concurrency: how many long requests fit at once" in report
    assert "| 4Ki | 1, 2, 3 | 2 | 2 |" in report
