"""Every layer kind vLLM caches, read from a config.json the way vLLM's model code reads it.

One :class:`LayerKind` per decoder layer that holds a cache, for one tensor-parallel rank:

* ``full``: MHA/GQA, ``2 x max(1, kv_heads // tp) x head_dim`` elements per token;
* ``mla``: one ``kv_lora_rank + qk_rope_head_dim`` latent per token, the same on every rank;
  sparse MLA (DeepSeek-V3.2, ``index_topk``) keeps the row its attention backend keeps
  (:data:`SPARSE_MLA_BACKENDS`: packed ``fp8_ds_mla`` rows of 656 B, or the latent in the cache
  dtype) and adds an ``indexer`` layer of ``index_head_dim + index_head_dim / 128 x 4`` B;
* ``sliding``: a window of ``W`` tokens (``layer_types``, gpt-oss's even layers by index,
  Mistral-style uniform ``sliding_window``);
* ``chunked``: Llama 4's chunked local attention (``attention_chunk_size``; NoPE layers are
  full attention);
* ``state``: constant per-request state (Mamba1, Mamba2, Gated DeltaNet, KDA, short
  convolutions) in its own dtypes, sharded over the tensor-parallel ranks; which Mamba a
  ``mamba`` layer is and which fields size it is the model's (:data:`MAMBA2_FIELDS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_longctx.profiles.extra_args import MAMBA_DTYPES

#: Bytes of one ``fp8_ds_mla`` row: 512 FP8 NoPE elements, 16 B of scales and 64 BF16 RoPE
#: elements, for DeepSeek-V3.2 in every supported vLLM: ``v1/kv_cache_interface.py:381-388``
#: (0.25.1); the spec's ``state_content_bytes`` at ``model_executor/layers/attention/
#: mla_attention.py:1159`` (0.28.0), ``:1220`` (0.29.0), ``:1365`` (0.32.0), ``:1386`` (0.33.0),
#: and from ``MLAAttentionImpl.get_fp8_ds_mla_row_bytes`` (``v1/attention/backend.py:1017``,
#: 0.34.0; FlashInfer-sparse SM120 keeps 528 B there only for a model without RoPE dims).
FP8_DS_MLA_BYTES = 656
#: The DeepSeek-V3.2 indexer quantises its keys in blocks of this many elements (fp32 scale).
INDEXER_QUANT_BLOCK = 128
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "uint8": 1}


@dataclass(frozen=True)
class SparseMLABackend:
    """One of vLLM's sparse-MLA attention backends, where vLLM picks it, and the row it keeps
    per token and layer for DeepSeek-V3.2."""

    name: str
    gpus: str  # which GPUs vLLM runs it on, in words
    #: The ``--kv-cache-dtype`` values (after DeepSeek-V3.2's ``bfloat16`` -> ``auto``) it keeps
    #: as ``fp8_ds_mla`` rows of :data:`FP8_DS_MLA_BYTES`; any other keeps the latent in the
    #: cache dtype: ``kv_lora_rank + qk_rope_head_dim`` elements (576 B for FP8).
    packs: frozenset[str] = frozenset()


#: vLLM's sparse-MLA backends by ``--attention-backend`` name. Which dtypes become
#: ``fp8_ds_mla`` is ``_canonicalize_sparse_mla_kv_cache_dtype`` in ``model_executor/layers/
#: attention/mla_attention.py`` (FLASHMLA_SPARSE: any quantized dtype; FLASHINFER_MLA_SPARSE_SM120:
#: auto, fp8, fp8_e4m3), the same rule in every supported version: lines 323-336, called at 413
#: (0.25.1, where the spec reads the rewritten ``cache_config.cache_dtype``, line 1009);
#: 349-362 / 470 (0.28.0); 349-362 / 481 (0.29.0); 358-375 / 522 (0.32.0); 359-376 / 523
#: (0.33.0); 367-384 / 543 (0.34.0). DeepSeek-V3.2's ``bfloat16`` is rewritten to ``auto`` first
#: (``model_executor/models/config.py:37``, 0.25.1; ``:38``, 0.28.0-0.32.0; ``:84``, 0.33.0;
#: ``:91``, 0.34.0). The others keep FP8 as plain FP8: FLASHINFER_MLA_SPARSE refuses
#: ``fp8_ds_mla`` outright (``v1/attention/backends/mla/flashinfer_mla_sparse.py:111-113``,
#: 0.25.1; ``:107-109``, 0.28.0; ``:112-114``, 0.29.0; ``:136-138``, 0.32.0; ``:134-135``,
#: 0.33.0; ``:137-138``, 0.34.0), and "ROCm sparse MLA has no fp8_ds_mla layout"
#: (``model_executor/models/config.py:144``, 0.34.0; ``rocm_aiter_mla_sparse.py``'s
#: ``supported_kv_cache_dtypes``, line 267 in 0.25.1 to 352 in 0.34.0, has no ``fp8_ds_mla``).
SPARSE_MLA_BACKENDS: Mapping[str, SparseMLABackend] = {
    backend.name: backend
    for backend in (
        SparseMLABackend(
            "FLASHMLA_SPARSE",
            "Hopper SM90, Blackwell SM100",
            frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"}),
        ),
        SparseMLABackend(
            "FLASHINFER_MLA_SPARSE_SM120",
            "Blackwell SM120",
            frozenset({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}),
        ),
        SparseMLABackend("FLASHINFER_MLA_SPARSE", "Blackwell SM100"),
        SparseMLABackend("FLASHINFER_MLA_SPARSE_SM90", "Hopper SM90, from vLLM 0.32.0"),
        SparseMLABackend("FLASH_ATTN_MLA_SPARSE", "Hopper SM90, BF16 only"),
        SparseMLABackend("FLASH_ATTN_MLA_SPARSE_FA4", "Blackwell SM100, BF16 only, from 0.33.0"),
        SparseMLABackend("ROCM_AITER_MLA_SPARSE", "ROCm: AMD Instinct"),
    )
}

#: The one sparse-MLA backend vLLM has on ROCm, in every supported version
#: (``platforms/rocm.py:414-415``, 0.25.1; ``:466-467``, 0.28.0 and 0.29.0; ``:485-486``,
#: 0.32.0; ``:538-539``, 0.33.0; ``:543-544``, 0.34.0).
ROCM_SPARSE_MLA_BACKEND = "ROCM_AITER_MLA_SPARSE"
#: What the plan sizes sparse MLA as when the GPU generation is not known: FlashMLA-sparse, the
#: backend vLLM picks on Hopper for ``--kv-cache-dtype fp8`` (``platforms/cuda.py``: SM90 lists
#: FLASH_ATTN_MLA_SPARSE, BF16 only, then FLASHMLA_SPARSE; lines 140-141 in 0.25.1, 141-142 in
#: 0.28.0 and 0.29.0, 139-140 in 0.32.0, 141-142 in 0.33.0, 138-139 in 0.34.0). Its rows are
#: the largest any CUDA backend keeps for each dtype, so a point planned to fit fits on SM100
#: (FLASHINFER_MLA_SPARSE first for an FP8 cache: ``platforms/cuda.py:97-101``, 0.25.1;
#: ``:98-102``, 0.28.0 and 0.29.0; ``:100-104``, 0.32.0; ``:101-105``, 0.33.0; ``:98-102``, 0.34.0)
#: and on SM120 (FLASHINFER_MLA_SPARSE_SM120 only: ``:129-132``, 0.25.1, to ``:131-134``, 0.34.0).
ASSUMED_SPARSE_MLA_BACKEND = "FLASHMLA_SPARSE"


def sparse_mla_backend_for(device: str, attention_backend: str | None) -> str | None:
    """The sparse-MLA backend vLLM serves DeepSeek-V3.2 with: the one ``--attention-backend``
    names, ROCm's only one, or None where the GPU generation decides and is not known."""
    if attention_backend in SPARSE_MLA_BACKENDS:
        return attention_backend
    if device == "rocm":
        return ROCM_SPARSE_MLA_BACKEND
    return None


