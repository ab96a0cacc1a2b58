"""Which tier of the KV cache served a point: its arithmetic, the counters it reads, its rows.

A KV connector (vLLM's CPU offloading, LMCache, a P2P transfer) serves cached prompt tokens
beside the device's prefix cache; vLLM counts them apart (``external_prefix_cache_hits``) and,
from 0.32, per tier (``prompt_tokens_cached_by_source``). The plugin against a stand-in that
reports such hits: test_plugin_faults.py (cold points) and test_warm_contract.py (follow-ups).
"""

from __future__ import annotations

from pytest_longctx.core.records import Record
from pytest_longctx.measure.cache_state import (
    CacheTiers,
    ServerCache,
    cache_tiers,
    judge_warm,
    not_cold_message,
)
from pytest_longctx.measure.server_metrics import (
    EXTERNAL_PREFIX_CACHE_HITS,
    EXTERNAL_PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PROMPT_TOKENS_CACHED,
    PROMPT_TOKENS_CACHED_BY_SOURCE,
    MetricsSnapshot,
    delta,
)
from pytest_longctx.workloads.warm.reuse import COLUMNS, reuse_rows, row_cells

LABELS = {"block_size": "128", "enable_prefix_caching": "True", "num_gpu_blocks": "16384"}


def _exposition(device: int, host: int, by_source: bool = True) -> str:
    """Two engines' counters as vLLM writes them (0.32 on with ``by_source``)."""
    lines = []
    for engine in ("0", "1"):
        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"{PREFIX_CACHE_HITS}{{{labels}}} {device / 2}",
            f"{EXTERNAL_PREFIX_CACHE_HITS}{{{labels}}} {host / 2}",
            f"{EXTERNAL_PREFIX_CACHE_QUERIES}{{{labels}}} {host}",
            f"{PROMPT_TOKENS_CACHED}{{{labels}}} {(device + host) / 2}",
        ]
        if by_source:
            for source in ("device", "host", "p2p", "disk", "external_unspecified"):
                value = {"device": device / 2, "host": host / 2}.get(source, 0)
                lines.append(
                    f'{PROMPT_TOKENS_CACHED_BY_SOURCE}{{{labels},source="{source}"}} {value}'
                )
    return "\n".join(lines) + "\n"


def test_the_metrics_delta_reads_every_tier_and_the_connectors_counters() -> None:
    before = MetricsSnapshot.from_text(_exposition(0, 0))
    after = MetricsSnapshot.from_text(_exposition(512, 1536))
    counters = delta(before, after).counters()
    assert counters["prefix_cache_hits"] == 512  # the device's own, summed over engines
    assert counters["external_prefix_cache_hits"] == 1536
    assert counters["external_prefix_cache_queries"] == 3072
    assert counters["cached_tokens_device"] == 512
    assert counters["cached_tokens_host"] == 1536
    assert counters["cached_tokens_disk"] == 0
    tiers = cache_tiers(counters)
    assert tiers is not None
    assert tiers.served_by == {"device": 512, "host": 1536}  # nearest the device first
    assert tiers.tier == "host"  # the farthest, as vLLM names a mixed hit
    assert tiers.counted_by == "vllm:prompt_tokens_cached_by_source"
    old = delta(
        MetricsSnapshot.from_text(_exposition(0, 0, by_source=False)),
        MetricsSnapshot.from_text(_exposition(512, 1536, by_source=False)),
    ).counters()
    assert not any(name.startswith("cached_tokens_") for name in old)
    before_032 = cache_tiers(old)
    assert before_032 is not None
    assert before_032.served_by == {"device": 512, "external": 1536}
    assert before_032.counted_by == "vllm:prefix_cache_hits and vllm:external_prefix_cache_hits"


def test_connector_hits_no_tier_counts_stay_external_and_silence_is_no_tier() -> None:
    # vLLM 0.32 counts a preempted request's connector hits without a tier
    view = {
        "prefix_cache_hits": 0.0,
        "external_prefix_cache_hits": 1024.0,
        "cached_tokens_device": 0.0,
        "cached_tokens_host": 768.0,
    }
    tiers = cache_tiers(view)
    assert tiers is not None and tiers.served_by == {"host": 768, "external": 256}
    assert cache_tiers({"prefix_cache_hits": 0.0}) == CacheTiers({}, "vllm:prefix_cache_hits")
    assert cache_tiers({"usage_cached_prompt_tokens": 512.0}) is None
    assert CacheTiers({}, "x").tier is None and CacheTiers({}, "x").record() == {}


