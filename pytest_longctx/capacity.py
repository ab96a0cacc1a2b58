"""KV-cache capacity model: will a context length fit before an hours-long prefill starts?

Pure stdlib (plus matplotlib, imported only by :func:`plot_kv_footprint`), so a plan can be
printed on a machine without torch or vLLM and for remote-code models whose ``config.json``
transformers cannot load without their code.

The layout rules follow vLLM's cache code:

* MLA (DeepSeek-V2/V3, Kimi Linear's full-attention layers; the config has ``kv_lora_rank``):
  one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per layer per token, held whole on
  every tensor-parallel rank. More ranks do not shrink it.
* GQA (Llama, Qwen, Mistral): ``2 * max(1, num_key_value_heads // tp) * head_dim`` elements per
  layer per token per rank; once there are more ranks than KV heads, heads are replicated.
* Constant-state linear attention (Kimi Delta Attention): per layer a short-convolution state of
  ``(kernel - 1) * 3 * heads * head_dim`` elements in the model dtype and a recurrent state of
  ``heads * head_dim * head_dim`` float32. vLLM splits the linear-attention heads across ranks
  (it requires ``heads % tp == 0``), so each rank holds ``1 / tp`` of both states; the unsharded
  total is kept too because that is the figure a model card or the study quotes. (Kimi
  Linear's 20 KDA layers: 43,417,600 B unsharded, which is 43.4 MB or 41.4 MiB: the study's
  "~43 MiB" is the decimal figure; 5,427,200 B per rank at TP=8.)

Units: bytes are binary (``GiB`` = 2**30) everywhere. The study's crossovers (6, 48 and 96 GiB at
"~1.6M", "~12.8M" and "~25.6M" tokens) only come out with GiB of bytes and decimal millions of
tokens: 6 GiB / 4032 B = 1,597,831 tokens, whereas 6 GB would give 1,488,096.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.sizes import format_size

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


# ---------------------------------------------------------------------------------------------
# Reading the model configuration


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


# ---------------------------------------------------------------------------------------------
# Dtypes


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


# ---------------------------------------------------------------------------------------------
# Cache layout


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
    kv_bytes_per_token: int  # per rank, all attention layers
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
        )


def cache_layout(
    config: Mapping[str, Any],
    *,
    cache_dtype: str = "auto",
    model_dtype: str | None = None,
    tensor_parallel: int = 1,
) -> CacheLayout:
    """The per-rank cache layout vLLM would build for ``config``.

    ``model_dtype`` defaults to what ``--dtype auto`` picks (see :func:`config_model_dtype`).
    """
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

    if fields.get("kv_lora_rank") is not None:
        attention = "mla"
        elements = _positive_int(fields, "kv_lora_rank") + _positive_int(fields, "qk_rope_head_dim")
        kv_replicated = True
    else:
        attention = "gqa"
        query_heads = _positive_int(fields, "num_attention_heads")
        kv_heads = fields.get("num_key_value_heads") or query_heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
            raise ModelConfigError(
                f"model config field 'num_key_value_heads' must be a positive integer, "
                f"got {kv_heads!r} ({_architecture(fields)})"
            )
        head_dim = fields.get("head_dim") or _positive_int(fields, "hidden_size") // query_heads
        kv_heads_per_rank = max(1, kv_heads // tensor_parallel)
        elements = 2 * kv_heads_per_rank * int(head_dim)
        kv_replicated = kv_heads < tensor_parallel

    state_unsharded = state_per_rank = 0
    if linear is not None:
        state_per_rank, state_unsharded = _linear_state_bytes(
            linear, state_layers, model_dtype, tensor_parallel, fields
        )
    kv_bytes_per_token = attention_layers * elements * element_bytes

    block_size_hint = None
    if linear is not None and state_layers and attention_layers:
        alignment = _HYBRID_BLOCK_ALIGNMENT[attention]
        state_page = state_per_rank // state_layers
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
    )


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
    grows = (
        f"{layout.attention_layers} {layout.attention.upper()} layers x "
        f"{layout.elements_per_layer_token} elements x {layout.element_bytes} B = "
        f"{layout.kv_bytes_per_token:,} B/token per rank"
    )
    dtype = layout.cache_dtype
    if dtype == "auto":
        dtype = f"auto = {layout.model_dtype}"
    parts = [f"{layout.architecture} ({layout.kind}, TP={layout.tensor_parallel}, KV {dtype})"]
    parts.append(grows + (" (replicated on every rank)" if layout.kv_replicated else ""))
    if layout.constant_state_layers:
        parts.append(
            f"{layout.constant_state_layers} constant-state layers: "
            f"{layout.state_bytes_per_rank / 2**20:.2f} MiB per rank "
            f"({layout.state_bytes_unsharded:,} B = "
            f"{layout.state_bytes_unsharded / 2**20:.2f} MiB unsharded)"
        )
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Tokens <-> bytes


def token_capacity(
    layout: CacheLayout,
    kv_cache_bytes: int,
    block_size: int,
    max_model_len: int | None = None,
) -> int:
    """Tokens vLLM reports ("KV cache size: N tokens") for a cache of ``kv_cache_bytes``.

    vLLM makes ``kv_cache_bytes // (block_size * bytes per token)`` whole blocks. Without
    ``max_model_len`` this returns those blocks' tokens: at most one block below
    ``kv_cache_bytes / bytes per token``. vLLM itself prints
    ``int(blocks / ceil(max_model_len / block_size) * max_model_len)``, which equals the
    whole-block figure when ``max_model_len`` is a multiple of the block size, and is lower by
    up to ``(block_size - 1) / max_model_len`` of it otherwise (a request at max length wastes
    part of its last block). The block size is vLLM's choice (it differs by platform, kernel
    and CPU features): read it from the server's ``vllm:cache_config_info``, never assume it.
    Pass ``max_model_len`` to reproduce the printed number exactly.

    For hybrids one sequence's constant state is taken from the cache first: vLLM keeps the
    state pages in the same pool (padded to the attention page size, so this is a few blocks
    optimistic).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive token count, got {block_size}")
    if kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes}")
    usable = max(0, kv_cache_bytes - layout.state_bytes_per_rank)
    blocks = usable // (block_size * layout.kv_bytes_per_token)
    if max_model_len is None:
        return blocks * block_size
    if max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive token count, got {max_model_len}")
    blocks_per_request = math.ceil(max_model_len / block_size)
    return int(blocks / blocks_per_request * max_model_len)


