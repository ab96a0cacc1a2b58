"""What one rank caches per token and per sequence, read from a model's config.json."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3

#: Cache dtypes vLLM accepts for ``--kv-cache-dtype`` that this model sizes, and their element
#: bytes; ``auto`` means "the model dtype".
CACHE_DTYPE_BYTES: Mapping[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

#: Model dtype spellings (config ``torch_dtype``/``dtype`` or ``--dtype``) and their canonical name.
_MODEL_DTYPE_NAMES: Mapping[str, str] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
_MODEL_DTYPE_BYTES: Mapping[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

#: The cache dtype suggested when a point does not fit in a wider one.
FP8_CACHE_DTYPE = "fp8_e4m3"

#: vLLM aligns a hybrid MLA model's attention block size to 128 tokens (TRTLLM/FlashInfer MLA
#: kernel invariant); other hybrids align to the attention kernel's block, commonly 16.
_HYBRID_BLOCK_ALIGNMENT = {"mla": 128, "gqa": 16}

_RECURRENT_STATE_BYTES = 4  # vLLM keeps the KDA recurrent state in float32 by default


class ModelConfigError(ValueError):
    """A ``config.json`` that is missing, unreadable or lacks a field the layout needs."""


def load_model_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (the file itself, or a model folder holding it).

    Read as plain JSON so remote-code models (Kimi Linear) work without their Python code.
    """
    given = Path(path)
    config_path = given / "config.json" if given.is_dir() else given
    if not config_path.is_file():
        raise ModelConfigError(
            f"no model config at {config_path}: expected a Hugging Face config.json file "
            "or a model folder containing one"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"{config_path} is not a readable JSON model config: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelConfigError(
            f"{config_path} holds a JSON {type(config).__name__}, expected an object of "
            "Hugging Face config fields"
        )
    return config


