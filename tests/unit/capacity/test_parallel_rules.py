"""The plan's parallel-layout rules against vLLM 0.32's own checks, case by case.

vLLM decides each case with its own code: ``ParallelConfig``'s validator (TP x PCP x DCP),
``ModelConfig.verify_with_parallel_config`` (attention heads over TP; for GQA/MQA under DCP,
more ranks than KV heads, at most ``tp // kv_heads``, and query heads per KV head divisible
by DCP), ``QKVParallelLinear`` (KV heads split over the ranks or replicated evenly), the
sliding-window spec's memory function (no DCP) and ``get_pp_indices``. No CPU backend runs
DCP, so these are checked as vLLM's code, not on a server.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from longctx_testing import KIMI_CONFIG, deferred_import

from pytest_longctx.capacity import ParallelLayoutError, cache_layout, load_model_config
from pytest_longctx.capacity.kinds import pp_partition

#: vLLM's own code, imported here: run by the shared servers' session, not the rest's, where
#: vLLM, torch and transformers would stay in the process and every in-process session
#: after them would pay pytest's garbage collections over their heap (5x the CPU a session).
pytestmark = pytest.mark.oracle

torch = deferred_import("torch")
vllm_parallel = deferred_import("vllm.config.parallel")
vllm_model = deferred_import("vllm.config.model")
kv_iface = deferred_import("vllm.v1.kv_cache_interface")


def gqa_config(heads: int, kv_heads: int, sliding_window: int | None = None) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": 64,
        "hidden_size": heads * 64,
    }
    if sliding_window:
        config["sliding_window"] = sliding_window  # Mistral-style: every layer windowed
    return config


def vllm_refuses(heads: int, kv_heads: int, tp: int, dcp: int) -> str | None:
    """What vLLM says of the layout: None when it accepts it, else its error."""
    from pydantic import ValidationError
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.linear import QKVParallelLinear

    try:
        parallel = vllm_parallel.ParallelConfig(
            tensor_parallel_size=tp, decode_context_parallel_size=dcp
        )
        model = SimpleNamespace(  # the fields verify_with_parallel_config reads
            model_arch_config=SimpleNamespace(total_num_attention_heads=heads),
            use_mla=False,
            get_total_num_kv_heads=lambda: kv_heads,
            multimodal_config=None,
        )
        vllm_model.ModelConfig.verify_with_parallel_config(model, parallel)
    except (ValidationError, ValueError) as exc:
        return str(exc)
    # The model's QKV projection on rank 0 of a TP group of that size, built on no memory.
    group = SimpleNamespace(world_size=tp, rank_in_group=0)
    with mock.patch.object(parallel_state, "_TP", group), torch.device("meta"):
        try:
            QKVParallelLinear(
                hidden_size=64,
                head_size=8,
                total_num_heads=heads,
                total_num_kv_heads=kv_heads,
                bias=False,
            )
        except AssertionError as exc:
            return str(exc)
    return None


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "dcp"),
    [
        (28, 4, 8, 1),  # Qwen2.5-7B: TP must divide the attention heads
        (28, 4, 4, 1),
        (28, 4, 7, 1),  # divides the heads, not the 4 KV heads
        (28, 4, 28, 1),  # each KV head on 7 ranks
        (48, 12, 8, 1),  # 12 KV heads over 8 ranks
        (48, 12, 4, 1),
        (64, 8, 8, 2),  # GQA under DCP needs more ranks than KV heads
        (64, 8, 16, 2),
        (64, 8, 16, 4),  # at most tp // kv_heads = 2
        (64, 8, 16, 3),  # DCP must divide TP
        (40, 8, 40, 2),  # 5 query heads per KV head: DCP must divide them
        (40, 8, 40, 5),
        (32, 32, 8, 2),  # MHA: as many KV heads as ranks
        (32, 1, 8, 8),  # MQA: one KV head, DCP over all 8 ranks
    ],
)
def test_tp_and_dcp_are_refused_exactly_where_vllm_refuses(
    heads: int, kv_heads: int, tp: int, dcp: int
) -> None:
    refusal = vllm_refuses(heads, kv_heads, tp, dcp)
    try:
        cache_layout(gqa_config(heads, kv_heads), tensor_parallel=tp, decode_context_parallel=dcp)
        plan = None
    except ParallelLayoutError as exc:
        plan = str(exc)
    assert (plan is None) == (refusal is None), f"plan: {plan}; vLLM: {refusal}"


def test_sliding_windows_under_dcp_are_refused_as_vllm_refuses_them() -> None:
    """A layout vLLM's GQA rules accept (TP=16, DCP=2, 8 KV heads) with windowed layers:
    vLLM's sliding-window spec refuses to size itself under DCP, and the plan refuses it."""
    from pytest_longctx.capacity.groups import AllocatorSettings
    from pytest_longctx.capacity.oracle import oracle_config

    assert vllm_refuses(64, 8, 16, 2) is None
    spec = kv_iface.SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16, sliding_window=4096
    )
    with pytest.raises(AssertionError, match="DCP not support sliding window"):
        spec.max_memory_usage_bytes(oracle_config(AllocatorSettings(16, dcp=2), 1024, 16))
    mistral = gqa_config(64, 8, sliding_window=4096)
    with pytest.raises(ParallelLayoutError, match="sliding-window layers"):
        cache_layout(mistral, tensor_parallel=16, decode_context_parallel=2)
    assert cache_layout(mistral, tensor_parallel=16).decode_context_parallel == 1


@pytest.mark.parametrize(
    ("tp", "pcp", "dcp"),
    [(8, 1, 3), (8, 1, 4), (8, 1, 8), (8, 2, 4), (8, 2, 2), (8, 2, 16), (4, 4, 2), (4, 1, 6)],
)
def test_tp_pcp_dcp_combinations_are_refused_exactly_where_vllm_refuses(
    tp: int, pcp: int, dcp: int
) -> None:
    """vLLM's own ParallelConfig validator decides; the plan must agree on every layout."""
    from pydantic import ValidationError

    try:
        vllm_parallel.ParallelConfig(
            tensor_parallel_size=tp,
            prefill_context_parallel_size=pcp,
            decode_context_parallel_size=dcp,
        )
        vllm_accepts = True
    except (ValidationError, ValueError):
        vllm_accepts = False
    kimi = load_model_config(KIMI_CONFIG)  # MLA: no GQA head rules on top
    kimi = {**kimi, "num_attention_heads": 32}
    try:  # prefix caching off, as the plan has a hybrid under DCP run
        cache_layout(kimi, tensor_parallel=tp, decode_context_parallel=dcp,
                     prefill_context_parallel=pcp, prefix_caching=False)  # fmt: skip
        plan_accepts = True
    except ParallelLayoutError:
        plan_accepts = False
    assert plan_accepts == vllm_accepts


@pytest.mark.parametrize(
    ("layers", "pp", "override"),
    [(61, 4, None), (27, 4, None), (48, 3, None), (27, 2, "13,14"), (62, 8, None)],
)
def test_pp_partition_is_vllms(monkeypatch, layers: int, pp: int, override: str | None) -> None:
    from vllm import envs
    from vllm.distributed.utils import get_pp_indices

    if override is None:
        monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    else:
        monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", override)
    monkeypatch.setattr(envs, "VLLM_PP_LAYER_PARTITION", override, raising=False)
    assert pp_partition(layers, pp, override) == [
        get_pp_indices(layers, rank, pp) for rank in range(pp)
    ]