def crossover_tokens(layout: CacheLayout, size_bytes: int | float) -> int:
    """The shortest context whose per-rank KV (state excluded) reaches ``size_bytes``."""
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size_bytes}")
    return math.ceil(size_bytes / layout.kv_bytes_per_token)


# ---------------------------------------------------------------------------------------------
# Fit against the hardware


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
            total = self.weights_per_rank_bytes * configured_tp
        return math.ceil(total / tensor_parallel)


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
) -> tuple[int, int, int, int, int]:
    """(kv, state, weights, need, available) per rank for ``layout`` on ``hardware``."""
    kv = layout.kv_bytes(tokens)
    state = layout.state_bytes_per_rank
    weights = hardware.weights_on_rank(layout.tensor_parallel, configured_tp)
    if hardware.kv_cache_bytes is not None:
        return kv, state, weights, kv + state, hardware.kv_cache_bytes
    return kv, state, weights, kv + state + weights + overhead, hardware.usable_per_device_bytes


def _alternative_ranks(layout: CacheLayout, hardware: Hardware) -> list[int]:
    """Rank counts above the configured one that this node has and vLLM could shard to."""
    query_heads = _text_fields(layout.config).get("num_attention_heads")
    counts = []
    for ranks in range(layout.tensor_parallel + 1, hardware.devices + 1):
        if isinstance(query_heads, int) and query_heads % ranks:
            continue
        counts.append(ranks)
    return counts


