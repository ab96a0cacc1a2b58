"""How many requests of one length fit the KV cache at once: the plan's figure and vLLM's.

vLLM's block pool holds ``num_blocks`` blocks and keeps the first one back as its null block
(``BlockPool.null_block``), so ``num_blocks - 1`` are there for requests. A request of
``tokens`` tokens (its prompt and its decode) holds every group's blocks for them
(:meth:`~pytest_longctx.capacity.groups.Allocation.blocks_per_request`, whole blocks), so
``(num_blocks - 1) // blocks`` such requests fit together; one more must wait for room or
push another out (a preemption). vLLM's own figure (``kv_cache_max_concurrency``, the
"Maximum concurrency for N tokens per request" of its log) is ``num_blocks / blocks``: the
pool's blocks over one request's, the null block counted, and a fraction. vLLM reports it at
``--max-model-len`` only; here it is asked at each length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_longctx.core.sizes import format_size

from .groups import Allocation

#: Blocks of the pool no request can hold: vLLM's null block.
NULL_BLOCKS = 1


@dataclass(frozen=True)
class ConcurrencyFit:
    """Requests of one length that fit a pool of ``num_blocks`` blocks at once."""

    length: int
    decode_tokens: int
    block_size: int
    num_blocks: int
    #: Every group's blocks one request of ``length + decode_tokens`` tokens holds.
    blocks_per_request: int
    #: Where ``num_blocks`` came from: "plan" (the cache size over the plan's bytes per
    #: block) or "server" (the server's ``vllm:cache_config_info``).
    source: str = "plan"

    @property
    def tokens(self) -> int:
        return self.length + self.decode_tokens

    @property
    def fit(self) -> int:
        """The most requests that hold their blocks together."""
        return max(0, self.num_blocks - NULL_BLOCKS) // self.blocks_per_request

    @property
    def vllm_concurrency(self) -> float:
        """vLLM's ``kv_cache_max_concurrency`` had ``--max-model-len`` been ``tokens``."""
        return self.num_blocks / self.blocks_per_request

    def describe(self) -> str:
        return (
            f"{self.fit} at once ({self.num_blocks:,} blocks of {self.block_size} tokens "
            f"from the {self.source}, {self.blocks_per_request} per request of "
            f"{self.tokens:,} tokens, one held back; vLLM says {self.vllm_concurrency:.2f}x)"
        )


def pool_blocks(allocation: Allocation, kv_cache_bytes: int) -> int:
    """The blocks vLLM makes of ``kv_cache_bytes`` (the widest stage's block cost)."""
    if kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes}")
    return kv_cache_bytes // allocation.bytes_per_block()


def concurrency_fit(
    allocation: Allocation,
    num_blocks: int,
    length: int,
    decode_tokens: int,
    source: str = "plan",
) -> ConcurrencyFit:
    """How many ``length`` + ``decode_tokens`` requests fit ``num_blocks`` blocks.

    ``allocation`` must be at the server's block size (``layout.with_changes(block_size=...)``
    when the server reports one)."""
    if length <= 0 or decode_tokens < 0:
        raise ValueError(
            f"length must be > 0 and decode_tokens >= 0, got {length} and {decode_tokens}"
        )
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
    return ConcurrencyFit(
        length=length,
        decode_tokens=decode_tokens,
        block_size=allocation.block_size,
        num_blocks=num_blocks,
        blocks_per_request=allocation.blocks_per_request(length + decode_tokens),
        source=source,
    )


def render_fit_table(fits: list[ConcurrencyFit]) -> str:
    """Plain text: one row per length, the plan's fit beside vLLM's figure."""
    header = ("length", "tokens", "blocks/request", "pool blocks", "fit", "vLLM")
    rows = [header] + [
        (
            format_size(f.length),
            f"{f.tokens:,}",
            str(f.blocks_per_request),
            f"{f.num_blocks:,}",
            str(f.fit),
            f"{f.vllm_concurrency:.2f}x",
        )
        for f in fits
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for index, cells in enumerate(rows):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class FitVerdict:
    """A length's measured fit beside the plan's and vLLM's."""

    length: int
    #: The largest level that ran at once with the next level up not running at once; when
    #: the next measured level is more than one above, ``measured_upper`` bounds it.
    measured: int | None
    measured_upper: int | None
    planned: int | None
    vllm: float | None

    @property
    def exact(self) -> bool:
        return self.measured is not None and self.measured_upper == self.measured

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "not measured: no level ran at once"
        if self.planned is None:
            return "no plan to compare (the model's config is not at hand)"
        if self.exact:
            if self.measured == self.planned:
                return "agrees"
            return f"DIFFERS: {self.measured} ran at once, the plan says {self.planned}"
        upper = "no limit found" if self.measured_upper is None else f"<= {self.measured_upper}"
        if self.measured <= self.planned and (
            self.measured_upper is None or self.planned <= self.measured_upper
        ):
            return f"consistent: between {self.measured} and {upper}"
        return f"DIFFERS: measured {self.measured}..{upper}, the plan says {self.planned}"

    def to_json(self) -> dict[str, Any]:
        return {
            "fit_measured": self.measured if self.exact else None,
            "fit_measured_at_least": self.measured,
            "fit_measured_at_most": self.measured_upper,
            "fit_planned": self.planned,
            "fit_vllm": self.vllm,
            "verdict": self.verdict,
        }


def fit_verdict(
    length: int, ran: Mapping[int, bool], planned: int | None, vllm: float | None
) -> FitVerdict:
    """``ran``: each measured level and whether it ran at once. The measured fit is the
    largest level that ran below the first that did not."""
    levels = sorted(ran)
    first_failed = next((c for c in levels if not ran[c]), None)
    below = [c for c in levels if ran[c] and (first_failed is None or c < first_failed)]
    measured = max(below) if below else None
    upper = None if first_failed is None else first_failed - 1
    if measured is None and first_failed == 1:
        measured, upper = 0, 0
    return FitVerdict(length, measured, upper, planned, vllm)