def sparse_mla_row(
    backend: str | None, cache_dtype: str, latent: int, kv_bytes: int
) -> tuple[int, bool]:
    """(bytes of one token's row in one layer, packed as ``fp8_ds_mla``?) under ``backend``
    (None: :data:`ASSUMED_SPARSE_MLA_BACKEND`) for a ``--kv-cache-dtype`` of ``cache_dtype``."""
    chosen = SPARSE_MLA_BACKENDS[backend or ASSUMED_SPARSE_MLA_BACKEND]
    dtype = "auto" if cache_dtype == "bfloat16" else cache_dtype
    if dtype in chosen.packs:
        return FP8_DS_MLA_BYTES, True
    return latent * kv_bytes, False


class LayerConfigError(ValueError):
    """A config field the layer reader needs is missing or malformed."""


class ShardError(LayerConfigError):
    """The tensor-parallel ranks do not divide something vLLM shards evenly over them."""

    def __init__(self, value: int, parts: int, what: str) -> None:
        super().__init__(
            f"tensor_parallel={parts} does not divide the {value} {what}; vLLM shards them "
            f"evenly and needs {what} % tensor_parallel == 0"
        )
        self.value, self.what = value, what


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer caches on one rank."""

    index: int
    kind: str  # full, mla, indexer, sliding, chunked, state
    #: Attention: bytes per token per layer on one rank (one block's page / block size).
    bytes_per_token: int = 0
    #: Sliding window or chunk size in tokens.
    window: int | None = None
    #: State: the per-request state page in bytes on one rank (unpadded), and its parts.
    state_bytes: int = 0
    state_parts: tuple[tuple[tuple[int, ...], str], ...] = ()
    #: Which state layer (mamba1, mamba2, gdn, kda, short_conv), or the MLA variant.
    variant: str = ""

    @property
    def grows(self) -> bool:
        return self.kind != "state"


def _int(fields: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = fields.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LayerConfigError(
            f"model config field {key!r} must be a positive integer, got {value!r}"
        )
    return value


def _divide(value: int, parts: int, what: str) -> int:
    if value % parts:
        raise ShardError(value, parts, what)
    return value // parts


def _state(
    index: int,
    variant: str,
    parts: Sequence[tuple[tuple[int, ...], str]],
) -> LayerKind:
    size = sum(math.prod(shape) * _DTYPE_BYTES[dtype] for shape, dtype in parts)
    return LayerKind(index, "state", state_bytes=size, state_parts=tuple(parts), variant=variant)


@dataclass(frozen=True)
class DTypes:
    """The element types the cache is kept in: KV, model, and Mamba conv / SSM state."""

    kv_bytes: int
    model: str  # bfloat16, float16
    mamba_conv: str = "auto"  # --mamba-cache-dtype
    mamba_ssm: str = "auto"  # --mamba-ssm-cache-dtype
    #: The ``--kv-cache-dtype`` as given, and the sparse-MLA backend (None: not known), which
    #: together decide a sparse-MLA row (:func:`sparse_mla_row`).
    cache_dtype: str = "auto"
    sparse_mla_backend: str | None = None

    def __post_init__(self) -> None:
        for name, value in (
            ("mamba_cache_dtype", self.mamba_conv),
            ("mamba_ssm_cache_dtype", self.mamba_ssm),
        ):
            if value not in MAMBA_DTYPES:
                raise ValueError(f"{name} must be one of {', '.join(MAMBA_DTYPES)}, got {value!r}")
        backend = self.sparse_mla_backend
        if backend is not None and backend not in SPARSE_MLA_BACKENDS:
            raise ValueError(
                f"sparse_mla_backend must be one of {', '.join(SPARSE_MLA_BACKENDS)}, "
                f"got {backend!r}"
            )

    def conv(self) -> str:
        return self.model if self.mamba_conv == "auto" else self.mamba_conv

    def ssm(self, default: str | None = None) -> str:
        if self.mamba_ssm != "auto":
            return self.mamba_ssm
        return default or self.conv()


def read_layers(fields: Mapping[str, Any], tp: int, dtypes: DTypes) -> list[LayerKind]:
    """Every cached layer of the model (all pipeline stages), in layer order, on one rank.

    ``fields`` is the text model's config (``text_config`` merged in).
    """
    block_types = fields.get("layers_block_type")
    if "num_hidden_layers" not in fields and isinstance(block_types, list):
        fields = {**fields, "num_hidden_layers": len(block_types)}  # Nemotron-H
    num_layers = _int(fields, "num_hidden_layers")
    pattern = _layer_pattern(fields, num_layers)
    layers: list[LayerKind] = []
    attention = None
    for index, what in enumerate(pattern):
        if what == "none":
            continue
        if what in ("full", "sliding", "chunked"):
            attention = attention or _attention_bytes(fields, tp, dtypes)
            kind, per_token = attention
            if kind == "mla":
                layers.extend(_mla_layers(fields, index, dtypes))
                continue
            window = None
            if what == "sliding":
                window = _int(fields, "sliding_window")
            elif what == "chunked":
                window = _int(fields, "attention_chunk_size")
            layers.append(LayerKind(index, what, bytes_per_token=per_token, window=window))
        else:
            layers.append(_state_layer(fields, index, what, tp, dtypes))
    return layers


def _layer_pattern(fields: Mapping[str, Any], num_layers: int) -> list[str]:
    """Per layer: full, sliding, chunked, none, or the state kind (mamba1, mamba2, gdn, ...)."""
    model_type = str(fields.get("model_type", ""))
    linear = fields.get("linear_attn_config")
    if isinstance(linear, Mapping) and linear.get("full_attn_layers") is not None:
        full = linear["full_attn_layers"]  # Kimi Linear: 1-based full-attention layers
        if not isinstance(full, list) or not all(
            isinstance(i, int) and 1 <= i <= num_layers for i in full
        ):
            raise LayerConfigError(
                "model config field 'linear_attn_config.full_attn_layers' must list 1-based "
                f"layer indices within 1..{num_layers}, got {full!r}"
            )
        kda = linear.get("kda_layers")
        if isinstance(kda, list) and len(kda) + len(full) != num_layers:
            raise LayerConfigError(
                f"linear_attn_config lists {len(full)} full-attention and {len(kda)} linear "
                f"layers, but num_hidden_layers is {num_layers}"
            )
        return ["full" if i + 1 in full else "kda" for i in range(num_layers)]
    pattern_text = fields.get("hybrid_override_pattern")  # Nemotron-H: M mamba, * attention
    if isinstance(pattern_text, str):
        kinds = {"M": "mamba2", "*": "full", "-": "none", "E": "none"}
        return [kinds.get(char, "none") for char in pattern_text[:num_layers]]
    if model_type == "jamba" or "attn_layer_period" in fields and "mamba_d_state" in fields:
        period, offset = _int(fields, "attn_layer_period"), int(fields.get("attn_layer_offset", 0))
        return ["full" if i % period == offset else "mamba1" for i in range(num_layers)]
    if model_type == "gpt_oss":  # vLLM's gpt_oss.py: sliding on even layer indices
        return ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]
    if fields.get("attention_chunk_size"):  # Llama 4: NoPE layers (0) attend globally
        no_rope = fields.get("no_rope_layers")
        if not no_rope:  # transformers derives them from the interval, as vLLM then reads
            interval = int(fields.get("no_rope_layer_interval") or 4)
            no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
        return ["chunked" if no_rope[i] else "full" for i in range(num_layers)]
    layer_types = fields.get("layer_types")
    if not isinstance(layer_types, list) or not layer_types:
        layer_types = fields.get("layers_block_type")  # Nemotron-H in transformers >= 5
    if not isinstance(layer_types, list) or not layer_types:
        layer_types = _derived_layer_types(fields, model_type, num_layers)
    if isinstance(layer_types, list) and layer_types:
        linear = "gdn" if model_type.startswith("qwen3") else "mamba2"
        names = {
            "full_attention": "full",
            "attention": "full",
            "indexed_attention": "full",  # DeepSeek-V3.2: MLA with the indexer
            "chunked_attention": "chunked",
            "sliding_attention": "sliding",
            # transformers' own spelling of a recurrent layer, "mamba" before 5.13
            # (configuration_utils._LEGACY_LAYER_TYPE_REMAP): the model's linear layer.
            "linear_attention": linear,
            "mamba": linear,
            "conv": "short_conv",
        }
        if len(layer_types) < num_layers:
            raise LayerConfigError(
                f"model config field 'layer_types' lists {len(layer_types)} layers, "
                f"num_hidden_layers is {num_layers}"
            )
        return [names.get(str(t), "none") for t in layer_types[:num_layers]]
    if fields.get("sliding_window") and fields.get("use_sliding_window", True):
        return ["sliding"] * num_layers  # Mistral-style: every layer windowed
    return ["full"] * num_layers


def _derived_layer_types(
    fields: Mapping[str, Any], model_type: str, num_layers: int
) -> list[str] | None:
    """``layer_types`` as transformers derives it when a config.json leaves it out."""
    pattern = fields.get("sliding_window_pattern")  # Gemma 2/3: every Nth layer global
    if isinstance(pattern, int) and pattern > 0 and fields.get("sliding_window"):
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    interval = fields.get("full_attention_interval")  # Qwen3-Next
    if model_type.startswith("qwen3") and isinstance(interval, int) and interval > 0:
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    return None


def _attention_bytes(fields: Mapping[str, Any], tp: int, dtypes: DTypes) -> tuple[str, int]:
    if fields.get("kv_lora_rank") is not None:
        latent = _int(fields, "kv_lora_rank") + _int(fields, "qk_rope_head_dim")
        return "mla", latent * dtypes.kv_bytes
    heads = _int(fields, "num_attention_heads")
    kv_heads = _int(fields, "num_key_value_heads", heads)
    head_dim = fields.get("head_dim") or _int(fields, "hidden_size") // heads
    return "full", 2 * max(1, kv_heads // tp) * int(head_dim) * dtypes.kv_bytes


def is_sparse_mla(fields: Mapping[str, Any]) -> bool:
    """DeepSeek-V3.2's DSA: an indexer picks ``index_topk`` tokens per query."""
    return fields.get("kv_lora_rank") is not None and fields.get("index_topk") is not None


