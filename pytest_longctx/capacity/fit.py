"""Tokens and bytes: what vLLM's cache holds, and whether a point fits the hardware."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_longctx.core.sizes import format_size

from .layout import FP8_CACHE_DTYPE, GIB, CacheLayout, describe_layout, text_fields
from .workspace import largest_passing


def token_capacity(
    layout: CacheLayout,
    kv_cache_bytes: int,
    block_size: int,
    max_model_len: int | None = None,
) -> int:
    """Tokens vLLM reports ("KV cache size: N tokens") for a cache of ``kv_cache_bytes``.

    vLLM makes ``kv_cache_bytes // bytes per block`` whole blocks, a block costing the widest
    KV-cache group's pages. Without ``max_model_len`` this returns those blocks' tokens for a
    single-group model (at most one block below ``kv_cache_bytes / bytes per token``), and for
    a hybrid the longest single request they hold. With it,
    vLLM's group-aware figure: ``int(blocks / blocks one request of max_model_len needs *
    max_model_len)``, which is lower when ``max_model_len`` is not a whole number of blocks
    and, for hybrids, counts the windows' and the state groups' blocks too. The block size
    is vLLM's choice (it differs by platform, kernel and CPU features): read it from the
    server's ``vllm:cache_config_info``, never assume it.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive token count, got {block_size}")
    if kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes}")
    if max_model_len is not None and max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive token count, got {max_model_len}")
    allocation = layout.with_changes(block_size=block_size).allocation
    assert allocation is not None
    if max_model_len is None:
        num_blocks = kv_cache_bytes // allocation.bytes_per_block()
        if len(allocation.groups) == 1:
            return num_blocks * allocation.block_size
        return allocation.tokens_for_blocks(num_blocks)  # the longest single request
    return allocation.token_capacity(kv_cache_bytes, max_model_len)


def crossover_tokens(layout: CacheLayout, size_bytes: int | float) -> int:
    """The shortest context whose per-rank KV (state excluded) reaches ``size_bytes``."""
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size_bytes}")
    return math.ceil(size_bytes / layout.kv_bytes_per_token)


@dataclass(frozen=True)
class Hardware:
    """What a serving profile offers one model replica.

    ``kv_cache_bytes`` is the explicit cache size vLLM is given on CPU
    (``--kv-cache-memory-bytes``): then the cache alone must hold KV and state, and the weights
    live outside it. Otherwise vLLM fills ``memory_per_device_bytes * memory_utilization`` per
    rank with weights first and the cache after.

    Weights are given in total (split evenly over the ranks) or per rank at the layout's TP
    (then other rank counts are scaled from it). Both are estimates: replicated embeddings and
    norms make the real per-rank share a little larger.
    """

    devices: int
    memory_per_device_bytes: int
    memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    weights_bytes: int = 0
    weights_per_rank_bytes: int | None = None
    #: Pipeline stages: each holds a share of the weights (and of the layers' cache).
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"devices must be >= 1, got {self.devices}")
        if self.memory_per_device_bytes <= 0:
            raise ValueError(
                f"memory_per_device_bytes must be > 0, got {self.memory_per_device_bytes}"
            )
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be > 0 when given, got {self.kv_cache_bytes}")
        if self.weights_bytes < 0 or (self.weights_per_rank_bytes or 0) < 0:
            raise ValueError("weights bytes must be >= 0")

    @property
    def usable_per_device_bytes(self) -> int:
        return int(self.memory_per_device_bytes * self.memory_utilization)

    def weights_on_rank(self, tensor_parallel: int, configured_tp: int) -> int:
        """Weight bytes on one rank when the model runs on ``tensor_parallel`` ranks."""
        total = self.weights_bytes
        if self.weights_per_rank_bytes is not None:
            total = self.weights_per_rank_bytes * configured_tp * self.pipeline_parallel
        return math.ceil(total / (tensor_parallel * self.pipeline_parallel))


