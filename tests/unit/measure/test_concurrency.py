"""The concurrency workload without a real server: the plan's fit per length against vLLM's
own block pool and concurrency figure, the levels, and one level's client-side logic on the
fake server (timings, a request that waits, a broken stream among c)."""

from __future__ import annotations

import dataclasses

import pytest
from longctx_testing import plan_settings

from pytest_longctx.capacity import concurrency_fit, fit_verdict, pool_blocks, render_fit_table
from pytest_longctx.client import ClientConfig
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import (
    CONCURRENCY,
    Point,
    build_plan,
    concurrency_levels,
)
from pytest_longctx.profiles import load_profile
from pytest_longctx.workloads import capacity_table, points_of
from pytest_longctx.workloads.concurrency.concurrent import level_prompts, measure_level

KI = 1024


def tiny_allocation(block_size: int = 128):
    layout = capacity_check.layout_for(load_profile("cpu-tiny"))
    assert layout is not None
    return layout.with_changes(block_size=block_size)


# --- the plan's fit, against vLLM's own code ---------------------------------------------------


def vllm_fit(num_blocks: int, blocks_per_request: int) -> int:
    """Requests of ``blocks_per_request`` blocks vLLM's own BlockPool hands out together."""
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_blocks, enable_caching=False, hash_block_size=16)
    held = 0
    while pool.get_num_free_blocks() >= blocks_per_request:
        pool.get_new_blocks(blocks_per_request)
        held += 1
    return held


