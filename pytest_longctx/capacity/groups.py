"""vLLM's KV-cache allocator, in the stdlib: groups, page sizes, and one request's blocks.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` (0.32) for the layer-outer cache layouts the
GPU attention backends use: layers are grouped by spec (one group when all layers agree or
all need the same token slots; otherwise page sizes are unified, the smallest layer count of
a kind is the group size and the rest padded), a block of the shared pool costs the widest
group's pages, and one request needs the sum of every group's blocks. ``oracle.py`` asks
vLLM's own functions the same question where vLLM is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .kinds import LayerKind

_ATTENTION = ("full", "mla", "indexer")  # FullAttentionSpec and its MLA subclasses


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Spec:
    """One layer's cache spec as vLLM's allocator sees it (page bytes per block)."""

    kind: str
    block_size: int
    page_bytes: int
    window: int | None = None
    dcp_sharded: bool = True
    variant: str = ""

    def blocks(self, tokens: int, settings: AllocatorSettings) -> int:
        """Blocks one request of ``tokens`` tokens holds (``max_memory_usage_bytes / page``)."""
        if self.kind == "state":
            return 2 if settings.mamba_cache_mode == "align" else 1
        if self.kind in ("sliding", "chunked"):
            assert self.window is not None, f"a {self.kind} spec is built with its window"
            if self.kind == "sliding":
                held = min(self.window - 1 + settings.in_flight_tokens, tokens)
                return cdiv(held, self.block_size) + 1
            return cdiv(min(self.window + settings.in_flight_tokens, tokens), self.block_size)
        if self.dcp_sharded and settings.dcp > 1:
            tokens = cdiv(tokens, settings.dcp)
        return cdiv(tokens, self.block_size)

    @property
    def uniform_type(self) -> tuple:
        """Layers of one uniform type need the same token slots (vLLM's registry bases)."""
        if self.kind in _ATTENTION:
            return ("full", self.block_size, self.dcp_sharded)
        if self.kind == "state":
            return ("state", self.page_bytes)
        return (self.kind, self.block_size, self.window)


@dataclass(frozen=True)
class AllocatorSettings:
    """The serving options that change what one request holds."""

    block_size: int
    dcp: int = 1
    #: Tokens scheduled but not settled: concurrent batches x max_num_batched_tokens.
    in_flight_tokens: int = 8192 * 2
    #: "align" when prefix caching is on for a hybrid (two state pages per request).
    mamba_cache_mode: str = "none"
    hybrid_allocator: bool = True
    #: A hybrid MLA model's attention block aligns to 128 tokens (vLLM 0.27.0 on).
    hybrid_mla_block_128: bool = True


@dataclass(frozen=True)
class Group:
    """One KV-cache group: the layers sharing a block table, each with its spec."""

    layers: tuple[tuple[int, str], ...]  # (layer index, kind)
    specs: tuple[Spec, ...]

    def blocks(self, tokens: int, settings: AllocatorSettings) -> int:
        return max(spec.blocks(tokens, settings) for spec in self.specs)


@dataclass(frozen=True)
class Allocation:
    """vLLM's groups for a model, and what one request costs on the worst pipeline stage."""

    groups: tuple[Group, ...]
    settings: AllocatorSettings
    #: Each stage's layer indices [start, end).
    stages: tuple[tuple[int, int], ...]
    #: The attention block size after hybrid alignment (what cache_config_info reports).
    block_size: int
    #: "uniform", "uniform type" or "hybrid": which of vLLM's grouping paths applies.
    path: str

    def _stage_groups(self, stage: tuple[int, int]) -> list[tuple[list[Spec], Group]]:
        start, end = stage
        out = []
        for group in self.groups:
            mine = [
                spec
                for (index, _), spec in zip(group.layers, group.specs, strict=True)
                if start <= index < end
            ]
            out.append((mine, group))
        return out

    def bytes_per_block(self, stage: tuple[int, int] | None = None) -> int:
        """One block of the shared pool: the widest group's pages on a stage."""
        stages = [stage] if stage else list(self.stages)
        return max(
            max((sum(s.page_bytes for s in mine) for mine, _ in self._stage_groups(st)), default=0)
            for st in stages
        )

    def blocks_per_request(self, tokens: int) -> int:
        """Every group's blocks for one request: projected groups keep their block tables
        even where a stage holds none of their layers, as vLLM's projection does."""
        return sum(group.blocks(tokens, self.settings) for group in self.groups)

    def _worst_stage(self, tokens: int) -> tuple[int, int]:
        return max(
            self.stages, key=lambda st: self.bytes_per_block(st) * self.blocks_per_request(tokens)
        )

    def request_bytes(self, tokens: int) -> tuple[int, int]:
        """(growing, constant-state) bytes one request of ``tokens`` needs on the fullest rank.

        Their sum is ``_max_memory_usage_bytes_from_groups``: the pool's block cost times the
        request's blocks; the state part is the blocks of the state groups.
        """
        stage = self._worst_stage(tokens)
        per_block = self.bytes_per_block(stage)
        state_blocks = sum(
            g.blocks(tokens, self.settings) for g in self.groups if g.specs[0].kind == "state"
        )
        total = self.blocks_per_request(tokens)
        return per_block * (total - state_blocks), per_block * state_blocks

    def token_capacity(self, kv_cache_bytes: int, max_model_len: int) -> int:
        """vLLM's group-aware ``kv_cache_size_tokens`` for a cache of ``kv_cache_bytes``."""
        stage = max(self.stages, key=self.bytes_per_block)
        num_blocks = kv_cache_bytes // self.bytes_per_block(stage)
        return int(num_blocks / self.blocks_per_request(max_model_len) * max_model_len)

    def tokens_for_blocks(self, used_blocks: int, limit: int = 2**40) -> int:
        """The tokens one request holds when it holds ``used_blocks`` blocks of the pool: the
        inverse of :meth:`blocks_per_request`, so a hybrid's windows and state pages are not
        counted as prompt tokens (what the KV usage gauge needs)."""
        if used_blocks < self.blocks_per_request(1):
            return 0
        low, high = 1, 2
        while high < limit and self.blocks_per_request(high) <= used_blocks:
            low, high = high, high * 2
        while low < high - 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.blocks_per_request(mid) <= used_blocks else (low, mid)
        return low

    def max_tokens(self, available_bytes: int, limit: int = 2**40) -> int:
        """The longest request that fits ``available_bytes`` (after the null block)."""

        def fits(tokens: int) -> bool:
            kv, state = self.request_bytes(tokens)
            return kv + state + self.bytes_per_block(self._worst_stage(tokens)) <= available_bytes

        if not fits(1):
            return 0
        low, high = 1, 2
        while high < limit and fits(high):
            low, high = high, high * 2
        while low < high - 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low


def layer_specs(
    layers: Sequence[LayerKind], settings: AllocatorSettings
) -> tuple[list[tuple[tuple[int, str], Spec]], int]:
    """Each layer's spec after the platform's hybrid alignment, and the block size it chose.

    A model with state layers raises its attention block until one attention page holds a
    state page (MLA aligns to 128 tokens where the release does), then pads the state page to it
    (``Platform._align_hybrid_block_size``).
    """
    block = settings.block_size
    attention = [layer for layer in layers if layer.grows]
    states = [layer for layer in layers if not layer.grows]
    state_page = max((layer.state_bytes for layer in states), default=0)
    if states and attention:
        per_token = attention[0].bytes_per_token
        mla = attention[0].kind == "mla" and settings.hybrid_mla_block_128
        align = max(block, 128) if mla else block
        block = max(block, align * cdiv(state_page, align * per_token))
        state_page = max(state_page, block * per_token)
    specs = []
    for layer in layers:
        key = (layer.index, layer.kind)
        if layer.grows:
            kind = layer.kind
            if not settings.hybrid_allocator and kind in ("sliding", "chunked"):
                kind = "full"  # --disable-hybrid-kv-cache-manager: windows cached in full
            specs.append(
                (
                    key,
                    Spec(
                        kind,
                        block,
                        block * layer.bytes_per_token,
                        None if kind == "full" else layer.window,
                        variant=layer.variant,
                    ),
                )
            )
        else:
            specs.append((key, Spec("state", block, state_page, dcp_sharded=False)))
    return specs, block


def allocate(
    layers: Sequence[LayerKind],
    settings: AllocatorSettings,
    stages: Sequence[tuple[int, int]],
) -> Allocation:
    """vLLM's ``get_kv_cache_groups`` for these layers (the layer-outer layout's path)."""
    specs, block = layer_specs(layers, settings)
    if not specs:
        raise ValueError("the model caches nothing: no attention or state layers")
    first = specs[0][1]
    if all(spec == first for _, spec in specs):
        groups = [Group(tuple(k for k, _ in specs), tuple(s for _, s in specs))]
        path = "uniform"
    elif len({spec.uniform_type for _, spec in specs}) == 1:
        groups = [Group(tuple(k for k, _ in specs), tuple(s for _, s in specs))]
        path = "uniform type"
    else:
        groups = _hybrid_groups(_unify_page_sizes(specs))
        path = "hybrid"
    return Allocation(
        tuple(groups), replace(settings, block_size=block), tuple(stages), block, path
    )


def _unify_page_sizes(
    specs: list[tuple[tuple[int, str], Spec]],
) -> list[tuple[tuple[int, str], Spec]]:
    """``unify_kv_cache_spec_page_size``: grow smaller attention blocks, pad the rest."""
    largest = max(spec.page_bytes for _, spec in specs)
    unified = []
    for key, spec in specs:
        if spec.page_bytes == largest:
            unified.append((key, spec))
        elif spec.kind == "state":
            unified.append((key, replace(spec, page_bytes=largest)))
        elif largest % spec.page_bytes == 0:
            ratio = largest // spec.page_bytes
            unified.append(
                (key, replace(spec, block_size=spec.block_size * ratio, page_bytes=largest))
            )
        elif spec.kind in ("mla", "indexer"):
            raise ValueError(
                f"layer {key[0]}: an MLA page of {spec.page_bytes} B does not divide the "
                f"largest page of {largest} B; vLLM cannot pad MLA pages"
            )
        else:
            unified.append((key, replace(spec, page_bytes=largest)))
    return unified


def _hybrid_groups(specs: list[tuple[tuple[int, str], Spec]]) -> list[Group]:
    """``_get_kv_cache_groups_uniform_page_size``: equal-size groups, padded, strided."""
    buckets: dict[Spec, list[tuple[int, str]]] = {}
    for key, spec in specs:
        buckets.setdefault(spec, []).append(key)
    counts = [len(keys) for keys in buckets.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups = []
    for spec, keys in buckets.items():
        num_groups = cdiv(len(keys), group_size)
        for i in range(num_groups):
            members = keys[i::num_groups]
            groups.append(Group(tuple(members), (spec,) * len(members)))
    return groups


def describe_groups(allocation: Allocation) -> str:
    """``3 groups (hybrid): 7 x mla, 7+7+6 x state; block 128 tokens``."""
    by_kind: dict[str, list[int]] = {}
    for group in allocation.groups:
        kinds: dict[str, int] = {}
        for spec in group.specs:  # a uniform-type group holds several (MLA and its indexer)
            kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
        for kind, count in kinds.items():
            by_kind.setdefault(kind, []).append(count)
    parts = [f"{'+'.join(map(str, sizes))} x {kind}" for kind, sizes in by_kind.items()]
    count = len(allocation.groups)
    return (
        f"{count} KV-cache group{'s' if count != 1 else ''} ({allocation.path}): "
        f"{', '.join(parts)}; block {allocation.block_size} tokens"
    )
