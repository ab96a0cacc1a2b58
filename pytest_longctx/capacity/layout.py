"""What one rank caches per token and per sequence, read from a model's config.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.profiles import vllm_releases

from .class_config import ConfigClassError, filled_config
from .groups import Allocation, AllocatorSettings, allocate, describe_groups
from .kinds import (
    ASSUMED_SPARSE_MLA_BACKEND,
    SPARSE_MLA_BACKENDS,
    DTypes,
    LayerConfigError,
    LayerKind,
    is_sparse_mla,
    pp_partition,
    read_layers,
)
from .parallel import check_parallel, check_tensor_parallel

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


class ModelConfigError(ValueError):
    """A ``config.json`` that is missing, unreadable or lacks a field the layout needs."""


class UnservedModelError(ModelConfigError):
    """A model the supported vLLM versions do not serve (where the profile would run it)."""


#: The vLLM releases that refuse the architectures below: every supported one (each lists
#: them in ``_PREVIOUSLY_SUPPORTED_MODELS``, ``model_executor/models/registry.py``).
CHECKED_VLLM_VERSIONS = tuple(row.version for row in vllm_releases.RELEASES)

#: Architectures vLLM dropped, with the last version that served them, that it cannot hand to
#: its Transformers backend either (transformers has no class of that name and the checkpoints'
#: remote code is not backend-compatible: MiniMax-M1's ``modeling_minimax_m1.py`` neither sets
#: ``_supports_attention_backend`` nor uses ``ALL_ATTENTION_FUNCTIONS``), so every checked
#: version refuses them ("was supported in vLLM until v0.23.0"; ``_PREVIOUSLY_SUPPORTED_MODELS``
#: in ``model_executor/models/registry.py``, checked in every release by
#: ``tests/unit/profiles/test_vllm_releases.py``). MiniMaxForCausalLM (the
#: ``-hf`` conversions) is left out: transformers' MiniMaxForCausalLM is backend-compatible, so
#: vLLM serves it through its Transformers backend instead.
UNSERVED_ARCHITECTURES: Mapping[str, str] = {
    "MiniMaxText01ForCausalLM": "0.23.0",  # MiniMaxAI/MiniMax-Text-01
    "MiniMaxM1ForCausalLM": "0.23.0",  # MiniMaxAI/MiniMax-M1-40k, -80k
    "MiniMaxVL01ForConditionalGeneration": "0.23.0",  # MiniMaxAI/MiniMax-VL-01
}


def check_served(config: Mapping[str, Any]) -> None:
    """Raise :class:`UnservedModelError` for a model no supported vLLM version serves."""
    architectures = config.get("architectures")
    for name in architectures if isinstance(architectures, list) else ():
        last = UNSERVED_ARCHITECTURES.get(str(name))
        if last is not None:
            raise UnservedModelError(
                f"{name} is not served by vLLM after {last}: every supported release (vLLM "
                f"{CHECKED_VLLM_VERSIONS[0]} to {CHECKED_VLLM_VERSIONS[-1]}) refuses it "
                f"(\"was supported in vLLM until v{last}\"), so nothing is sized for it"
            )


def load_model_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` at ``path`` (the file itself, or a model folder holding it) as vLLM
    reads it: through its ``model_type``'s transformers config class, defaults filled in and
    a multimodal wrapper's text config on top (:func:`.class_config.filled_config`). A
    ``model_type`` transformers does not know (remote code) is read as plain JSON.
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
    try:
        return filled_config(config)
    except ConfigClassError as exc:
        raise ModelConfigError(f"{config_path}: {exc}") from exc


def text_fields(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's fields under ``text_config``."""
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        return {**config, **text}
    return config


def uses_mla(config: Mapping[str, Any]) -> bool:
    """Whether vLLM caches the config's attention as an MLA latent."""
    return text_fields(config).get("kv_lora_rank") is not None


