"""Every layer kind vLLM caches, read from a config.json the way vLLM's model code reads it.

One :class:`LayerKind` per decoder layer that holds a cache, for one tensor-parallel rank:

* ``full``: MHA/GQA, ``2 x max(1, kv_heads // tp) x head_dim`` elements per token;
* ``mla``: one ``kv_lora_rank + qk_rope_head_dim`` latent per token, the same on every rank;
  sparse MLA (DeepSeek-V3.2, ``index_topk``) stores ``fp8_ds_mla`` rows of 656 B for an FP8
  cache and adds an ``indexer`` layer of ``index_head_dim + index_head_dim / 128 x 4`` B;
* ``sliding``: a window of ``W`` tokens (``layer_types``, gpt-oss's even layers by index,
  Mistral-style uniform ``sliding_window``);
* ``chunked``: Llama 4's chunked local attention (``attention_chunk_size``; NoPE layers are
  full attention);
* ``state``: constant per-request state (Mamba1, Mamba2, Gated DeltaNet, KDA, short
  convolutions) in its own dtypes, sharded over the tensor-parallel ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_longctx.profiles.extra_args import MAMBA_DTYPES

#: Bytes of one ``fp8_ds_mla`` row (FlashMLA-sparse's packed NoPE + RoPE + scales).
FP8_DS_MLA_BYTES = 656
#: The DeepSeek-V3.2 indexer quantises its keys in blocks of this many elements (fp32 scale).
INDEXER_QUANT_BLOCK = 128
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "uint8": 1}


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
    kv_fp8: bool = False

    def __post_init__(self) -> None:
        for name, value in (
            ("mamba_cache_dtype", self.mamba_conv),
            ("mamba_ssm_cache_dtype", self.mamba_ssm),
        ):
            if value not in MAMBA_DTYPES:
                raise ValueError(f"{name} must be one of {', '.join(MAMBA_DTYPES)}, got {value!r}")

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
        names = {
            "full_attention": "full",
            "attention": "full",
            "indexed_attention": "full",  # DeepSeek-V3.2: MLA with the indexer
            "chunked_attention": "chunked",
            "sliding_attention": "sliding",
            "linear_attention": "gdn" if model_type.startswith("qwen3") else "mamba2",
            "mamba": "mamba1",
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
    row = FP8_DS_MLA_BYTES if dtypes.kv_fp8 else latent * dtypes.kv_bytes
    index_dim = _int(fields, "index_head_dim")
    indexer = index_dim + index_dim // INDEXER_QUANT_BLOCK * 4
    variant = "fp8_ds_mla" if dtypes.kv_fp8 else "sparse"
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
        heads = _int(fields, "mamba_num_heads")
        head_dim = _int(fields, "mamba_head_dim")
        state = _int(fields, "ssm_state_size")
        groups = _int(fields, "n_groups")
        if groups % tp:
            groups = tp  # vLLM replicates the groups a head shard needs
        kernel = _int(fields, "conv_kernel")
        conv_dim = heads * head_dim + 2 * groups * state
        nemotron_ssm = str(fields.get("mamba_ssm_cache_dtype", "float32"))
        return _state(
            index,
            what,
            [
                ((kernel - 1, _divide(conv_dim, tp, "Mamba2 channels")), conv),
                ((_divide(heads, tp, "Mamba2 heads"), head_dim, state), dtypes.ssm(nemotron_ssm)),
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