def vllm_figures(layout, tokens: int, num_blocks: int) -> tuple[int, float]:
    """vLLM's blocks for one request of ``tokens`` and its ``kv_cache_max_concurrency`` had
    ``--max-model-len`` been ``tokens``, from its spec classes and allocator functions."""
    from vllm.v1 import kv_cache_interface as iface
    from vllm.v1.core import kv_cache_utils as utils

    from pytest_longctx.capacity.oracle import oracle_config, specs_for_layers

    settings = layout.allocation.settings
    specs = specs_for_layers(layout.layers, settings, kv_element_bytes=layout.element_bytes)
    config = oracle_config(settings, tokens)
    groups = utils.get_kv_cache_groups(config, dict(specs))
    blocks = sum(
        -(-g.kv_cache_spec.max_memory_usage_bytes(config) // g.kv_cache_spec.page_size_bytes)
        for g in groups
    )
    kv_config = iface.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    return blocks, utils.get_max_concurrency_for_kv_cache_config(config, kv_config)


@pytest.mark.parametrize("block_size", [128, 32])
@pytest.mark.parametrize("length", [4 * KI, 8 * KI, 8 * KI - 32, 16 * KI])
@pytest.mark.parametrize("decode", [1, 32, 129])
def test_the_fit_per_length_is_vllms(block_size: int, length: int, decode: int) -> None:
    """Blocks per request, the requests vLLM's block pool holds together (its null block
    held back), and vLLM's own concurrency figure, at every length: not only the longest."""
    pytest.importorskip("vllm")
    layout = tiny_allocation(block_size)
    tokens = length + decode
    per_request, _ = vllm_figures(layout, tokens, 1000)
    for num_blocks in (per_request * 3, per_request * 3 + 1, per_request * 3 + 7, 5000):
        fit = concurrency_fit(layout.allocation, num_blocks, length, decode)
        blocks, vllm_concurrency = vllm_figures(layout, tokens, num_blocks)
        assert fit.blocks_per_request == blocks
        assert fit.fit == vllm_fit(num_blocks, blocks)
        assert fit.vllm_concurrency == pytest.approx(vllm_concurrency)


def test_the_null_block_takes_one_request_off_an_exact_fit() -> None:
    """Three requests' blocks exactly: vLLM's figure says 3.00x, but its pool holds one block
    back, so two fit; one more block and three do."""
    allocation = tiny_allocation().allocation
    per_request = allocation.blocks_per_request(8 * KI + 32)
    assert per_request == 65  # 8,224 tokens in blocks of 128
    exact = concurrency_fit(allocation, 3 * per_request, 8 * KI, 32)
    assert (exact.fit, exact.vllm_concurrency) == (2, 3.0)
    assert concurrency_fit(allocation, 3 * per_request + 1, 8 * KI, 32).fit == 3
    assert concurrency_fit(allocation, 0, 8 * KI, 32).fit == 0


def test_pool_blocks_are_whole_blocks_of_the_cache() -> None:
    allocation = tiny_allocation().allocation
    per_block = allocation.bytes_per_block()
    assert pool_blocks(allocation, 10 * per_block + per_block - 1) == 10
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        pool_blocks(allocation, -1)


def plan_for(workload: tuple[str, ...] = (CONCURRENCY,), max_concurrency: int = 8, **kw):
    settings = plan_settings(
        from_length=4 * KI,
        to_length=8 * KI,
        order="length",
        output=".",
        workload=workload,
        max_concurrency=max_concurrency,
        **kw,
    )
    return build_plan(settings, load_profile("cpu-tiny"))


def test_the_plan_fits_each_length_from_the_cache_or_the_servers_report() -> None:
    plan = plan_for()
    fits = capacity_check.concurrency_fits(plan, plan.lengths)
    allocation = tiny_allocation().allocation
    blocks = plan.profile.serving.kv_cache_memory // allocation.bytes_per_block()
    assert {n: (f.num_blocks, f.source) for n, f in fits.items()} == {
        4 * KI: (blocks, "plan"),
        8 * KI: (blocks, "plan"),
    }
    assert fits[8 * KI].fit == (blocks - 1) // allocation.blocks_per_request(8 * KI + 32)
    labels = {"block_size": "32", "num_gpu_blocks": "800"}
    served = capacity_check.concurrency_fits(plan, [8 * KI], labels)[8 * KI]
    assert (served.source, served.block_size, served.num_blocks) == ("server", 32, 800)
    assert served.blocks_per_request == 257  # 8,224 tokens in blocks of 32
    assert served.fit == 3
    table = render_fit_table(list(fits.values()))
    assert "8Ki" in table and f"{fits[8 * KI].fit}" in table


def test_the_plan_printout_shows_the_fit_per_length() -> None:
    text = capacity_table(plan_for(), [4 * KI, 8 * KI])
    assert "concurrency points" in text
    assert "blocks/request" in text


# --- levels and items --------------------------------------------------------------------------


def test_levels_are_powers_of_two_and_the_plans_fit_and_one_past_it() -> None:
    assert concurrency_levels(8, 3) == (1, 2, 3, 4, 8)
    assert concurrency_levels(8, 5) == (1, 2, 4, 5, 6, 8)
    assert concurrency_levels(4, 4) == (1, 2, 4)  # fit + 1 is past the limit
    assert concurrency_levels(4, None) == (1, 2, 4)
    assert concurrency_levels(3, 0) == (1, 2)  # nothing fits: level 1 shows it


def test_concurrency_points_have_their_ids_and_come_after_the_others() -> None:
    plan = dataclasses.replace(plan_for(("cold", CONCURRENCY), 4), planned_fits=((8 * KI, 3),))
    ids = [p.id for p in points_of(plan)]
    assert ids == [
        "len=4Ki-rep=0",
        "len=8Ki-rep=0",
        "len=4Ki-rep=0-conc=1",
        "len=4Ki-rep=0-conc=2",
        "len=4Ki-rep=0-conc=4",
        "len=8Ki-rep=0-conc=1",
        "len=8Ki-rep=0-conc=2",
        "len=8Ki-rep=0-conc=3",
        "len=8Ki-rep=0-conc=4",
    ]
    assert Point(8 * KI, 0, concurrency=4, workload=CONCURRENCY).cache_state == CONCURRENCY
    assert plan.workloads == ("cold", CONCURRENCY)


# --- the measured fit's verdict ----------------------------------------------------------------


def test_the_measured_fit_is_the_level_below_the_first_that_did_not_run_at_once() -> None:
    exact = fit_verdict(8 * KI, {1: True, 2: True, 3: True, 4: False}, planned=3, vllm=3.49)
    assert (exact.measured, exact.exact, exact.verdict) == (3, True, "agrees")
    off = fit_verdict(8 * KI, {1: True, 2: True, 3: True, 4: False}, planned=4, vllm=4.0)
    assert off.verdict.startswith("DIFFERS")
    bracket = fit_verdict(8 * KI, {1: True, 2: True, 4: False}, planned=3, vllm=None)
    assert (bracket.measured, bracket.measured_upper) == (2, 3)
    assert bracket.verdict.startswith("consistent")
    assert bracket.to_json()["fit_measured"] is None
    unbounded = fit_verdict(4 * KI, {1: True, 2: True, 4: True}, planned=6, vllm=None)
    assert unbounded.verdict.startswith("consistent")
    none = fit_verdict(4 * KI, {1: False, 2: False}, planned=1, vllm=None)
    assert (none.measured, none.verdict) == (0, "DIFFERS: 0 ran at once, the plan says 1")


# --- one level on the fake server --------------------------------------------------------------


def prompts(level: int, length: int = 64) -> list[list[int]]:
    return level_prompts(list(range(100, 100 + length)), list(range(1000, 5000)), "key", level)


def test_level_prompts_are_distinct_from_their_first_token() -> None:
    made = prompts(4)
    assert len({p[0] for p in made}) == 4
    assert {len(p) for p in made} == {64}


def test_a_level_that_runs_at_once(fake_vllm) -> None:
    """Four requests, each 0.2 s to its first token and 20 tokens 20 ms apart, served
    together: all overlap, and the aggregate rate counts them together.

    What holds however a busy host stretches the streams: every request decoding at one
    moment puts the span from the first first token to the last token within two requests'
    spans, so the aggregate is at least twice the slowest request's rate, and no more than
    the sum of the rates (each request's own span is within the level's)."""
    fake_vllm.configure(first_token_delay_s=0.2, token_delay_s=0.02)
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(4), 20, 10.0)
    assert result.errors == [] and result.contract_problems() == []
    assert result.overlap and result.ran_at_once
    assert result.preemptions == 0
    rates = [r.decode_throughput for r in result.requests]
    aggregate = result.aggregate_decode_throughput
    assert 2 * min(rates) <= aggregate <= sum(rates) * (1 + 1e-9), (aggregate, rates)
    assert all(r.ttft_s >= 0.2 for r in result.requests)  # the stand-in's delay, at least
    # each token at least half a token's time after the one before (MIN_STEP_SHARE)
    assert result.requests[0].itl_median_s >= 0.01
    assert result.peaks.running == 4
    figures = result.figures()
    assert figures["ttft"] == result.last_request_ttft_s
    record = result.to_json()
    assert record["level"] == 4 and len(record["requests"]) == 4 and record["ran_at_once"]