def uses_sparse_mla(config: Mapping[str, Any]) -> bool:
    """Whether the config's attention is sparse MLA (DeepSeek-V3.2's indexer, ``index_topk``)."""
    return is_sparse_mla(text_fields(config))


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
    #: Per rank: the full-attention layers of its pipeline stage, over the DCP ranks.
    kv_bytes_per_token: int
    state_bytes_per_rank: int  # constant per sequence, unpadded
    state_bytes_unsharded: int
    #: True when ranks hold copies rather than shares of the KV: MLA's latent always, GQA's
    #: heads once there are more ranks than KV heads (DCP shards them again).
    kv_replicated: bool
    #: Smallest attention block vLLM picks for a hybrid so a page holds a state page; None
    #: when the platform default applies.
    block_size_hint: int | None
    #: The config it came from, to re-derive it for another dtype or rank count.
    config: Mapping[str, Any] = field(repr=False, compare=False, hash=False)
    #: Pipeline stages: each rank caches only its stage's layers.
    pipeline_parallel: int = 1
    #: Decode context parallel ranks sharing each attention layer's tokens.
    decode_context_parallel: int = 1
    #: Every cached layer (all stages) as vLLM's model code builds it, and vLLM's allocator.
    layers: tuple[LayerKind, ...] = field(default=(), repr=False, compare=False, hash=False)
    allocation: Allocation | None = field(default=None, repr=False, compare=False, hash=False)
    #: What the layout was built with, so with_changes can rebuild it.
    options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def kv_bytes(self, tokens: int) -> int:
        """Per-rank bytes of the growing full-attention cache for ``tokens`` tokens, unrounded."""
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        return tokens * self.kv_bytes_per_token

    def request_bytes(self, tokens: int) -> tuple[int, int]:
        """(growing, state) bytes vLLM needs on the fullest rank for one ``tokens`` request:
        whole blocks of every group, windows with the tokens in flight, padded state pages."""
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        assert self.allocation is not None
        return self.allocation.request_bytes(tokens)

    def with_changes(
        self,
        *,
        cache_dtype: str | None = None,
        tensor_parallel: int | None = None,
        decode_context_parallel: int | None = None,
        pipeline_parallel: int | None = None,
        block_size: int | None = None,
        prefix_caching: bool | None = None,
    ) -> CacheLayout:
        """The same model under another cache dtype, parallel layout, block size or prefix
        caching."""
        options = dict(self.options)
        changes = {
            "decode_context_parallel": decode_context_parallel,
            "block_size": block_size,
            "prefix_caching": prefix_caching,
        }
        options.update({key: value for key, value in changes.items() if value is not None})
        return cache_layout(
            self.config,
            cache_dtype=self.cache_dtype if cache_dtype is None else cache_dtype,
            model_dtype=self.model_dtype,
            tensor_parallel=self.tensor_parallel if tensor_parallel is None else tensor_parallel,
            pipeline_parallel=(
                self.pipeline_parallel if pipeline_parallel is None else pipeline_parallel
            ),
            **options,
        )