def _mla_layers(fields: Mapping[str, Any], index: int, dtypes: DTypes) -> list[LayerKind]:
    latent = _int(fields, "kv_lora_rank") + _int(fields, "qk_rope_head_dim")
    if not is_sparse_mla(fields):
        return [LayerKind(index, "mla", bytes_per_token=latent * dtypes.kv_bytes)]
    row, packed = sparse_mla_row(
        dtypes.sparse_mla_backend, dtypes.cache_dtype, latent, dtypes.kv_bytes
    )
    index_dim = _int(fields, "index_head_dim")
    indexer = index_dim + index_dim // INDEXER_QUANT_BLOCK * 4
    variant = "fp8_ds_mla" if packed else "sparse"
    return [
        LayerKind(index, "mla", bytes_per_token=row, variant=variant),
        LayerKind(index, "indexer", bytes_per_token=indexer, variant="indexer"),
    ]


def _state_layer(
    fields: Mapping[str, Any], index: int, what: str, tp: int, dtypes: DTypes
) -> LayerKind:
    conv, ssm = dtypes.conv(), dtypes.ssm()
    if what == "kda":
        linear = fields["linear_attn_config"]
        heads, head_dim = _int(linear, "num_heads"), _int(linear, "head_dim")
        kernel = _int(linear, "short_conv_kernel_size")
        conv_dim = 3 * heads * head_dim
        return _state(
            index,
            what,
            [
                ((kernel - 1, _divide(conv_dim, tp, "linear-attention channels")), conv),
                (
                    (_divide(heads, tp, "linear-attention heads"), head_dim, head_dim),
                    dtypes.ssm("float32"),
                ),
            ],
        )
    if what == "gdn":
        k_heads, v_heads = (
            _int(fields, "linear_num_key_heads"),
            _int(fields, "linear_num_value_heads"),
        )
        k_dim, v_dim = _int(fields, "linear_key_head_dim"), _int(fields, "linear_value_head_dim")
        kernel = _int(fields, "linear_conv_kernel_dim")
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return _state(
            index,
            what,
            [
                ((kernel - 1, _divide(conv_dim, tp, "Gated DeltaNet channels")), conv),
                ((_divide(v_heads, tp, "Gated DeltaNet value heads"), v_dim, k_dim), ssm),
            ],
        )
    if what == "mamba2":
        names = MAMBA2_FIELDS.get(str(fields.get("model_type", "")), MAMBA2_FIELDS["nemotron_h"])
        heads = _int(fields, names.heads)
        head_dim = _mamba2_head_dim(fields, names, heads)
        state = _int(fields, names.state)
        groups = _int(fields, names.groups)
        if groups % tp:
            groups = tp  # vLLM replicates the groups a head shard needs
        kernel = _int(fields, names.kernel)
        if names.expand is None:
            inner = heads * head_dim
        else:
            inner = _int(fields, names.expand) * _int(fields, "hidden_size")
        conv_dim = inner + 2 * groups * state
        ssm_default = None
        if names.ssm_from_config:
            ssm_default = str(fields.get("mamba_ssm_cache_dtype", "float32"))
        return _state(
            index,
            what,
            [
                ((kernel - 1, _divide(conv_dim, tp, "Mamba2 channels")), conv),
                ((_divide(heads, tp, "Mamba2 heads"), head_dim, state), dtypes.ssm(ssm_default)),
            ],
        )
    if what == "mamba1":
        inner = _int(fields, "mamba_expand") * _int(fields, "hidden_size")
        kernel, state = _int(fields, "mamba_d_conv"), _int(fields, "mamba_d_state")
        shard = _divide(inner, tp, "Mamba channels")
        return _state(index, what, [((kernel - 1, shard), conv), ((shard, state), ssm)])
    if what == "short_conv":  # vLLM's lfm2.py: conv_dim channels (the checkpoints spell it)
        kernel = _int(fields, "conv_L_cache")
        channels = _int(fields, "conv_dim" if "conv_dim" in fields else "hidden_size")
        shard = _divide(channels, tp, "short-convolution channels")
        return _state(index, what, [((kernel - 1, shard), conv)])
    raise LayerConfigError(f"layer {index}: unknown layer kind {what!r}")