def test_a_request_that_waits_for_room_did_not_run_at_once(fake_vllm) -> None:
    """Room for two: the third request starts when one of the first two has finished, its
    TTFT carries the wait, and the waiting gauge shows it. Each decodes for 0.8 s: a loaded
    host once sent the third 0.2 s after the others, when a decode of 0.2 s had ended and
    there was no wait left."""
    fake_vllm.configure(first_token_delay_s=0.1, token_delay_s=0.02, max_num_seqs=2)
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(3), 40, 10.0)
    assert result.errors == []
    assert not result.overlap and not result.ran_at_once
    assert result.last_request_ttft_s > 0.25
    assert result.peaks.waiting == 1


def test_a_broken_stream_among_c_fails_the_level_and_keeps_the_others(fake_vllm) -> None:
    made = prompts(3)
    fake_vllm.configure(
        token_delay_s=0.01, fault="truncate", fault_after_tokens=3, fault_prompt_head=made[1][0]
    )
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", made, 10, 10.0)
    assert [r.index for r in result.requests if r.error] == [1]
    assert "request 1" in result.contract_problems()[0]
    assert not result.ran_at_once
    assert result.aggregate_decode_throughput is None
    kept = [r for r in result.requests if not r.error]
    assert [r.completion_tokens for r in kept] == [10, 10]


def test_another_clients_request_shows_in_the_servers_counts(fake_vllm) -> None:
    fake_vllm.configure(token_delay_s=0.01, other_requests=1)
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(2), 5, 10.0)
    assert any("another client" in p for p in result.contract_problems())