def _smallest_change(layout: CacheLayout, hardware: Hardware, tokens: int, overhead: int) -> str:
    """Fewest devices first, then keeping the cache precision: the first option that fits."""
    configured_tp = layout.tensor_parallel
    want_fp8 = layout.element_bytes > 1

    def fp8_of(candidate: CacheLayout) -> CacheLayout:
        return candidate.with_changes(cache_dtype=FP8_CACHE_DTYPE)

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

    candidates: list[tuple[int, CacheLayout, str]] = []
    if want_fp8:
        candidates.append((configured_tp, fp8_of(layout), "fp8"))
    for ranks in _alternative_ranks(layout, hardware):
        try:
            wider = layout.with_changes(tensor_parallel=ranks)
        except ValueError:
            continue  # vLLM cannot shard this model over that many ranks
        candidates.append((ranks, wider, "ranks"))
        if want_fp8:
            candidates.append((ranks, fp8_of(wider), "ranks+fp8"))
    for ranks, candidate, change in candidates:
        need, available = _needs(candidate, hardware, tokens, overhead, configured_tp)[3:]
        if need > available:
            continue
        per_rank = f"{_gib(need)} of {_gib(available)} per rank"
        if change == "fp8":
            return f"an FP8 KV cache ({FP8_CACHE_DTYPE}) would need {per_rank}"
        if change == "ranks":
            return f"{ranks} tensor-parallel ranks would need {per_rank}"
        return (
            f"{ranks} tensor-parallel ranks with an FP8 KV cache ({FP8_CACHE_DTYPE}) "
            f"would need {per_rank}"
        )
    return "no change within this node fits it"


