"""vLLM's validity rules for a parallel layout, checked before anything starts.

Each rule is the check vLLM 0.32 makes at start-up (``config/model.py``,
``config/parallel.py``, ``v1/kv_cache_interface.py``), so a layout vLLM refuses is refused
here with the rule's words instead of an hour into a cluster start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .kinds import DTypes, LayerKind, ShardError, read_layers


class ParallelLayoutError(ValueError):
    """A tensor/pipeline/context-parallel layout vLLM would refuse to start."""


#: The largest tensor-parallel size the accepted values are listed up to.
_LISTED_TP = 64


def check_tensor_parallel(fields: Mapping[str, Any], tp: int, dtypes: DTypes) -> None:
    """Raise :class:`ParallelLayoutError` when vLLM cannot shard the model over ``tp`` ranks:
    the attention heads, and every state layer's heads and channels, must divide evenly.
    Checked before the layers are sized, so the message names the profile key and the sizes
    that would work."""
    problem = _tensor_parallel_problem(fields, tp, dtypes)
    if problem is None:
        return
    accepted = [
        str(size)
        for size in range(1, _LISTED_TP + 1)
        if _tensor_parallel_problem(fields, size, dtypes) is None
    ]
    raise ParallelLayoutError(
        f"tensor_parallel_size = {tp} {problem}; choose one of {', '.join(accepted)}"
    )


def _tensor_parallel_problem(fields: Mapping[str, Any], tp: int, dtypes: DTypes) -> str | None:
    heads = fields.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        return (
            f"does not divide the model's {heads} attention heads: vLLM requires "
            "num_attention_heads % tensor_parallel_size == 0"
        )
    kv_heads = fields.get("num_key_value_heads") or heads
    if (
        fields.get("kv_lora_rank") is None
        and isinstance(kv_heads, int)
        and kv_heads > 0
        and ((kv_heads % tp) if tp < kv_heads else (tp % kv_heads))
    ):
        return (
            f"does not fit the model's {kv_heads} KV heads: vLLM's QKV projection splits "
            "them over the ranks or gives each the same number of ranks "
            "(num_key_value_heads % tensor_parallel_size == 0, or the reverse)"
        )
    try:
        read_layers(fields, tp, dtypes)
    except ShardError as exc:
        return (
            f"does not divide the model's {exc.value} {exc.what}: vLLM shards them evenly "
            f"over the tensor-parallel ranks ({exc.what} % tensor_parallel_size == 0)"
        )
    except ValueError:
        return None  # a config the layer reader refuses: reported as such when it is read
    return None


def check_parallel(
    fields: Mapping[str, Any],
    layers: Sequence[LayerKind],
    tp: int,
    pp: int,
    dcp: int,
    attention: str,
    num_layers: int,
    pcp: int = 1,
    prefix_caching: bool = False,
) -> None:
    """Raise :class:`ParallelLayoutError` naming the first vLLM rule the layout breaks.

    ``pcp`` is prefill context parallel: more ranks, each holding the whole cache. The
    tensor-parallel sharding itself is :func:`check_tensor_parallel`'s. ``prefix_caching``:
    whether the server keeps vLLM's prefix cache on (its default).
    """
    heads = fields.get("num_attention_heads")
    if pp > num_layers:
        raise ParallelLayoutError(
            f"pipeline_parallel_size = {pp} exceeds the model's {num_layers} layers: "
            "every stage needs at least one"
        )
    if pcp > 1 and dcp not in (1, pcp, tp * pcp):
        raise ParallelLayoutError(
            f"decode_context_parallel_size = {dcp} with prefill context parallel {pcp}: vLLM "
            f"needs DCP off, spanning the PCP axis or the whole TP x PCP axis "
            f"(one of {sorted({1, pcp, tp * pcp})})"
        )
    if dcp == 1:
        return
    if pcp == 1 and tp % dcp:
        raise ParallelLayoutError(
            f"decode_context_parallel_size = {dcp} must divide tensor_parallel_size = {tp}: "
            "vLLM's DCP reuses the tensor-parallel ranks (tp % dcp == 0)"
        )
    if any(layer.kind == "sliding" for layer in layers):
        raise ParallelLayoutError(
            f"decode_context_parallel_size = {dcp} with sliding-window layers: vLLM's DCP "
            "does not support sliding window attention (it needs decode_context_parallel_size = 1)"
        )
    states = sum(1 for layer in layers if not layer.grows)
    if states and prefix_caching:
        raise ParallelLayoutError(
            f"decode_context_parallel_size = {dcp} on a model with {states} state (Mamba-style) "
            "layers: vLLM's prefix-cache lookup asserts on them under DCP; add "
            '"--no-enable-prefix-caching" to [serving] extra_args'
        )
    if attention != "mla":
        kv_heads = fields.get("num_key_value_heads") or heads
        if not isinstance(kv_heads, int) or not isinstance(heads, int):
            return
        if tp <= kv_heads:
            raise ParallelLayoutError(
                f"decode_context_parallel_size = {dcp} for GQA/MQA needs tensor_parallel_size "
                f"({tp}) greater than the model's {kv_heads} KV heads (vLLM's rule)"
            )
        if dcp > tp // kv_heads:
            raise ParallelLayoutError(
                f"decode_context_parallel_size = {dcp} exceeds vLLM's maximum tp // kv_heads = "
                f"{tp // kv_heads} for tensor_parallel_size = {tp} and {kv_heads} KV heads"
            )
        if (heads // kv_heads) % dcp:
            raise ParallelLayoutError(
                f"decode_context_parallel_size = {dcp} must divide the model's "
                f"{heads // kv_heads} query heads per KV head (vLLM's rule for GQA/MQA)"
            )