@dataclass(frozen=True)
class Mamba2Fields:
    """The config fields a model's Mamba2 layers are sized from, as its vLLM model class reads
    them for ``MambaStateShapeCalculator.mamba2_state_shape``."""

    heads: str
    head_dim: str
    state: str
    groups: str
    kernel: str
    #: The inner width: ``expand x hidden_size`` when named, else ``heads x head_dim``.
    expand: str | None
    #: The SSM state's dtype under ``--mamba-ssm-cache-dtype auto``: the config's
    #: ``mamba_ssm_cache_dtype`` (float32 when absent) when true, else the conv state's.
    ssm_from_config: bool


#: Mamba2 layers by ``model_type``; another model is read with Nemotron-H's names.
MAMBA2_FIELDS: Mapping[str, Mamba2Fields] = {
    # vLLM's nemotron_h.py (0.32.0: 801-812), and NemotronHForCausalLMConfig's float32 SSM
    # state (model_executor/models/config.py:712-732 in 0.32.0).
    "nemotron_h": Mamba2Fields(
        "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", None, True
    ),
    # Granite 4 (GraniteMoeHybridForCausalLM): every "mamba" / "linear_attention" layer is a
    # MambaMixer2 (granitemoehybrid.py ALL_DECODER_LAYER_TYPES at 318, 318, 322, 322, 321, 321 in
    # 0.25.1, 0.28.0, 0.29.0, 0.32.0, 0.33.0, 0.34.0), sized by mamba2_state_shape from
    # mamba_expand x hidden_size (lines 624-634, 628-638, 639-649, 636-646, 634-645, 634-645)
    # with the SSM state in the model dtype (mamba2_state_dtype at 601, 605, 616, 612, 610, 610;
    # no config override exists for it).
    "granitemoehybrid": Mamba2Fields(
        "mamba_n_heads",
        "mamba_d_head",
        "mamba_d_state",
        "mamba_n_groups",
        "mamba_d_conv",
        "mamba_expand",
        False,
    ),
}