def _parallel_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def cache_layout(
    config: Mapping[str, Any],
    *,
    cache_dtype: str = "auto",
    model_dtype: str | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    decode_context_parallel: int = 1,
    block_size: int | None = None,
    in_flight_tokens: int = 2 * 8192,
    prefix_caching: bool | None = True,
    hybrid_allocator: bool = True,
    pp_layer_partition: str | None = None,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
    prefill_context_parallel: int = 1,
    hybrid_prefix_caching: bool = True,
    hybrid_mla_block_128: bool = True,
    sparse_mla_backend: str | None = None,
) -> CacheLayout:
    """The per-rank cache layout vLLM would build for ``config``.

    ``prefix_caching`` None is vLLM's default for the model's kind: on for attention-only
    models, off for attention-free ones, ``hybrid_prefix_caching`` for hybrids (a release
    fact, as ``hybrid_mla_block_128`` is: whether a hybrid MLA model's block aligns to 128).

    ``model_dtype`` defaults to what ``--dtype auto`` picks (see :func:`config_model_dtype`).
    ``block_size`` is the attention backend's (default 16, MLA 64); hybrids raise it so one
    page holds a state page. ``in_flight_tokens`` (concurrent batches x
    ``max_num_batched_tokens``) is what windowed layers keep beyond their window. With
    ``pipeline_parallel`` stages a rank holds its stage's layers (vLLM's partition,
    ``pp_layer_partition`` being ``VLLM_PP_LAYER_PARTITION``). Invalid parallel layouts raise
    :class:`~pytest_longctx.capacity.parallel.ParallelLayoutError` naming vLLM's rule.
    ``sparse_mla_backend`` is the sparse-MLA attention backend (DeepSeek-V3.2's row depends on
    it, :data:`~pytest_longctx.capacity.kinds.SPARSE_MLA_BACKENDS`); None sizes it as
    :data:`~pytest_longctx.capacity.kinds.ASSUMED_SPARSE_MLA_BACKEND` keeps it. A model no
    supported vLLM serves raises :class:`UnservedModelError`.
    """
    check_served(config)
    pipeline_parallel = _parallel_int("pipeline_parallel", pipeline_parallel)
    tensor_parallel = _parallel_int("tensor_parallel", tensor_parallel)
    dcp = _parallel_int("decode_context_parallel", decode_context_parallel)
    fields = text_fields(config)
    model_dtype = config_model_dtype(fields) if model_dtype is None else model_dtype
    model_dtype = model_dtype_name(model_dtype)
    element_bytes = cache_element_bytes(cache_dtype, model_dtype)
    dtypes = DTypes(
        kv_bytes=element_bytes,
        model=model_dtype,
        mamba_conv=mamba_cache_dtype,
        mamba_ssm=mamba_ssm_cache_dtype,
        cache_dtype=cache_dtype,
        sparse_mla_backend=sparse_mla_backend,
    )
    check_tensor_parallel(fields, tensor_parallel, dtypes)
    try:
        layers = read_layers(fields, tensor_parallel, dtypes)
    except LayerConfigError as exc:
        raise ModelConfigError(f"{exc} ({_architecture(fields)})") from None
    attention, elements, kv_replicated = _attention_elements(fields, tensor_parallel)
    num_layers = max((layer.index for layer in layers), default=0) + 1
    num_layers = max(num_layers, int(fields.get("num_hidden_layers") or num_layers))
    pcp = _parallel_int("prefill_context_parallel", prefill_context_parallel)
    has_state = any(not layer.grows for layer in layers)
    if prefix_caching is None:
        grows = any(layer.grows for layer in layers)
        prefix_caching = grows and (hybrid_prefix_caching if has_state else True)
    check_parallel(
        fields,
        layers,
        tensor_parallel,
        pipeline_parallel,
        dcp,
        attention,
        num_layers,
        pcp,
        prefix_caching=prefix_caching,
    )
    stages = pp_partition(num_layers, pipeline_parallel, pp_layer_partition)
    settings = AllocatorSettings(
        block_size=block_size or (64 if attention == "mla" else 16),
        dcp=dcp,
        in_flight_tokens=in_flight_tokens,
        mamba_cache_mode="align" if prefix_caching and has_state else "none",
        hybrid_allocator=hybrid_allocator,
        hybrid_mla_block_128=hybrid_mla_block_128,
    )
    allocation = allocate(layers, settings, stages)

    def stage_sum(pick: Any) -> int:
        return max(
            sum(pick(layer) for layer in layers if lo <= layer.index < hi) for lo, hi in stages
        )

    full_per_token = stage_sum(lambda x: x.bytes_per_token if x.kind in _GROWING else 0)
    state_per_rank = stage_sum(lambda x: x.state_bytes)
    state_unsharded = sum(
        layer.state_bytes for layer in (read_layers(fields, 1, dtypes) if has_state else ())
    )
    attention_layers = sum(
        1 for layer in layers if layer.kind in ("full", "mla", "sliding", "chunked")
    )
    state_layers = sum(1 for layer in layers if not layer.grows)
    block_size_hint = allocation.block_size if has_state and attention_layers else None
    options = {
        "decode_context_parallel": dcp,
        "block_size": block_size,
        "in_flight_tokens": in_flight_tokens,
        "prefix_caching": prefix_caching,
        "hybrid_allocator": hybrid_allocator,
        "pp_layer_partition": pp_layer_partition,
        "mamba_cache_dtype": mamba_cache_dtype,
        "mamba_ssm_cache_dtype": mamba_ssm_cache_dtype,
        "prefill_context_parallel": prefill_context_parallel,
        "hybrid_prefix_caching": hybrid_prefix_caching,
        "hybrid_mla_block_128": hybrid_mla_block_128,
        "sparse_mla_backend": sparse_mla_backend,
    }
    return CacheLayout(
        architecture=_architecture(fields),
        kind="hybrid" if has_state else attention,
        attention=attention,
        attention_layers=attention_layers,
        constant_state_layers=state_layers,
        tensor_parallel=tensor_parallel,
        cache_dtype=cache_dtype,
        model_dtype=model_dtype,
        element_bytes=element_bytes,
        elements_per_layer_token=elements,
        kv_bytes_per_token=full_per_token // dcp,
        state_bytes_per_rank=state_per_rank,
        state_bytes_unsharded=state_unsharded,
        kv_replicated=kv_replicated and dcp == 1,
        block_size_hint=block_size_hint,
        config=dict(config),
        pipeline_parallel=pipeline_parallel,
        decode_context_parallel=dcp,
        layers=tuple(layers),
        allocation=allocation,
        options=options,
    )