@dataclass(frozen=True)
class PointFit:
    """Whether one sweep length fits, with the figures that decide it (bytes per rank)."""

    length: int
    decode_tokens: int
    tensor_parallel: int
    cache_dtype: str
    kv_bytes: int
    state_bytes: int
    weights_bytes: int
    overhead_bytes: int
    #: What must fit in ``available_bytes``: everything, or only KV + state when the cache
    #: has an explicit size.
    need_bytes: int
    available_bytes: int
    fits: bool
    #: Longest prompt + decode the configured layout holds.
    max_tokens: int
    #: The smallest change that makes it fit, or why none in this node does; None if it fits.
    suggestion: str | None
    reason: str
    #: vLLM's start-up workspace that grows with ``max_model_len`` (sparse MLA), counted in
    #: ``overhead_bytes`` and the need: a point it pushes past the budget cannot start.
    workspace_bytes: int = 0

    @property
    def cannot_start(self) -> bool:
        """The server sized for this point cannot start: it does not fit, with a workspace."""
        return not self.fits and self.workspace_bytes > 0

    @property
    def slack_bytes(self) -> int:
        """What is left per rank once the point is in: negative when it does not fit."""
        return self.available_bytes - self.need_bytes

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / GIB

    @property
    def need_gib(self) -> float:
        return self.need_bytes / GIB

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