def _text_fields(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's fields under ``text_config``."""
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        return {**config, **text}
    return config


def _architecture(config: Mapping[str, Any]) -> str:
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures:
        return str(architectures[0])
    return str(config.get("model_type", "unknown model"))


def _positive_int(config: Mapping[str, Any], key: str, where: str = "") -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        place = f"{where}.{key}" if where else key
        raise ModelConfigError(
            f"model config field {place!r} must be a positive integer, got {value!r} "
            f"({_architecture(config)})"
        )
    return value


def model_dtype_name(dtype: str) -> str:
    """Canonical model dtype (``bfloat16``/``float16``/``float32``) for a spelling of it."""
    name = _MODEL_DTYPE_NAMES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise ValueError(
            f"unknown model dtype {dtype!r}; accepted: {', '.join(sorted(_MODEL_DTYPE_NAMES))}"
        )
    return name


def config_model_dtype(config: Mapping[str, Any]) -> str:
    """The dtype vLLM's ``--dtype auto`` serves ``config`` in.

    vLLM serves float32 checkpoints in bfloat16, and so does this; a config without a dtype
    is taken as bfloat16.
    """
    declared = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    name = model_dtype_name(str(declared))
    return "bfloat16" if name == "float32" else name


def cache_element_bytes(cache_dtype: str, model_dtype: str) -> int:
    """Bytes per cached element for a ``--kv-cache-dtype`` value."""
    if cache_dtype not in CACHE_DTYPE_BYTES:
        raise ValueError(
            f"unknown KV-cache dtype {cache_dtype!r}; accepted: {', '.join(CACHE_DTYPE_BYTES)}"
        )
    size = CACHE_DTYPE_BYTES[cache_dtype]
    return _MODEL_DTYPE_BYTES[model_dtype_name(model_dtype)] if size is None else size


@dataclass(frozen=True)
class CacheLayout:
    """What one tensor-parallel rank caches for one sequence, and how it grows."""

    architecture: str
    #: "gqa", "mla", or "hybrid" (growing attention layers plus constant-state layers).
    kind: str
    #: The growing layers' attention: "gqa" or "mla".
    attention: str
    attention_layers: int
    constant_state_layers: int
    tensor_parallel: int
    cache_dtype: str
    model_dtype: str
    element_bytes: int
    #: Cached elements per attention layer per token on one rank.
    elements_per_layer_token: int
    kv_bytes_per_token: int  # per rank: the attention layers of its pipeline stage
    state_bytes_per_rank: int  # constant per sequence
    state_bytes_unsharded: int
    #: True when ranks hold copies rather than shares of the KV: MLA's latent always, GQA's
    #: heads once there are more ranks than KV heads.
    kv_replicated: bool
    #: Smallest attention block vLLM picks for a hybrid so a page holds a state page; None
    #: when the platform default applies.
    block_size_hint: int | None
    #: The config it came from, to re-derive it for another dtype or rank count.
    config: Mapping[str, Any] = field(repr=False, compare=False, hash=False)
    #: Pipeline stages: each rank caches only its stage's layers.
    pipeline_parallel: int = 1

    def kv_bytes(self, tokens: int) -> int:
        """Per-rank bytes of the growing cache for ``tokens`` tokens of one sequence."""
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        return tokens * self.kv_bytes_per_token

    def with_changes(
        self, *, cache_dtype: str | None = None, tensor_parallel: int | None = None
    ) -> CacheLayout:
        """The same model under another cache dtype or rank count."""
        return cache_layout(
            self.config,
            cache_dtype=self.cache_dtype if cache_dtype is None else cache_dtype,
            model_dtype=self.model_dtype,
            tensor_parallel=self.tensor_parallel if tensor_parallel is None else tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
        )


def cache_layout(
    config: Mapping[str, Any],
    *,
    cache_dtype: str = "auto",
    model_dtype: str | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> CacheLayout:
    """The per-rank cache layout vLLM would build for ``config``.

    ``model_dtype`` defaults to what ``--dtype auto`` picks (see :func:`config_model_dtype`).
    With ``pipeline_parallel`` stages a rank holds one stage's layers: the largest stage's
    share when the layers spread evenly (vLLM's default partition).
    """
    if isinstance(pipeline_parallel, bool) or not isinstance(pipeline_parallel, int):
        raise ValueError(f"pipeline_parallel must be an integer >= 1, got {pipeline_parallel!r}")
    if pipeline_parallel < 1:
        raise ValueError(f"pipeline_parallel must be an integer >= 1, got {pipeline_parallel}")
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int):
        raise ValueError(f"tensor_parallel must be an integer >= 1, got {tensor_parallel!r}")
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be an integer >= 1, got {tensor_parallel}")
    fields = _text_fields(config)
    model_dtype = config_model_dtype(fields) if model_dtype is None else model_dtype
    model_dtype = model_dtype_name(model_dtype)
    element_bytes = cache_element_bytes(cache_dtype, model_dtype)

    num_layers = _positive_int(fields, "num_hidden_layers")
    attention_layers, state_layers, linear = _layer_split(fields, num_layers)

    attention, elements, kv_replicated = _attention_elements(fields, tensor_parallel)

    stage_attention = math.ceil(attention_layers / pipeline_parallel)
    stage_state = math.ceil(state_layers / pipeline_parallel)
    state_unsharded = state_per_rank = 0
    if linear is not None:
        state_per_rank, state_unsharded = _linear_state_bytes(
            linear, stage_state, model_dtype, tensor_parallel, fields
        )
    kv_bytes_per_token = stage_attention * elements * element_bytes

    block_size_hint = None
    if linear is not None and state_layers and attention_layers:
        alignment = _HYBRID_BLOCK_ALIGNMENT[attention]
        state_page = state_per_rank // stage_state
        attention_page_per_token = elements * element_bytes
        block_size_hint = alignment * math.ceil(state_page / (alignment * attention_page_per_token))

    return CacheLayout(
        architecture=_architecture(fields),
        kind="hybrid" if linear is not None else attention,
        attention=attention,
        attention_layers=attention_layers,
        constant_state_layers=state_layers,
        tensor_parallel=tensor_parallel,
        cache_dtype=cache_dtype,
        model_dtype=model_dtype,
        element_bytes=element_bytes,
        elements_per_layer_token=elements,
        kv_bytes_per_token=kv_bytes_per_token,
        state_bytes_per_rank=state_per_rank,
        state_bytes_unsharded=state_unsharded,
        kv_replicated=kv_replicated,
        block_size_hint=block_size_hint,
        config=dict(config),
        pipeline_parallel=pipeline_parallel,
    )


def _attention_elements(fields: Mapping[str, Any], tensor_parallel: int) -> tuple[str, int, bool]:
    """(kind, cached elements per layer per token on one rank, replicated across ranks?)."""
    if fields.get("kv_lora_rank") is not None:
        elements = _positive_int(fields, "kv_lora_rank") + _positive_int(fields, "qk_rope_head_dim")
        return "mla", elements, True
    query_heads = _positive_int(fields, "num_attention_heads")
    kv_heads = fields.get("num_key_value_heads") or query_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ModelConfigError(
            f"model config field 'num_key_value_heads' must be a positive integer, "
            f"got {kv_heads!r} ({_architecture(fields)})"
        )
    head_dim = fields.get("head_dim") or _positive_int(fields, "hidden_size") // query_heads
    kv_heads_per_rank = max(1, kv_heads // tensor_parallel)
    return "gqa", 2 * kv_heads_per_rank * int(head_dim), kv_heads < tensor_parallel


def _layer_split(
    fields: Mapping[str, Any], num_layers: int
) -> tuple[int, int, Mapping[str, Any] | None]:
    """(growing attention layers, constant-state layers, linear_attn_config or None)."""
    linear = fields.get("linear_attn_config")
    if not isinstance(linear, Mapping) or linear.get("full_attn_layers") is None:
        return num_layers, 0, None
    full = linear["full_attn_layers"]
    if not isinstance(full, list) or not all(
        isinstance(i, int) and 1 <= i <= num_layers for i in full
    ):
        raise ModelConfigError(
            "model config field 'linear_attn_config.full_attn_layers' must list 1-based layer "
            f"indices within 1..{num_layers}, got {full!r} ({_architecture(fields)})"
        )
    kda = linear.get("kda_layers")
    state_layers = len(kda) if isinstance(kda, list) else num_layers - len(full)
    if len(full) + state_layers != num_layers:
        raise ModelConfigError(
            f"linear_attn_config lists {len(full)} full-attention and {state_layers} linear "
            f"layers, but num_hidden_layers is {num_layers} ({_architecture(fields)})"
        )
    return len(full), state_layers, linear


def _linear_state_bytes(
    linear: Mapping[str, Any],
    layers: int,
    model_dtype: str,
    tensor_parallel: int,
    fields: Mapping[str, Any],
) -> tuple[int, int]:
    """(per-rank, unsharded) constant state bytes of the linear-attention layers."""
    where = "linear_attn_config"
    heads = _positive_int(linear, "num_heads", where)
    head_dim = _positive_int(linear, "head_dim", where)
    kernel = _positive_int(linear, "short_conv_kernel_size", where)
    if heads % tensor_parallel:
        raise ValueError(
            f"tensor_parallel={tensor_parallel} does not divide the {heads} linear-attention "
            f"heads of {_architecture(fields)}; vLLM needs heads % tensor_parallel == 0"
        )
    conv_bytes = (kernel - 1) * 3 * heads * head_dim * _MODEL_DTYPE_BYTES[model_dtype]
    recurrent_bytes = heads * head_dim * head_dim * _RECURRENT_STATE_BYTES
    unsharded = layers * (conv_bytes + recurrent_bytes)
    return unsharded // tensor_parallel, unsharded


def describe_layout(layout: CacheLayout) -> str:
    """One line a terminal user can check against the model card."""
    pp = layout.pipeline_parallel
    layers = f"{layout.attention_layers}"
    if pp > 1:
        layers = f"{math.ceil(layout.attention_layers / pp)} (of {layout.attention_layers})"
    grows = (
        f"{layers} {layout.attention.upper()} layers x "
        f"{layout.elements_per_layer_token} elements x {layout.element_bytes} B = "
        f"{layout.kv_bytes_per_token:,} B/token per rank"
    )
    dtype = layout.cache_dtype
    if dtype == "auto":
        dtype = f"auto = {layout.model_dtype}"
    ranks = f"TP={layout.tensor_parallel}" + (f" x PP={pp}" if pp > 1 else "")
    parts = [f"{layout.architecture} ({layout.kind}, {ranks}, KV {dtype})"]
    parts.append(grows + (" (replicated on every rank)" if layout.kv_replicated else ""))
    if layout.constant_state_layers:
        parts.append(
            f"{layout.constant_state_layers} constant-state layers: "
            f"{layout.state_bytes_per_rank / 2**20:.2f} MiB per rank "
            f"({layout.state_bytes_unsharded:,} B = "
            f"{layout.state_bytes_unsharded / 2**20:.2f} MiB unsharded)"
        )
    return "; ".join(parts)