def test_a_level_a_kv_connector_served_says_which_tier(fake_vllm) -> None:
    """Every request's usage shows the hit; the level's /metrics say from which tier."""
    fake_vllm.configure(token_delay_s=0.01, kv_connector="disk", external_cached_prompt_tokens=32)
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(2), 5, 10.0)
    problems = result.contract_problems()
    assert "request 0: 32 prompt tokens came from the prefix cache (not cold)" in problems
    assert (
        "the level's cached tokens were served from disk offload 64, by "
        "vllm:prompt_tokens_cached_by_source"
    ) in problems


# --- the gate -----------------------------------------------------------------------------------


def level_record(run: str, level: int, aggregate: float, repeat: int = 0):
    from pytest_longctx.core.records import Record

    return Record(
        run_id=run,
        nodeid=f"test_sweep.py::test_prefill_decode[len=8Ki-rep={repeat}-conc={level}]",
        length=8 * KI,
        repeat=repeat,
        outcome="passed",
        figures={"aggregate_decode_throughput": aggregate, "ttft": 1.0},
        cache_state=CONCURRENCY,
        concurrency={"level": level},
    )


def test_the_gate_compares_each_levels_aggregate_with_the_same_levels() -> None:
    """Level 1 unchanged, level 4 down by half: one regression, named by its level; the
    levels are never pooled (level 4's rate is four times level 1's)."""
    from pytest_longctx.gate import Tolerances, compare_length

    baseline = [level_record("a", 1, 100.0 + r, r) for r in range(3)]
    baseline += [level_record("a", 4, 400.0 + r, r) for r in range(3)]
    current = [level_record("b", 1, 100.0 + r, r) for r in range(3)]
    current += [level_record("b", 4, 200.0 + r, r) for r in range(3)]
    verdict = compare_length(baseline, current, 8 * KI, Tolerances())
    levels = [v for v in verdict.verdicts if v.metric == "concurrent_decode"]
    assert [v.status for v in levels] == ["ok", "regressed"]
    assert "of 4 at once" in levels[1].message
    assert verdict.status == "regressed"


def test_streams_flushed_at_once_do_not_show_the_servers_decode(fake_vllm) -> None:
    """The server decodes each request over 0.2 s but its API server writes every chunk at
    the end: the streams' spans add up to nearly nothing against its decode time."""
    fake_vllm.configure(token_delay_s=0.02, deliver_at_once=True)
    flushed = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(2), 11, 10.0)
    agreement = flushed.stream_agreement(0.5)
    assert agreement["agrees"] is False and "not show the server's decode" in agreement["problem"]
    # the two requests' decode as the stand-in's /metrics counted it (10 gaps of 20 ms each
    # on an idle host; longer where a busy host held the stand-in back)
    counted = sum(stream.decode_s for stream in fake_vllm.streams[-2:])
    assert agreement["server_decode_s"] == pytest.approx(counted)
    fake_vllm.configure(deliver_at_once=False)
    streamed = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(2), 11, 10.0)
    assert streamed.stream_agreement(0.5)["agrees"] is True


def test_a_level_is_judged_request_by_request_against_each_requests_own_decode(
    fake_vllm,
) -> None:
    """Three requests decode 0.2 s each; the API server hands one of them over whole at the
    end. Summed, the streams' spans are a third short of the server's decode time, inside
    the tolerance: the sum would pass the flush. Each stream against its own request's
    decode (vLLM's per-request metrics) names the one that did not show it."""
    made = prompts(3)
    fake_vllm.configure(
        token_delay_s=0.02,
        deliver_at_once=True,
        flush_prompt_head=made[2][0],
        per_request_metrics=True,
    )
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", made, 11, 10.0)
    assert result.errors == []
    agreement = result.stream_agreement(0.5)
    assert agreement["by"] == "request" and agreement["agrees"] is False
    assert [r["agrees"] for r in agreement["requests"]] == [True, True, False]
    assert agreement["problem"].startswith("1 of 3 requests: request 2: the stream delivered")
    sent = {stream.prompt_head[0]: stream.metrics for stream in fake_vllm.streams[-3:]}
    timing = result.server_timing(0.5)
    assert timing["source"] == "per_request" and timing["decode"]["disagree"] == 1
    for entry, prompt in zip(timing["requests"], made, strict=True):
        metrics = sent[prompt[0]]
        assert metrics is not None
        assert entry["decode_s"] == metrics["generation_time_ms"] / 1000
        assert entry["ttft_s"] == metrics["time_to_first_token_ms"] / 1000
        assert entry["front_end_s"] == pytest.approx(entry["client_ttft_s"] - entry["ttft_s"])
    # the three servers' decodes, as their own figures, are the level's sum
    assert agreement["server_decode_s"] == pytest.approx(
        sum(stream.decode_s for stream in fake_vllm.streams[-3:])
    )