def _gib(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


def _needs(
    layout: CacheLayout,
    hardware: Hardware,
    tokens: int,
    overhead: int,
    configured_tp: int,
    background: tuple[int, int] = (0, 0),
) -> tuple[int, int, int, int, int]:
    """(kv, state, weights, need, available) per rank for ``layout`` on ``hardware``.

    KV and state are what vLLM's allocator needs for one request of ``tokens``, and for the
    ``background`` (requests, tokens each) beside it; the need adds the null block vLLM holds
    back before it checks that the request fits.
    """
    kv, state = layout.request_bytes(tokens)
    requests, each = background
    if requests:
        extra_kv, extra_state = layout.request_bytes(each)
        kv, state = kv + requests * extra_kv, state + requests * extra_state
    assert layout.allocation is not None
    null_block = layout.allocation.bytes_per_block()
    weights = hardware.weights_on_rank(layout.tensor_parallel, configured_tp)
    if hardware.kv_cache_bytes is not None:
        return kv, state, weights, kv + state + null_block, hardware.kv_cache_bytes
    need = kv + state + null_block + weights + overhead
    return kv, state, weights, need, hardware.usable_per_device_bytes


def _alternative_ranks(layout: CacheLayout, hardware: Hardware) -> list[int]:
    """Rank counts above the configured one that this node has and vLLM could shard to."""
    query_heads = text_fields(layout.config).get("num_attention_heads")
    counts = []
    for ranks in range(
        layout.tensor_parallel + 1, hardware.devices // layout.pipeline_parallel + 1
    ):
        if isinstance(query_heads, int) and query_heads % ranks:
            continue
        counts.append(ranks)
    return counts


def _changed(layout: CacheLayout, **changes: Any) -> CacheLayout | None:
    """``layout.with_changes(**changes)``, or None where vLLM would refuse the layout (a
    candidate the search skips, never an error of the profile's own layout)."""
    try:
        return layout.with_changes(**changes)
    except ValueError:  # ParallelLayoutError and the shard rules of capacity.kinds
        return None


def _context_parallel_sizes(layout: CacheLayout) -> list[int]:
    """DCP sizes above the configured one that divide the tensor-parallel ranks."""
    tp = layout.tensor_parallel
    return [d for d in range(layout.decode_context_parallel + 1, tp + 1) if tp % d == 0]


def _with_dcp(layout: CacheLayout, dcp: int, **changes: Any) -> CacheLayout | None:
    """``layout`` at ``dcp`` as a server could run it: a model with state layers needs prefix
    caching off under DCP (see capacity.parallel), so its candidates are built that way."""
    off = dcp > 1 and layout.constant_state_layers > 0
    return _changed(
        layout, decode_context_parallel=dcp, prefix_caching=False if off else None, **changes
    )


def _dcp_words(layout: CacheLayout) -> str:
    """How a suggestion names a DCP layout, with the flag it needs beside the profile key."""
    dcp = layout.decode_context_parallel
    words = f"decode_context_parallel_size = {dcp}"
    if layout.constant_state_layers and not layout.options.get("prefix_caching", True):
        words += " with --no-enable-prefix-caching"
    return words + f" (the KV cache sharded over {dcp} ranks)"


def _smallest_change(layout: CacheLayout, hardware: Hardware, tokens: int, overhead: int) -> str:
    """Fewest devices first, then keeping the cache precision: the first option that fits.

    On the configured ranks: decode context parallelism (the cache sharded over the
    tensor-parallel ranks), then an FP8 cache, then both; then more ranks, and so on.
    """
    configured_tp = layout.tensor_parallel
    want_fp8 = layout.element_bytes > 1

    def fp8_of(candidate: CacheLayout) -> CacheLayout:
        return candidate.with_changes(cache_dtype=FP8_CACHE_DTYPE)

    def options(base: CacheLayout, ranks: int) -> list[tuple[int, CacheLayout, str]]:
        found: list[tuple[int, CacheLayout, str]] = []
        builders = [(dcp, "dcp") for dcp in _context_parallel_sizes(base)]
        if want_fp8:
            builders.append((1, "fp8"))
            builders += [(dcp, "dcp+fp8") for dcp in _context_parallel_sizes(base)]
        for dcp, change in builders:
            candidate = _with_dcp(
                base,
                max(dcp, base.decode_context_parallel),
                cache_dtype=FP8_CACHE_DTYPE if "fp8" in change else None,
            )
            if candidate is not None:  # None: vLLM refuses this layout (capacity.parallel)
                found.append((ranks, candidate, change))
        return found

    if hardware.kv_cache_bytes is not None:
        kv, state, weights, need, _ = _needs(layout, hardware, tokens, overhead, configured_tp)
        if need + weights <= hardware.usable_per_device_bytes:
            return (
                f"a KV cache of at least {_gib(need)} (--kv-cache-memory-bytes {need}) "
                f"would hold it beside {_gib(weights)} of weights"
            )
        if want_fp8:
            fp8_need = _needs(fp8_of(layout), hardware, tokens, overhead, configured_tp)[3]
            if fp8_need <= hardware.kv_cache_bytes:
                return f"an FP8 KV cache ({FP8_CACHE_DTYPE}) would need {_gib(fp8_need)}"
        return "no change within this node fits it"

    candidates = options(layout, configured_tp)
    for ranks in _alternative_ranks(layout, hardware):
        wider = _changed(layout, tensor_parallel=ranks)
        if wider is None:
            continue  # vLLM cannot shard this model over that many ranks
        candidates.append((ranks, wider, "ranks"))
        candidates += [(ranks, c, f"ranks+{change}") for _, c, change in options(wider, ranks)]
    for ranks, candidate, change in candidates:
        need, available = _needs(candidate, hardware, tokens, overhead, configured_tp)[3:]
        if need > available:
            continue
        per_rank = f"{_gib(need)} of {_gib(available)} per rank"
        words = []
        if change.startswith("ranks"):
            words.append(f"{ranks} tensor-parallel ranks")
        if "dcp" in change:
            words.append(_dcp_words(candidate))
        if "fp8" in change:
            words.append(f"an FP8 KV cache ({FP8_CACHE_DTYPE})")
        said = f"{' with '.join(words)} would need {per_rank}"
        if "dcp" in change and candidate.decode_context_parallel < candidate.tensor_parallel:
            # DCP over every tensor-parallel rank: the most headroom this layout can give.
            widest = _changed(candidate, decode_context_parallel=candidate.tensor_parallel)
            if widest is not None:
                widest_need = _needs(widest, hardware, tokens, overhead, configured_tp)[3]
                said += f" (= {widest.decode_context_parallel}: {_gib(widest_need)})"
        return said
    return _across_nodes(layout, hardware, tokens, overhead)


#: Node counts the plan tries when no change within the node fits (pipeline stages over Ray).
NODE_COUNTS = (2, 4, 8)


def _across_nodes(layout: CacheLayout, hardware: Hardware, tokens: int, overhead: int) -> str:
    """Pipeline parallel over more nodes of the same kind: each stage caches its own layers
    and holds its share of the weights."""
    configured_tp = layout.tensor_parallel
    for nodes in NODE_COUNTS:
        pp = layout.pipeline_parallel * nodes
        deeper = _changed(layout, pipeline_parallel=pp)
        if deeper is None:
            continue
        more = replace(hardware, devices=hardware.devices * nodes, pipeline_parallel=pp)
        sharded = [_with_dcp(deeper, d) for d in _context_parallel_sizes(deeper)]
        for candidate in (deeper, *[c for c in sharded if c is not None]):
            try:
                need, available = _needs(candidate, more, tokens, overhead, configured_tp)[3:]
            except ValueError:
                continue
            if need <= available:
                dcp = candidate.decode_context_parallel
                return (
                    f"no change within this node fits it; {nodes}x the devices over Ray "
                    f'(pipeline_parallel_size = {pp}, [hardware] nodes, executor = "ray")'
                    + (f" with {_dcp_words(candidate)}" if dcp > 1 else "")
                    + f" would need {_gib(need)} of {_gib(available)} per rank"
                )
    return "no change within this node fits it"


def _budget_words(
    hardware: Hardware, kv: int, state: int, weights: int, available: int, overhead: int
) -> tuple[str, str]:
    """What the point must fit in, and what it needs, as a reason line says them."""
    if hardware.kv_cache_bytes is not None:
        budget = f"the {_gib(available)} KV cache (--kv-cache-memory-bytes)"
        parts = f"KV {_gib(kv)} + state {_gib(state)}; weights {_gib(weights)} sit outside it"
        return budget, parts
    budget = (
        f"{_gib(available)} available ({_gib(hardware.memory_per_device_bytes)} x "
        f"{hardware.memory_utilization:g})"
    )
    parts = f"KV {_gib(kv)} + state {_gib(state)} + weights {_gib(weights)}"
    if overhead:
        parts += f" + overhead {_gib(overhead)}"
    return budget, parts


def fit_point(
    layout: CacheLayout,
    hardware: Hardware,
    length: int,
    decode_tokens: int = 0,
    *,
    overhead_bytes_per_rank: int = 0,
    background: tuple[int, int] = (0, 0),
    workspace: Callable[[int], int] | None = None,
) -> PointFit:
    """Does a ``length``-token prompt plus ``decode_tokens`` fit one rank, and if not, what would.

    ``overhead_bytes_per_rank`` is memory vLLM holds outside weights and cache (activations,
    graphs, workspaces); it counts against the device budget, not an explicit cache size.
    ``background`` is (requests, tokens each) that run beside it: an interference point's
    background streams. ``workspace`` gives the bytes per rank vLLM reserves at start-up for
    a ``max_model_len`` (the point's tokens; :mod:`~pytest_longctx.capacity.workspace`).
    """
    if length <= 0 or decode_tokens < 0:
        raise ValueError(
            f"length must be > 0 and decode_tokens >= 0, got {length} and {decode_tokens}"
        )
    if layout.tensor_parallel > hardware.devices:
        raise ValueError(
            f"the layout uses {layout.tensor_parallel} tensor-parallel ranks but the hardware "
            f"has {hardware.devices} devices"
        )
    tokens = length + decode_tokens
    tp = layout.tensor_parallel
    reserved = workspace(tokens) if workspace and hardware.kv_cache_bytes is None else 0
    overhead = overhead_bytes_per_rank + reserved
    kv, state, weights, need, available = _needs(layout, hardware, tokens, overhead, tp, background)
    fits = need <= available
    max_tokens = _max_tokens(
        layout, hardware, overhead_bytes_per_rank, workspace if reserved else None
    )

    what = format_size(length) + (f" + {decode_tokens} decode" if decode_tokens else "")
    if background[0]:
        what += f" beside {background[0]} background requests of {background[1]} tokens"
    budget, parts = _budget_words(hardware, kv, state, weights, available, overhead_bytes_per_rank)
    if reserved:
        parts += f" + start-up workspace {_gib(reserved)}"
    ranks = f"TP={tp}" + (
        f", DCP={layout.decode_context_parallel}" if layout.decode_context_parallel > 1 else ""
    )
    head = f"{what} at {ranks}, KV {layout.cache_dtype}: needs {_gib(need)} per rank ({parts})"
    if fits:
        suggestion = None
        reason = f"{head}; fits in {budget}"
    else:
        suggestion = _smallest_change(layout, hardware, tokens, overhead)
        verdict = "cannot start: does not fit" if reserved else "does not fit"
        reason = (
            f"{head}; {verdict} in {budget}; as configured at most {max_tokens:,} tokens "
            f"fit; {suggestion}"
        )
    return PointFit(
        length=length,
        decode_tokens=decode_tokens,
        tensor_parallel=tp,
        cache_dtype=layout.cache_dtype,
        kv_bytes=kv,
        state_bytes=state,
        weights_bytes=weights,
        overhead_bytes=0 if hardware.kv_cache_bytes is not None else overhead,
        need_bytes=need,
        available_bytes=available,
        fits=fits,
        max_tokens=max_tokens,
        suggestion=suggestion,
        reason=reason,
        workspace_bytes=reserved,
    )


def _max_tokens(
    layout: CacheLayout,
    hardware: Hardware,
    overhead: int,
    workspace: Callable[[int], int] | None,
) -> int:
    """The longest prompt + decode the configured layout holds: with a workspace, the
    largest ``max_model_len`` whose cache and workspace fit together."""
    assert layout.allocation is not None
    available = (
        hardware.kv_cache_bytes
        if hardware.kv_cache_bytes is not None
        else hardware.usable_per_device_bytes
    )
    fixed = 0
    if hardware.kv_cache_bytes is None:
        fixed = hardware.weights_on_rank(layout.tensor_parallel, layout.tensor_parallel) + overhead
    bound = layout.allocation.max_tokens(available - fixed) if available > fixed else 0
    if workspace is None or bound < 1:
        return bound

    def starts(tokens: int) -> bool:
        need = _needs(
            layout, hardware, tokens, overhead + workspace(tokens), layout.tensor_parallel
        )
        return need[3] <= need[4]

    return largest_passing(starts, 1, bound) or 0


def capacity_table(
    layout: CacheLayout,
    hardware: Hardware,
    lengths: Iterable[int],
    decode_tokens: int = 0,
    *,
    overhead_bytes_per_rank: int = 0,
    background: tuple[int, int] = (0, 0),
    workspace: Callable[[int], int] | None = None,
) -> list[PointFit]:
    """One :class:`PointFit` per sweep length, in the order given."""
    return [
        fit_point(
            layout,
            hardware,
            length,
            decode_tokens,
            overhead_bytes_per_rank=overhead_bytes_per_rank,
            background=background,
            workspace=workspace,
        )
        for length in lengths
    ]


#: A point that fits with less than this share of the budget to spare reads as borderline.
BORDERLINE_SLACK = 0.05


def _verdict(row: PointFit) -> str:
    if row.cannot_start:
        return "cannot start"
    if not row.fits:
        return "NO"
    return "borderline" if row.slack_bytes < BORDERLINE_SLACK * row.available_bytes else "yes"


def render_capacity_table(rows: Sequence[PointFit], layout: CacheLayout | None = None) -> str:
    """Plain-text table for a terminal; the full reason of each point that does not fit below."""
    lines = []
    if layout is not None:
        lines.append(describe_layout(layout))
    header = ("length", "tokens", "KV GiB/rank", "need GiB", "avail GiB", "slack GiB", "fits")
    table = [header]
    for row in rows:
        table.append(
            (
                format_size(row.length),
                f"{row.length + row.decode_tokens:,}",
                f"{row.kv_gib:.2f}",
                f"{row.need_gib:.2f}",
                f"{row.available_gib:.2f}",
                f"{row.slack_bytes / GIB:.2f}",
                _verdict(row),
            )
        )
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    for index, cells in enumerate(table):
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    for row in rows:
        if not row.fits:
            lines.append(f"{format_size(row.length)}: {row.reason}")
    return "\n".join(lines)