def test_a_not_cold_message_names_the_tier_or_says_it_is_not_known() -> None:
    host = CacheTiers({"host": 512}, "vllm:prompt_tokens_cached_by_source")
    message = not_cold_message(512, 1024, host)
    assert message.startswith(
        "the server's prefix cache served 512 of 1024 prompt tokens (served from host memory "
        "(CPU offload) 512, by vllm:prompt_tokens_cached_by_source): this is not a cold prefill"
    )
    assert "/reset_prefix_cache clears it only with ?reset_external=true" in message
    device = not_cold_message(512, 1024, CacheTiers({"device": 256}, "vllm:prefix_cache_hits"))
    assert "served from the device prefix cache 256" in device
    assert "256 tokens no counter attributes to a tier" in device  # usage said more
    assert "KV connector" not in device
    unknown = not_cold_message(512, 1024, None)
    assert "which tier served them is not known" in unknown
    recorded = CacheTiers.from_record(host.record())
    assert recorded == host and host.record()["tier"] == "host"


def test_a_follow_up_a_connector_served_is_warm_and_says_its_tier() -> None:
    """vLLM counts a connector's hits in usage and prompt_tokens_cached but not in the device's
    prefix_cache_hits: the prefix came from the cache all the same, from another tier."""
    view = {
        "usage_cached_prompt_tokens": 16384.0,
        "cached_prompt_tokens": 16384.0,
        "prefix_cache_hits": 4096.0,
        "external_prefix_cache_hits": 12288.0,
        "cached_tokens_device": 4096.0,
        "cached_tokens_host": 12288.0,
    }
    cache = ServerCache.from_labels(LABELS)
    verdict = judge_warm(16384, view, cache, prefix_sent_s_ago=1.0)
    assert verdict.problem is None and verdict.served == 16384
    assert verdict.sources["/metrics prefix_cache_hits + external_prefix_cache_hits"] == 16384
    entries = verdict.record(cache)
    assert entries["tier"] == "host"
    assert entries["served_by"] == {"device": 4096, "host": 12288}
    short = judge_warm(16384, {**view, "external_prefix_cache_hits": 8192.0}, cache, 1.0)
    assert "served from host memory (CPU offload) 12,288, the device prefix cache 4,096" in (
        short.problem or ""
    )
    device_only = judge_warm(16384, {"prefix_cache_hits": 16384.0}, cache, 1.0)
    assert device_only.record(cache)["tier"] == "device"


def _warm(length: int, ttft: float, tier: str | None, question: int = 1) -> Record:
    cache = {"question": question, "suffix_tokens": 256, "served": length}
    if tier is not None:
        cache.update(tier=tier, served_by={tier: length})
    return Record(
        run_id="r",
        nodeid=f"t[len={length}-rep=0-warm={question}]",
        length=length,
        repeat=0,
        outcome="passed",
        figures={"ttft": ttft},
        cache_state="warm",
        cache=cache,
    )


def test_the_reuse_table_keeps_follow_ups_of_each_tier_apart() -> None:
    cold = Record("r", "t[len=1024-rep=0]", 1024, 0, "passed", figures={"ttft": 1.0})
    mixed = [cold, _warm(1024, 0.1, "device", 1), _warm(1024, 0.5, "host", 2)]
    rows = reuse_rows(mixed)
    served = [(r.tier, r.warm_ttft.mean, r.warm_ttft.n) for r in rows]
    assert served == [("device", 0.1, 1), ("host", 0.5, 1)]
    assert all(r.cold_ttft is not None and r.cold_ttft.mean == 1.0 for r in rows)
    cells = dict(zip(COLUMNS, row_cells(rows[1]), strict=True))
    assert cells["Tier"] == "host"
    one = reuse_rows([cold, _warm(1024, 0.1, "device", 1), _warm(1024, 0.3, "device", 2)])
    assert [(r.tier, round(r.warm_ttft.mean, 3), r.warm_ttft.n) for r in one] == [
        ("device", 0.2, 2)
    ]
    older = reuse_rows([cold, _warm(1024, 0.1, None)])  # a record from before tiers were read
    assert row_cells(older[0])[COLUMNS.index("Tier")] == "–"
