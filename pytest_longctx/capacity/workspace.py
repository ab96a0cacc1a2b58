"""vLLM's sparse-MLA workspace: buffers reserved at start-up that grow with ``max_model_len``.

DeepSeek-V3.2's indexer and its sparse attention reserve their buffers during vLLM's memory
profiling (the dummy run of ``max_num_batched_tokens`` tokens), in one workspace per rank
that takes the largest of the requests made of it (``v1/worker/workspace.py``:
``_ensure_workspace_size`` grows it to the larger request; ``get_simultaneous`` sums the
tensors of one request, each rounded up to 256 B). What profiling holds is not there for the
KV cache, and a workspace larger than the memory left after the weights stops the start.
Each rule below was read from the release's published source:

* **ROCm** (``ROCM_AITER_MLA_SPARSE``, ``v1/attention/ops/rocm_aiter_mla_sparse.py``,
  ``rocm_aiter_sparse_attn_indexer``'s profiling branch): the prefill keys,
  ``(entries, index_head_dim)`` FP8 and ``(entries, 4)`` scale bytes, and the decode logits,
  ``(rows, max_model_len)`` float32 on gfx942 and gfx950 (MI300 series, MI355X), in two
  requests. Up to 0.29.0 ``rows`` is the dummy run's token count, ``max_num_batched_tokens``
  (lines 687-689 in 0.25.1); from 0.30.0 it is ``min(max_num_batched_tokens, max_num_seqs x
  (1 + speculative tokens))`` (``_max_decode_logits_rows``).
* **CUDA** (``model_executor/layers/sparse_attn_indexer.py``, ``sparse_attn_indexer``'s
  profiling branch): the prefill keys and a fixed top-k scratch in one request; and
  FLASHMLA_SPARSE with an ``fp8_ds_mla`` cache (``v1/attention/backends/mla/
  flashmla_sparse.py``) its query buffer ``(max_num_batched_tokens, heads per rank, 576)``
  BF16 beside a prefill buffer of ``(factor x max_model_len, 576)`` BF16 in one request. The
  decode logits are not reserved there (DeepGEMM allocates them per step).
* The prefill key ``entries``: ``max_model_len x 40`` up to 0.31.0 (``v1/attention/backends/
  mla/indexer.py``'s ``get_max_prefill_buffer_size``, lines 227-237 in 0.25.1); from 0.32.0
  ``max_model_len x (576 x 2 // 132) x factor``, the factor ``--attention-config
  '{"sparse_mla_prefill_workspace_factor": N}'`` or, unset, 5 up to a ``max_model_len`` of
  256Ki and 2 above (``config/vllm.py``); FlashMLA-sparse's prefill buffer is ``5 x
  max_model_len`` rows before 0.32.0 and ``factor x max_model_len`` from it.

Buffers that do not grow with ``max_model_len`` (MoE and MLA query scratch, the transient
logits of ``VLLM_SPARSE_INDEXER_MAX_LOGITS_MB``) stay in ``[hardware] reserve_per_device``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from .layout import GIB

#: ``get_simultaneous`` rounds each tensor of a request up to this many bytes.
ALIGN = 256
#: From this release the ROCm decode logits are bounded by ``max_num_seqs``.
DECODE_ROWS_BY_SEQS_FROM = Version("0.30.0")
#: From this release the prefill buffers are sized by ``sparse_mla_prefill_workspace_factor``.
PREFILL_FACTOR_FROM = Version("0.32.0")
#: The prefill key entries per token of ``max_model_len`` before :data:`PREFILL_FACTOR_FROM`.
LEGACY_PREFILL_ENTRIES = 40
#: FlashMLA-sparse's prefill rows per token of ``max_model_len`` before the factor.
LEGACY_FLASHMLA_ROWS = 5
#: The factor vLLM picks when none is given: 5 up to this ``max_model_len``, 2 above.
FACTOR_SHORT, FACTOR_LONG, FACTOR_SHORT_UP_TO = 5, 2, 256 * 1024
#: One MLA row in BF16 (``kv_lora_rank + qk_rope_head_dim`` = 576 elements).
MLA_ROW_BF16 = 576 * 2
#: Bytes of one indexer key's scale (float32) beside its FP8 elements.
SCALE_BYTES = 4
#: The CUDA indexer's top-k scratch (``RADIX_TOPK_WORKSPACE_SIZE``), in its profiling request.
RADIX_TOPK_WORKSPACE_BYTES = 1024 * 1024
ROCM_BACKEND = "ROCM_AITER_MLA_SPARSE"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class WorkspaceSettings:
    """What decides the workspace of one rank: the release, the backend and the limits."""

    release: str
    backend: str  # the sparse-MLA attention backend (capacity.kinds.SPARSE_MLA_BACKENDS)
    max_num_batched_tokens: int
    max_num_seqs: int
    index_head_dim: int
    speculative_tokens: int = 0
    #: ``sparse_mla_prefill_workspace_factor`` as given (from 0.32.0); None: vLLM's choice.
    prefill_factor: int | None = None
    #: The cache is kept as ``fp8_ds_mla`` (FlashMLA-sparse reserves its prefill buffer then).
    packed_cache: bool = False
    heads_per_rank: int = 0

    def __post_init__(self) -> None:
        if min(self.max_num_batched_tokens, self.max_num_seqs, self.index_head_dim) < 1:
            raise ValueError(
                "max_num_batched_tokens, max_num_seqs and index_head_dim must be >= 1, got "
                f"{self.max_num_batched_tokens}, {self.max_num_seqs}, {self.index_head_dim}"
            )

    @property
    def version(self) -> Version:
        return Version(self.release)

    @property
    def rocm(self) -> bool:
        return self.backend == ROCM_BACKEND

    def decode_rows(self) -> int:
        """Rows of the ROCm decode logits buffer the profiling run reserves."""
        if self.version < DECODE_ROWS_BY_SEQS_FROM:
            return self.max_num_batched_tokens
        return min(self.max_num_batched_tokens, self.max_num_seqs * (1 + self.speculative_tokens))

    def factor(self, max_model_len: int) -> int | None:
        """The prefill workspace factor for ``max_model_len`` (None before it existed)."""
        if self.version < PREFILL_FACTOR_FROM:
            return None
        if self.prefill_factor is not None:
            return self.prefill_factor
        return FACTOR_SHORT if max_model_len <= FACTOR_SHORT_UP_TO else FACTOR_LONG

    def prefill_entries(self, max_model_len: int) -> int:
        """Indexer keys the prefill buffer holds (``get_max_prefill_buffer_size``)."""
        factor = self.factor(max_model_len)
        if factor is None:
            return max_model_len * LEGACY_PREFILL_ENTRIES
        return max_model_len * (MLA_ROW_BF16 // (self.index_head_dim + SCALE_BYTES)) * factor


@dataclass(frozen=True)
class Workspace:
    """The workspace one rank reserves at a ``max_model_len``, and its requests."""

    max_model_len: int
    prefill_bytes: int
    decode_bytes: int  # 0 where the backend reserves none (CUDA)
    attention_bytes: int  # FlashMLA-sparse's query and prefill buffers (0 elsewhere)
    settings: WorkspaceSettings

    @property
    def bytes(self) -> int:
        """What the workspace holds: the largest request made of it."""
        return max(self.prefill_bytes, self.decode_bytes, self.attention_bytes)

    @property
    def largest(self) -> str:
        """Which buffer decides the workspace, in words with its shape."""
        s, n = self.settings, self.max_model_len
        if self.bytes == self.decode_bytes:
            bound = (
                "max_num_batched_tokens"
                if s.version < DECODE_ROWS_BY_SEQS_FROM
                else "min(max_num_batched_tokens, max_num_seqs x (1 + speculative tokens))"
            )
            return f"decode logits {s.decode_rows():,} rows ({bound}) x {n:,} x 4 B"
        if self.bytes == self.prefill_bytes:
            entries = s.prefill_entries(n)
            return (
                f"indexer prefill keys {entries:,} x {s.index_head_dim + SCALE_BYTES} B "
                f"({entries // n} per token of max_model_len)"
            )
        return f"FlashMLA-sparse prefill buffer of {n:,} x {MLA_ROW_BF16} B rows x factor"

    def describe(self) -> str:
        return (
            f"{self.bytes / GIB:.2f} GiB per rank of sparse-MLA workspace at max_model_len "
            f"{self.max_model_len:,} (vLLM {self.settings.release}, {self.settings.backend}: "
            f"{self.largest})"
        )


def workspace_for(settings: WorkspaceSettings, max_model_len: int) -> Workspace:
    """The workspace ``settings`` reserve at ``max_model_len`` on one rank."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    entries = settings.prefill_entries(max_model_len)
    keys = _aligned(entries * settings.index_head_dim) + _aligned(entries * SCALE_BYTES)
    if settings.rocm:
        decode = _aligned(settings.decode_rows() * max_model_len * 4)
        return Workspace(max_model_len, keys, decode, 0, settings)
    prefill = keys + _aligned(RADIX_TOPK_WORKSPACE_BYTES)
    attention = 0
    if settings.backend == "FLASHMLA_SPARSE" and settings.packed_cache:
        factor = settings.factor(max_model_len) or LEGACY_FLASHMLA_ROWS
        query = settings.max_num_batched_tokens * settings.heads_per_rank * MLA_ROW_BF16
        attention = _aligned(query) + _aligned(factor * max_model_len * MLA_ROW_BF16)
    return Workspace(max_model_len, prefill, 0, attention, settings)


def largest_passing(passes: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest ``n`` in ``low..high`` for which ``passes(n)`` holds, where it holds for
    every ``n`` below one that holds; None when it fails at ``low``."""
    if not passes(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if passes(middle):
            low = middle
        else:
            high = middle - 1
    return low