#: Layers whose cache grows with every token (windows and chunks stop growing).
_GROWING = ("full", "mla", "indexer")


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


def describe_layout(layout: CacheLayout) -> str:
    """One line a terminal user can check against the model card, and vLLM's groups."""
    pp, dcp = layout.pipeline_parallel, layout.decode_context_parallel
    layers = f"{layout.attention_layers}"
    if pp > 1 and layout.allocation is not None:
        most = max(
            sum(1 for x in layout.layers if x.kind in ("full", "mla") and lo <= x.index < hi)
            for lo, hi in layout.allocation.stages
        )
        layers = f"{most} (of {layout.attention_layers})"
    per_layer = f"{layout.elements_per_layer_token} elements x {layout.element_bytes} B"
    indexer = next((x for x in layout.layers if x.kind == "indexer"), None)
    row = next((x for x in layout.layers if x.kind == "mla"), None)
    if indexer is not None and row is not None:  # sparse MLA: each layer's row and keys
        if row.variant == "fp8_ds_mla":
            per_layer = f"{row.bytes_per_token:,} B fp8_ds_mla row"
        per_layer = f"({per_layer} + {indexer.bytes_per_token} B indexer keys)"
    kind = "sparse MLA" if indexer is not None else layout.attention.upper()
    grows = (
        f"{layers} {kind} layers x {per_layer}"
        + (f" / DCP {dcp}" if dcp > 1 else "")
        + f" = {layout.kv_bytes_per_token:,} B/token per rank"
    )
    windowed = [layer for layer in layout.layers if layer.kind in ("sliding", "chunked")]
    if windowed:
        grows = grows.replace(
            f"{layers} {layout.attention.upper()} layers",
            (f"{layout.attention_layers - len(windowed)} full {layout.attention.upper()} layers"),
        )
    dtype = layout.cache_dtype
    if dtype == "auto":
        dtype = f"auto = {layout.model_dtype}"
    ranks = f"TP={layout.tensor_parallel}" + (f" x PP={pp}" if pp > 1 else "")
    ranks += f", DCP={dcp}" if dcp > 1 else ""
    parts = [f"{layout.architecture} ({layout.kind}, {ranks}, KV {dtype})"]
    parts.append(grows + (" (replicated on every rank)" if layout.kv_replicated else ""))
    if windowed:
        sizes = sorted({(layer.kind, layer.window) for layer in windowed})
        parts.append(
            f"{len(windowed)} "
            + ", ".join(f"{kind} ({window:,}-token)" for kind, window in sizes)
            + " layers hold their window plus the tokens in flight"
        )
    if layout.constant_state_layers:
        parts.append(
            f"{layout.constant_state_layers} constant-state layers: "
            f"{layout.state_bytes_per_rank / 2**20:.2f} MiB per rank "
            f"({layout.state_bytes_unsharded:,} B = "
            f"{layout.state_bytes_unsharded / 2**20:.2f} MiB unsharded)"
        )
    if indexer is not None:
        parts.append(_sparse_mla_words(layout))
    if layout.allocation is not None:
        parts.append(describe_groups(layout.allocation))
    return "; ".join(parts)


def _sparse_mla_words(layout: CacheLayout) -> str:
    """Which backend's row the sparse-MLA layers were sized with, and whether it is assumed."""
    named = layout.options.get("sparse_mla_backend")
    backend = SPARSE_MLA_BACKENDS[named or ASSUMED_SPARSE_MLA_BACKEND]
    words = f"rows as vLLM's {backend.name} keeps them ({backend.gpus})"
    if named is None:
        words += (
            "; assumed, the profile naming no GPU generation: the largest row a CUDA backend "
            "keeps for this dtype (FLASHINFER_MLA_SPARSE on Blackwell SM100 keeps 576 B FP8 "
            "rows; [serving] attention_backend names the backend)"
        )
    return words