def fit_point(
    layout: CacheLayout,
    hardware: Hardware,
    length: int,
    decode_tokens: int = 0,
    *,
    overhead_bytes_per_rank: int = 0,
) -> PointFit:
    """Does a ``length``-token prompt plus ``decode_tokens`` fit one rank, and if not, what would.

    ``overhead_bytes_per_rank`` is memory vLLM holds outside weights and cache (activations,
    graphs, workspaces); it counts against the device budget, not an explicit cache size.
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
    kv, state, weights, need, available = _needs(
        layout, hardware, tokens, overhead_bytes_per_rank, tp
    )
    fits = need <= available
    fixed = need - kv
    max_tokens = max(0, (available - fixed) // layout.kv_bytes_per_token)

    what = format_size(length) + (f" + {decode_tokens} decode" if decode_tokens else "")
    if hardware.kv_cache_bytes is not None:
        budget = f"the {_gib(available)} KV cache (--kv-cache-memory-bytes)"
        parts = f"KV {_gib(kv)} + state {_gib(state)}; weights {_gib(weights)} sit outside it"
    else:
        budget = (
            f"{_gib(available)} available ({_gib(hardware.memory_per_device_bytes)} x "
            f"{hardware.memory_utilization:g})"
        )
        parts = f"KV {_gib(kv)} + state {_gib(state)} + weights {_gib(weights)}"
        if overhead_bytes_per_rank:
            parts += f" + overhead {_gib(overhead_bytes_per_rank)}"
    head = f"{what} at TP={tp}, KV {layout.cache_dtype}: needs {_gib(need)} per rank ({parts})"
    if fits:
        suggestion = None
        reason = f"{head}; fits in {budget}"
    else:
        suggestion = _smallest_change(layout, hardware, tokens, overhead_bytes_per_rank)
        reason = (
            f"{head}; does not fit in {budget}; as configured at most {max_tokens:,} tokens "
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
        overhead_bytes=0 if hardware.kv_cache_bytes is not None else overhead_bytes_per_rank,
        need_bytes=need,
        available_bytes=available,
        fits=fits,
        max_tokens=max_tokens,
        suggestion=suggestion,
        reason=reason,
    )


def capacity_table(
    layout: CacheLayout,
    hardware: Hardware,
    lengths: Iterable[int],
    decode_tokens: int = 0,
    *,
    overhead_bytes_per_rank: int = 0,
) -> list[PointFit]:
    """One :class:`PointFit` per sweep length, in the order given."""
    return [
        fit_point(
            layout,
            hardware,
            length,
            decode_tokens,
            overhead_bytes_per_rank=overhead_bytes_per_rank,
        )
        for length in lengths
    ]


def render_capacity_table(rows: Sequence[PointFit], layout: CacheLayout | None = None) -> str:
    """Plain-text table for a terminal; the full reason of each point that does not fit below."""
    lines = []
    if layout is not None:
        lines.append(describe_layout(layout))
    header = ("length", "tokens", "KV GiB/rank", "need GiB", "avail GiB", "fits")
    table = [header]
    for row in rows:
        table.append(
            (
                format_size(row.length),
                f"{row.length + row.decode_tokens:,}",
                f"{row.kv_gib:.2f}",
                f"{row.need_gib:.2f}",
                f"{row.available_gib:.2f}",
                "yes" if row.fits else "NO",
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


# ---------------------------------------------------------------------------------------------
# Figure


def plot_kv_footprint(
    layout_fp8: CacheLayout,
    layout_bf16: CacheLayout,
    lengths: Sequence[int],
    fixed_bytes_marks: Mapping[str, int | float],
    path: str | Path,
    *,
    device_memory_bytes: int | float | None = None,
    budget_label: str = "device memory",
    operating: CacheLayout | None = None,
    ranks_known: bool = True,
) -> Path:
    """Per-rank KV against context length (log-log), the study's Figure 1 layout.

    FP8 and BF16 lines, a horizontal line per fixed-memory reference with the FP8 crossover
    marked, the budget line (device memory, or the explicit KV cache budget) when given, and
    the operating point (the largest
    length, in ``operating``'s cache dtype, FP8 by default) as an open square.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    if not lengths:
        raise ValueError("plot_kv_footprint needs at least one context length")
    xs = sorted(lengths)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for layout, label, style in (
        (layout_fp8, "FP8 KV", "-"),
        (layout_bf16, "BF16 KV", "--"),
    ):
        ax.plot(
            xs,
            [layout.kv_bytes(x) / GIB for x in xs],
            style,
            marker="o",
            markersize=3,
            label=f"{label} ({layout.kv_bytes_per_token:,} B/token per rank)",
        )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, size) in enumerate(fixed_bytes_marks.items()):
        color = colors[(index + 2) % len(colors)]
        ax.axhline(size / GIB, color=color, linestyle=":", linewidth=1.2, label=label)
        crossing = crossover_tokens(layout_fp8, size)
        if xs[0] <= crossing <= xs[-1]:
            ax.plot([crossing], [size / GIB], "D", color=color, markersize=6)
            ax.annotate(
                f"~{crossing / 1e6:.1f}M",
                (crossing, size / GIB),
                textcoords="offset points",
                xytext=(8, -12),
                ha="left",
                fontsize=8,
                color=color,
            )
    if device_memory_bytes is not None:
        ax.axhline(
            device_memory_bytes / GIB,
            color="black",
            linewidth=1.2,
            label=f"{budget_label} ({device_memory_bytes / GIB:g} GiB)",
        )
    top = xs[-1]
    served = operating or layout_fp8
    served_gib = served.kv_bytes(top) / GIB
    ax.plot(
        [top],
        [served_gib],
        "s",
        markersize=11,
        markerfacecolor="none",
        markeredgecolor="black",
        markeredgewidth=1.5,
        label=f"operating point {format_size(top)}: {served_gib:.3g} GiB "
        f"({served.cache_dtype} KV)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted({*xs[:: max(1, math.ceil(len(xs) / 9))], top})))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_size(int(round(value)))))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache per rank (GiB)")
    ranks = f"TP={layout_fp8.tensor_parallel}" if ranks_known else "TP not reported, per rank at 1"
    ax.set_title(f"KV cache footprint: {layout_fp8.architecture}, {ranks}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out


__all__ = [
    "CACHE_DTYPE_BYTES",
    "FP8_CACHE_DTYPE",
    "GIB",
    "CacheLayout",
    "Hardware",
    "ModelConfigError",
    "PointFit",
    "cache_element_bytes",
    "cache_layout",
    "capacity_table",
    "config_model_dtype",
    "crossover_tokens",
    "describe_layout",
    "fit_point",
    "load_model_config",
    "model_dtype_name",
    "plot_kv_footprint",
    "render_capacity_table",
    "token_capacity",
]