def _mamba2_head_dim(fields: Mapping[str, Any], names: Mamba2Fields, heads: int) -> int:
    """The head width; Granite's ``mamba_d_head = "auto"`` is the inner width over the heads,
    as transformers' GraniteMoeHybridConfig derives it."""
    value = fields.get(names.head_dim)
    if value == "auto" and names.expand is not None:
        return _int(fields, names.expand) * _int(fields, "hidden_size") // heads
    return _int(fields, names.head_dim)


def pp_partition(num_layers: int, pp: int, override: str | None = None) -> list[tuple[int, int]]:
    """vLLM's ``get_pp_indices``: each stage's ``[start, end)`` decoder layers.

    ``override`` is ``VLLM_PP_LAYER_PARTITION`` ("12,12,13,11"); without it the layers spread
    evenly and the remainder goes to the stages before the last, as vLLM does.
    """
    if override is not None:
        try:
            partitions = [int(part) for part in override.split(",")]
        except ValueError:
            raise ValueError(
                f"VLLM_PP_LAYER_PARTITION={override!r} must be comma-separated layer counts"
            ) from None
        if len(partitions) != pp:
            raise ValueError(
                f"VLLM_PP_LAYER_PARTITION={override!r} has {len(partitions)} stages, "
                f"pipeline_parallel_size is {pp}"
            )
        if sum(partitions) != num_layers:
            raise ValueError(
                f"VLLM_PP_LAYER_PARTITION={override!r} sums to {sum(partitions)} layers, the "
                f"model has {num_layers}"
            )
    else:
        partitions = [num_layers // pp] * pp
        for i in range(2, num_layers % pp + 2):
            partitions[-i] += 1
    bounds, start = [], 0
    for count in partitions:
        bounds.append((start, start + count))
        start += count
    return bounds