def test_a_request_that_waited_for_room_shows_its_wait_in_the_servers_queue(fake_vllm) -> None:
    """Room for two: the third request waits in the server's queue until one of the first
    two ends, and its own figures say so: its queue time holds the wait, and so does the
    front end's share of its TTFT (the server's TTFT starts when it is scheduled)."""
    fake_vllm.configure(
        first_token_delay_s=0.1, token_delay_s=0.02, max_num_seqs=2, per_request_metrics=True
    )
    result = measure_level(ClientConfig(fake_vllm.url), "fake-model", prompts(3), 20, 10.0)
    entries = result.server_timing(0.5)["requests"]
    waited = max(entries, key=lambda entry: entry["queue_s"])
    assert waited["queue_s"] >= 0.1 + 19 * 0.02 * 0.5  # a whole request of the first two
    assert waited["front_end_s"] >= waited["queue_s"]
    assert waited["ttft_s"] < waited["client_ttft_s"] - waited["queue_s"] + 1e-9


def test_compare_sets_each_level_beside_the_same_level_of_the_other_run(tmp_path) -> None:
    """Two runs of levels 1 and 4: the table pairs level with level (never pooled into one
    figure per length) and the plot is drawn."""
    from pytest_longctx.core.records import append_record
    from pytest_longctx.reporting.run_comparison import write_comparison

    runs = []
    for run, rates in (("a", (100.0, 400.0)), ("b", (100.0, 200.0))):
        folder = tmp_path / run
        for level, rate in zip((1, 4), rates, strict=True):
            record = level_record(run, level, rate)
            record = dataclasses.replace(
                record, concurrency={"level": level, "ran_at_once": level == 1}
            )
            append_record(folder / "results.jsonl", record)
        runs.append(folder)
    written = write_comparison(runs, tmp_path / "compared")
    report = (tmp_path / "compared" / "compare.md").read_text()
    assert "| 8Ki | 1 | 100.0 | 100.0 | x1.000 |" in report
    assert "| 8Ki | 4 | 400.0 (not at once) | 200.0 (not at once) | x0.500 |" in report
    assert "aggregate decode throughput" not in report.split("concurrency level")[0]
    assert tmp_path / "compared" / "compare_concurrency.png" in written


def test_the_servers_running_count_decides_whether_a_level_ran_at_once() -> None:
    """The server's gauge is the evidence: a stream a busy host delivered in one late burst
    (the streams do not overlap) still ran at once when the server ran all c together, and
    overlapping streams did not when the server never ran c at one moment. A server without
    the gauge: the streams' overlap decides."""
    from pytest_longctx.workloads.concurrency.concurrent import (
        GaugePeaks,
        LevelResult,
        RequestFigures,
    )

    apart = (  # the second's first token after the first's last: no overlap seen
        RequestFigures(0, sent_at=0.0, first_token_at=1.0, last_token_at=2.0),
        RequestFigures(1, sent_at=0.0, first_token_at=2.5, last_token_at=2.6),
    )
    together = (
        RequestFigures(0, sent_at=0.0, first_token_at=1.0, last_token_at=3.0),
        RequestFigures(1, sent_at=0.0, first_token_at=1.5, last_token_at=3.5),
    )

    def level(requests, running):  # noqa: ANN001, ANN202
        return LevelResult(8192, 2, 32, requests, GaugePeaks(running=running), preemptions=0)

    assert level(apart, running=2.0).ran_at_once
    assert not level(together, running=1.0).ran_at_once
    assert level(together, running=None).ran_at_once
    assert not level(apart, running=None).ran_at_once
    preempted = LevelResult(8192, 2, 32, together, GaugePeaks(running=2.0), preemptions=1)
    assert not preempted.ran_at_once
