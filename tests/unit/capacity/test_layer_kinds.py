"""The capacity plan against vLLM 0.32's own KV-cache code, one layer pattern at a time.

Configs are built from the transformers config classes in the environment with the public
``config.json`` values of the named checkpoints. vLLM's side never goes through this
package's config reader: each layer's spec is built from the transformers config object the
way vLLM's model code builds it (the file and line are named), state shapes and dtypes come
from vLLM's model classes themselves (``get_mamba_state_shape_from_config``), and vLLM's
``get_kv_cache_groups`` / ``_max_memory_usage_bytes_from_groups`` decide the memory.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from longctx_testing import KIMI_CONFIG, deferred_import

from pytest_longctx.capacity import (
    GIB,
    ParallelLayoutError,
    cache_layout,
    describe_layout,
    load_model_config,
)
from pytest_longctx.capacity.groups import AllocatorSettings
from pytest_longctx.capacity.kinds import pp_partition

transformers = deferred_import("transformers")
torch = deferred_import("torch")
kv_iface = deferred_import("vllm.v1.kv_cache_interface")
kv_utils = deferred_import("vllm.v1.core.kv_cache_utils")

from public_configs import (  # noqa: E402 - skipped without transformers
    GRANITE_4_H_TINY_LAYERS,
    NEMOTRON_H_8B_PATTERN,
    VLLM_GIB_AT_64MI_TP8,
    as_dict,
    deepseek_v32,
    gemma3_27b,
    gpt_oss_120b,
    granite_4_h_tiny,
    jamba_v01,
    lfm2_1_2b,
    llama4_scout,
    llama31_70b,
    mistral_7b_v01,
    nemotron_h_8b,
    qwen3_next_80b,
)

#: vLLM's own code, imported here: run by the shared servers' session, not the rest's, where
#: vLLM, torch and transformers would stay in the process and every in-process session
#: after them would pay pytest's garbage collections over their heap (5x the CPU a session).
pytestmark = pytest.mark.oracle

MI = 1024**2
TP = 8
IN_FLIGHT = 2 * 8192  # async scheduling's two batches of an H200's 8192 batched tokens


# --- vLLM's side, built from vLLM's model code -------------------------------------------


def vllm_config_for(hf_config, dtype, tp: int, ssm_dtype: str = "auto", conv_dtype: str = "auto"):
    """The fields vLLM's model classes read to size their state (``conv_dtype`` and
    ``ssm_dtype``: ``--mamba-cache-dtype`` and ``--mamba-ssm-cache-dtype``)."""
    return SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        model_config=SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config, dtype=dtype),
        cache_config=SimpleNamespace(
            mamba_cache_dtype=conv_dtype,
            mamba_ssm_cache_dtype=ssm_dtype,
            use_replayssm=False,
            use_kda_recoverssm=False,
        ),
        speculative_config=None,
        num_speculative_tokens=0,
    )


def mamba_spec(model_cls, vllm_config, block: int, padded: int | None, mode: str):
    return kv_iface.MambaSpec(
        block_size=block,
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
        dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
        page_size_padded=padded,
        mamba_cache_mode=mode,
    )


def aligned_block(
    vllm_config, architecture: str, block: int, *, cache_dtype: str = "auto", mode: str = "none"
) -> tuple[int, int | None]:  # noqa: ANN001
    """vLLM's own ``Platform._align_hybrid_block_size`` for the target backend (FlashAttention,
    FlashMLA for MLA): the attention block it raises ``block`` to so that a page holds a state
    page, and the state page size it pads to (None: no padding). The model class comes from
    vLLM's registry; the backends in the model are the one backend."""
    from unittest import mock

    from vllm.config.cache import CacheConfig
    from vllm.platforms.interface import Platform

    hf = vllm_config.model_config.hf_config
    mla = getattr(hf, "kv_lora_rank", None) is not None
    if mla:
        from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend as backend
    else:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend as backend
    cache = CacheConfig(
        block_size=block,
        cache_dtype=cache_dtype,
        mamba_cache_mode=mode,
        mamba_cache_dtype=vllm_config.cache_config.mamba_cache_dtype,
        mamba_ssm_cache_dtype=vllm_config.cache_config.mamba_ssm_cache_dtype,
    )
    tp = vllm_config.parallel_config.tensor_parallel_size
    kv_heads = 1 if mla else max(1, hf.num_key_value_heads // tp)
    head_size = (
        hf.kv_lora_rank + hf.qk_rope_head_dim
        if mla
        else getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    model = SimpleNamespace(
        **vars(vllm_config.model_config),
        use_mla=mla,
        architecture=architecture,
        model_impl="auto",
        convert_type="none",
        runner_type="generate",
        get_num_kv_heads=lambda parallel: kv_heads,
        get_head_size=lambda: head_size,
    )
    config = SimpleNamespace(
        **{**vars(vllm_config), "cache_config": cache, "model_config": model},
        compilation_config=SimpleNamespace(static_forward_context={}),
    )
    only = classmethod(lambda cls, _config: [backend])
    with mock.patch.object(Platform, "_find_non_ssm_backends", only):
        Platform._align_hybrid_block_size(config, backend)
    return cache.block_size, cache.mamba_page_size_padded


def vllm_specs(
    hf_config, pattern, *, kv_dtype, block: int, state=None, mode="none", tp: int = TP
) -> dict:
    """Per layer: FullAttentionSpec / SlidingWindowSpec / ChunkedLocalAttentionSpec as
    ``Attention.get_kv_cache_spec`` builds them (``attention/attention.py``), or the state
    layer's MambaSpec; ``pattern`` is the model code's per-index choice."""
    kv_heads = max(1, hf_config.num_key_value_heads // tp)  # ModelConfig.get_num_kv_heads
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads  # ModelConfig.get_head_size
    )
    common = dict(num_kv_heads=kv_heads, head_size=head_dim, dtype=kv_dtype)
    if state is not None:
        model_cls, vllm_config = state
        block, padded = aligned_block(vllm_config, model_cls.__name__, block, mode=mode)
    specs = {}
    for index, kind in enumerate(pattern):
        name = f"layers.{index}"
        if kind == "full":
            specs[name] = kv_iface.FullAttentionSpec(block_size=block, **common)
        elif kind == "sliding":
            specs[name] = kv_iface.SlidingWindowSpec(
                block_size=block, sliding_window=hf_config.sliding_window, **common
            )
        elif kind == "chunked":
            specs[name] = kv_iface.ChunkedLocalAttentionSpec(
                block_size=block, attention_chunk_size=hf_config.attention_chunk_size, **common
            )
        elif kind == "state":
            specs[name] = mamba_spec(model_cls, vllm_config, block, padded, mode)
    return specs


def vllm_bytes(specs: dict, tokens: int, *, dcp: int = 1, mode: str = "none", tp: int = TP) -> int:
    """vLLM's own memory for one request of ``tokens`` on a rank holding ``specs``."""
    from vllm.v1.core.kv_cache_utils import _max_memory_usage_bytes_from_groups

    from pytest_longctx.capacity.oracle import oracle_config

    config = oracle_config(AllocatorSettings(16, dcp, IN_FLIGHT, mamba_cache_mode=mode), tokens, tp)
    groups = kv_utils.get_kv_cache_groups(config, dict(specs))
    return _max_memory_usage_bytes_from_groups(config, groups)


def plan_bytes(config: dict, tokens: int, *, tp: int = TP, **options) -> int:
    layout = cache_layout(config, tensor_parallel=tp, in_flight_tokens=IN_FLIGHT, **options)
    kv, state = layout.request_bytes(tokens)
    return kv + state


# --- one test per layer pattern -----------------------------------------------------------


def llama_specs(hf) -> dict:  # noqa: ANN001
    return vllm_specs(hf, ["full"] * hf.num_hidden_layers, kv_dtype=torch.bfloat16, block=16)


def test_full_attention_with_kv_heads_replicated_past_tp() -> None:
    hf = llama31_70b()  # 8 KV heads over 8 ranks, one each
    specs = llama_specs(hf)
    assert plan_bytes(as_dict(hf), 64 * MI) == vllm_bytes(specs, 64 * MI) == 80 * 512 * 64 * MI
    # 2 KV heads at TP=8: each rank holds a replica of one (max(1, 2 // 8) = 1).
    hf16 = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=64,
        hidden_size=1024,
    )
    specs = vllm_specs(hf16, ["full"] * 2, kv_dtype=torch.bfloat16, block=16)
    assert plan_bytes(as_dict(hf16), MI) == vllm_bytes(specs, MI) == 2 * 2 * 64 * 2 * MI


def gpt_oss_specs(hf) -> dict:  # noqa: ANN001
    # vLLM's gpt_oss.py:176: sliding_window if layer_idx % 2 == 0, whatever layer_types says.
    pattern = ["sliding" if i % 2 == 0 else "full" for i in range(hf.num_hidden_layers)]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16)


def gemma3_specs(hf) -> dict:  # noqa: ANN001
    # vLLM's gemma3.py:153: config.layer_types[layer_idx]
    pattern = ["sliding" if t == "sliding_attention" else "full" for t in hf.layer_types]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16)


def llama4_specs(hf) -> dict:  # noqa: ANN001
    # vLLM's llama4.py:185,251: NoPE layers (no_rope_layers[i] == 0) attend globally.
    pattern = ["full" if flag == 0 else "chunked" for flag in hf.no_rope_layers]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16)


def qwen3_next_specs(hf, mode: str, **state_dtypes: str) -> dict:  # noqa: ANN001
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

    state = (Qwen3NextForCausalLM, vllm_config_for(hf, torch.bfloat16, TP, **state_dtypes))
    pattern = ["full" if t == "full_attention" else "state" for t in hf.layer_types]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16, state=state, mode=mode)


def jamba_specs(hf, mode: str) -> dict:  # noqa: ANN001
    from vllm.model_executor.models.jamba import JambaForCausalLM

    state = (JambaForCausalLM, vllm_config_for(hf, torch.bfloat16, TP))
    pattern = ["full" if t == "attention" else "state" for t in hf.layers_block_type]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16, state=state, mode=mode)


def nemotron_h_specs(hf, mode: str) -> dict:  # noqa: ANN001
    from vllm.model_executor.models.config import NemotronHForCausalLMConfig
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

    vllm_config = vllm_config_for(hf, torch.bfloat16, TP)
    NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
        cache_config=vllm_config.cache_config, hf_config=hf
    )
    assert vllm_config.cache_config.mamba_ssm_cache_dtype == "float32"
    kinds = {"M": "state", "*": "full"}
    pattern = [kinds.get(char, "none") for char in NEMOTRON_H_8B_PATTERN]
    state = (NemotronHForCausalLM, vllm_config)
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16, state=state, mode=mode)


def test_gpt_oss_alternates_windows_by_layer_index() -> None:
    hf = gpt_oss_120b()
    vllm = vllm_bytes(gpt_oss_specs(hf), 64 * MI)
    assert plan_bytes(as_dict(hf), 64 * MI) == vllm
    assert vllm / GIB == pytest.approx(VLLM_GIB_AT_64MI_TP8["gpt-oss-120b"], abs=0.005)
    assert vllm // GIB == 288  # 18 full layers x 256 B x 64Mi, and the windows


def test_gemma3_local_and_global_layers() -> None:
    hf = gemma3_27b()
    assert hf.layer_types.count("full_attention") == 10
    vllm = vllm_bytes(gemma3_specs(hf), 64 * MI)
    assert plan_bytes(as_dict(hf), 64 * MI) == vllm
    assert vllm / GIB == pytest.approx(VLLM_GIB_AT_64MI_TP8["gemma-3-27b"], abs=0.005)


def test_llama4_chunked_local_attention_and_nope_layers() -> None:
    hf = llama4_scout()
    vllm = vllm_bytes(llama4_specs(hf), 64 * MI)
    assert plan_bytes(as_dict(hf), 64 * MI) == vllm
    assert vllm / GIB == pytest.approx(VLLM_GIB_AT_64MI_TP8["Llama-4-Scout"], abs=0.005)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_qwen3_next_gated_deltanet_state(prefix_caching: bool) -> None:
    hf = qwen3_next_80b()
    mode = "align" if prefix_caching else "none"
    specs = qwen3_next_specs(hf, mode)
    for tokens in (1024, 64 * MI):
        vllm = vllm_bytes(specs, tokens, mode=mode)
        assert plan_bytes(as_dict(hf), tokens, prefix_caching=prefix_caching) == vllm
    assert vllm / GIB == pytest.approx(VLLM_GIB_AT_64MI_TP8["Qwen3-Next-80B"], abs=0.005)


@pytest.mark.parametrize(
    ("conv_dtype", "ssm_dtype"),
    [("auto", "float32"), ("float32", "auto"), ("float16", "float32"), ("auto", "auto")],
)
def test_mamba_cache_dtype_flags_size_the_state(conv_dtype: str, ssm_dtype: str) -> None:
    """``--mamba-cache-dtype`` (conv and SSM state) and ``--mamba-ssm-cache-dtype`` (the SSM
    state alone) as vLLM's Gated DeltaNet reads them; the state outgrows the BF16 default."""
    hf = qwen3_next_80b()
    specs = qwen3_next_specs(hf, "align", conv_dtype=conv_dtype, ssm_dtype=ssm_dtype)
    for tokens in (4096, 64 * MI):
        plan = plan_bytes(
            as_dict(hf), tokens, mamba_cache_dtype=conv_dtype, mamba_ssm_cache_dtype=ssm_dtype
        )
        assert plan == vllm_bytes(specs, tokens, mode="align")
    layout = cache_layout(
        as_dict(hf),
        tensor_parallel=TP,
        mamba_cache_dtype=conv_dtype,
        mamba_ssm_cache_dtype=ssm_dtype,
    )
    default = cache_layout(as_dict(hf), tensor_parallel=TP)
    wider = "float32" in (conv_dtype, ssm_dtype)
    assert (layout.state_bytes_per_rank > default.state_bytes_per_rank) == wider


def lfm2_specs(hf, mode: str) -> dict:  # noqa: ANN001
    from vllm.model_executor.models.lfm2 import Lfm2ForCausalLM

    state = (Lfm2ForCausalLM, vllm_config_for(hf, torch.bfloat16, TP))
    # vLLM's lfm2.py:331: config.layer_types[layer_idx] == "full_attention", else ShortConv.
    pattern = ["full" if t == "full_attention" else "state" for t in hf.layer_types]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16, state=state, mode=mode)


@pytest.mark.parametrize("conv_dim", [2048, 1024])
def test_lfm2_short_convolution_state(conv_dim: int) -> None:
    """LFM2's short convolutions hold ``conv_L_cache - 1`` columns of ``conv_dim`` channels
    (vLLM's lfm2.py reads ``conv_dim``, not ``hidden_size``: 1024 shows which is read)."""
    hf = lfm2_1_2b()
    hf.conv_dim = conv_dim
    specs = lfm2_specs(hf, "align")
    for tokens in (4096, 64 * MI):
        assert plan_bytes(as_dict(hf), tokens) == vllm_bytes(specs, tokens, mode="align")
    layout = cache_layout(as_dict(hf), tensor_parallel=TP)
    assert layout.state_bytes_per_rank == 10 * (3 - 1) * conv_dim // TP * 2  # bf16, 10 layers


def mistral_specs(hf) -> dict:  # noqa: ANN001
    return vllm_specs(hf, ["sliding"] * hf.num_hidden_layers, kv_dtype=torch.bfloat16, block=16)


def test_mistral_uniform_sliding_window() -> None:
    """No ``layer_types``: vLLM sets the model's window on the cache config, so every layer
    is windowed (``engine/arg_utils.py``: CacheConfig.sliding_window when layer_types is None
    or all sliding; ``Attention`` takes it for each layer)."""
    hf = mistral_7b_v01()
    assert getattr(hf, "layer_types", None) is None
    specs = mistral_specs(hf)
    for tokens in (1024, 64 * MI):
        assert plan_bytes(as_dict(hf), tokens) == vllm_bytes(specs, tokens)
    # A window and the tokens in flight per layer, whatever the length.
    assert plan_bytes(as_dict(hf), 64 * MI) == plan_bytes(as_dict(hf), 1 * MI)


def deepseek_v32_specs(hf) -> dict:  # noqa: ANN001
    latent = hf.kv_lora_rank + hf.qk_rope_head_dim
    specs = {}
    for i in range(hf.num_hidden_layers):
        # mla_attention.py:1350: fp8 on FlashMLA-sparse is fp8_ds_mla, 656 B per token.
        specs[f"layers.{i}.attn"] = kv_iface.MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=latent,
            dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla",
            state_content_bytes=656,
        )
        # deepseek_v2.py:731: the indexer's keys, fp8 with a float32 scale per 128.
        specs[f"layers.{i}.indexer"] = kv_iface.MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=hf.index_head_dim + hf.index_head_dim // 128 * 4,
            dtype=torch.uint8,
            cache_role=kv_iface.SparseCacheRole.INDEXER,
        )
    return specs


def test_deepseek_v32_sparse_mla_and_indexer() -> None:
    hf = deepseek_v32()
    vllm = vllm_bytes(deepseek_v32_specs(hf), 64 * MI)
    assert plan_bytes(as_dict(hf), 64 * MI, cache_dtype="fp8", block_size=64) == vllm
    assert vllm == 61 * (656 + 132) * 64 * MI  # 3,004 GiB: the cache is whole on every rank
    # The layout line's arithmetic holds and names what a layer's bytes are.
    layout = cache_layout(as_dict(hf), tensor_parallel=TP, cache_dtype="fp8", block_size=64)
    assert (
        "61 sparse MLA layers x (656 B fp8_ds_mla row + 132 B indexer keys) = 48,068 B/token"
        in describe_layout(layout)
    )
    assert 61 * (656 + 132) == 48_068
    assert vllm / GIB == VLLM_GIB_AT_64MI_TP8["DeepSeek-V3.2"]


def test_deepseek_v32_plain_fp8_rows_on_rocm_and_sm100() -> None:
    """ROCm's AITER and SM100's FlashInfer-sparse keep ``--kv-cache-dtype fp8`` as it is: the
    spec ``MLAAttention.get_kv_cache_spec`` builds (mla_attention.py:1350-1370 in 0.32) holds
    576 FP8 elements a token, no fp8_ds_mla row; the plan sizes that, 11 % below 656 B."""
    hf = deepseek_v32()
    latent = hf.kv_lora_rank + hf.qk_rope_head_dim
    specs = {}
    for i in range(hf.num_hidden_layers):
        specs[f"layers.{i}.attn"] = kv_iface.MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=latent,
            dtype=torch.float8_e4m3fn,
            cache_dtype_str="fp8",
        )
        specs[f"layers.{i}.indexer"] = deepseek_v32_specs(hf)[f"layers.{i}.indexer"]
    vllm = vllm_bytes(specs, 64 * MI)
    assert vllm == 61 * (576 + 132) * 64 * MI
    assert vllm / GIB == VLLM_GIB_AT_64MI_TP8["DeepSeek-V3.2 plain FP8 rows"]
    for backend in ("ROCM_AITER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE"):
        plan = plan_bytes(
            as_dict(hf), 64 * MI, cache_dtype="fp8", block_size=64, sparse_mla_backend=backend
        )
        assert plan == vllm
    packed = vllm_bytes(deepseek_v32_specs(hf), 64 * MI)
    assert (packed - vllm) / vllm == pytest.approx(80 / 708)  # the 11 % the row costs


def test_which_dtypes_a_sparse_mla_backend_packs_is_vllms() -> None:
    """The plan's table against vLLM's own rule (``_canonicalize_sparse_mla_kv_cache_dtype``)
    after DeepSeek-V3.2's own config step (``bfloat16`` read as ``auto``), for each backend
    and dtype."""
    from vllm.model_executor.layers.attention.mla_attention import (
        _canonicalize_sparse_mla_kv_cache_dtype,
    )
    from vllm.model_executor.models.config import DeepseekV32ForCausalLM

    from pytest_longctx.capacity.kinds import SPARSE_MLA_BACKENDS, sparse_mla_row

    hf = deepseek_v32()
    for backend, cache_dtype in itertools.product(
        SPARSE_MLA_BACKENDS, ("auto", "bfloat16", "fp8", "fp8_e4m3")
    ):
        named = SimpleNamespace(get_name=lambda backend=backend: backend)
        vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(hf_config=hf),
            cache_config=SimpleNamespace(cache_dtype=cache_dtype),
        )
        DeepseekV32ForCausalLM.verify_and_update_config(vllm_config)
        vllm = _canonicalize_sparse_mla_kv_cache_dtype(named, vllm_config.cache_config.cache_dtype)
        _, packed = sparse_mla_row(backend, cache_dtype, 576, 1)
        assert packed == (vllm == "fp8_ds_mla"), (backend, cache_dtype, vllm)


def test_jamba_mamba1_state() -> None:
    hf = jamba_v01()
    specs = jamba_specs(hf, "align")
    for tokens in (4096, 64 * MI):
        assert plan_bytes(as_dict(hf), tokens) == vllm_bytes(specs, tokens, mode="align")


def test_nemotron_h_mamba2_state_in_float32() -> None:
    hf = nemotron_h_8b()
    specs = nemotron_h_specs(hf, "align")  # asserts vLLM picks a float32 SSM state
    for tokens in (4096, 64 * MI):
        assert plan_bytes(as_dict(hf), tokens) == vllm_bytes(specs, tokens, mode="align")


def granite4_specs(hf, mode: str, tp: int) -> dict:  # noqa: ANN001
    from vllm.model_executor.models.granitemoehybrid import GraniteMoeHybridForCausalLM

    state = (GraniteMoeHybridForCausalLM, vllm_config_for(hf, torch.bfloat16, tp))
    # vLLM 0.32's granitemoehybrid.py:322-325: full_attention layers attend, linear_attention
    # ones are MambaMixer2 layers sized by the class's own get_mamba_state_shape_from_config.
    pattern = ["full" if t == "full_attention" else "state" for t in hf.layer_types]
    return vllm_specs(hf, pattern, kv_dtype=torch.bfloat16, block=16, state=state, mode=mode, tp=tp)


@pytest.mark.parametrize("tp", [1, 4])
def test_granite4_mamba2_state(tp: int) -> None:
    """Granite 4's ``mamba`` layers are vLLM's Mamba2 (conv over expand x hidden + 2 x groups x
    state, SSM state of heads x head_dim x state in the model dtype), whether the config spells
    them ``mamba`` as published or ``linear_attention`` as transformers now does."""
    from vllm.model_executor.models.granitemoehybrid import GraniteMoeHybridForCausalLM

    hf = granite_4_h_tiny()
    assert hf.layer_types.count("linear_attention") == 36
    published = {**as_dict(hf), "layer_types": GRANITE_4_H_TINY_LAYERS}
    vllm_config = vllm_config_for(hf, torch.bfloat16, tp)
    shapes = GraniteMoeHybridForCausalLM.get_mamba_state_shape_from_config(vllm_config)
    dtypes = GraniteMoeHybridForCausalLM.get_mamba_state_dtype_from_config(vllm_config)
    assert dtypes == (torch.bfloat16, torch.bfloat16)
    specs = granite4_specs(hf, "align", tp)
    for config in (as_dict(hf), published):
        layout = cache_layout(config, tensor_parallel=tp)
        states = [layer for layer in layout.layers if layer.kind == "state"]
        assert len(states) == 36 and {layer.variant for layer in states} == {"mamba2"}
        assert [shape for shape, _ in states[0].state_parts] == [tuple(s) for s in shapes]
        assert {dtype for _, dtype in states[0].state_parts} == {"bfloat16"}
        for tokens in (4096, 64 * MI):
            assert plan_bytes(config, tokens, tp=tp) == vllm_bytes(
                specs, tokens, mode="align", tp=tp
            )


def kimi_specs(block: int, kv_dtype, mode: str, dcp: int = 1) -> tuple[dict, dict]:
    from vllm.models.kimi_k3 import KimiLinearForCausalLM

    raw = load_model_config(KIMI_CONFIG)
    hf = SimpleNamespace(**raw)
    state = (KimiLinearForCausalLM, vllm_config_for(hf, torch.bfloat16, TP))
    latent = raw["kv_lora_rank"] + raw["qk_rope_head_dim"]
    cache_dtype = "fp8_e4m3" if kv_dtype == torch.float8_e4m3fn else "auto"
    block, padded = aligned_block(
        state[1], KimiLinearForCausalLM.__name__, block, cache_dtype=cache_dtype, mode=mode
    )
    specs = {}
    full = set(raw["linear_attn_config"]["full_attn_layers"])
    for i in range(raw["num_hidden_layers"]):
        if i + 1 in full:
            specs[f"layers.{i}"] = kv_iface.MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=latent,
                dtype=kv_dtype,
            )
        else:
            specs[f"layers.{i}"] = mamba_spec(*state, block, padded, mode)
    return specs, raw


@pytest.mark.parametrize("dcp", [1, 8])
def test_kimi_linear_kda_state_and_dcp(dcp: int) -> None:
    mode = "align" if dcp == 1 else "none"  # a DCP profile of a hybrid turns prefix caching off
    specs, raw = kimi_specs(64, torch.float8_e4m3fn, mode)
    tokens = 64 * MI + 1024
    vllm = vllm_bytes(specs, tokens, dcp=dcp, mode=mode)
    plan = plan_bytes(
        raw,
        tokens,
        cache_dtype="fp8_e4m3",
        decode_context_parallel=dcp,
        prefix_caching=dcp == 1,
    )
    assert plan == vllm
    if dcp == 8:
        assert vllm / GIB == pytest.approx(31.5, abs=0.05)  # the "about 31.5 GiB"


@pytest.mark.parametrize(
    ("config_of", "derived", "given"),
    [
        (gemma3_27b, ["layer_types"], {"sliding_window_pattern": 6}),
        (llama4_scout, ["no_rope_layers", "layer_types"], {"no_rope_layer_interval": 4}),
        (qwen3_next_80b, ["layer_types"], {"full_attention_interval": 4}),
    ],
)
def test_a_config_json_without_derived_fields_reads_the_same(config_of, derived, given) -> None:  # noqa: ANN001
    """Checkpoints' config.json often leave out what transformers derives (Gemma 3's
    ``sliding_window_pattern``, Llama 4's ``no_rope_layer_interval``, Qwen3-Next's
    ``full_attention_interval``); vLLM reads the derived fields, so the plan derives them."""
    full = as_dict(config_of())
    sparse = {key: value for key, value in full.items() if key not in derived} | given
    assert plan_bytes(sparse, 64 * MI) == plan_bytes(full, 64 * MI)


# --- parallel axes --------------------------------------------------------------------------


def test_dcp_rules_are_vllms() -> None:
    llama70b = as_dict(llama31_70b())
    with pytest.raises(ParallelLayoutError, match="greater than the model's 8 KV heads"):
        cache_layout(llama70b, tensor_parallel=8, decode_context_parallel=2)
    with pytest.raises(ParallelLayoutError, match="must divide tensor_parallel_size"):
        cache_layout(llama70b, tensor_parallel=16, decode_context_parallel=3)
    with pytest.raises(ParallelLayoutError, match="maximum tp // kv_heads = 2"):
        cache_layout(llama70b, tensor_parallel=16, decode_context_parallel=4)
    ok = cache_layout(llama70b, tensor_parallel=16, decode_context_parallel=2)
    specs = llama_specs(llama31_70b())
    # At TP=16 every rank holds one of 8 KV heads twice over; DCP=2 shards the tokens instead.
    assert sum(ok.request_bytes(64 * MI)) == vllm_bytes(specs, 64 * MI, dcp=2)
    with pytest.raises(ParallelLayoutError, match="does not support sliding window"):
        cache_layout(as_dict(gpt_oss_120b()), tensor_parallel=8, decode_context_parallel=8)


def test_pp_stage_memory_is_vllms_projection() -> None:
    """Gemma 3 over 4 stages: each rank projects the global groups onto its own layers."""
    from vllm.v1.core.kv_cache_utils import (
        _max_memory_usage_bytes_from_groups,
        _project_kv_cache_groups_to_worker,
    )

    from pytest_longctx.capacity.oracle import oracle_config

    hf = gemma3_27b()
    specs = gemma3_specs(hf)
    config = oracle_config(AllocatorSettings(16, 1, IN_FLIGHT), 64 * MI, TP)
    groups = kv_utils.get_kv_cache_groups(config, dict(specs))
    needs = []
    for start, end in pp_partition(62, 4):
        worker = {f"layers.{i}": specs[f"layers.{i}"] for i in range(start, end)}
        projected = _project_kv_cache_groups_to_worker(groups, worker)
        needs.append(_max_memory_usage_bytes_from_groups(config, projected))
    layout = cache_layout(
        as_dict(hf), tensor_parallel=TP, pipeline_parallel=4, in_flight_tokens=IN_FLIGHT
    )
    assert sum(layout.request_bytes(64 * MI)) == max(needs)


def test_the_oracle_in_its_own_process_answers_the_same() -> None:
    """The plan asks vLLM in a subprocess: same answer, per pipeline stage."""
    from pytest_longctx.capacity.oracle import ask_for_layout, ask_in_subprocess

    layout = cache_layout(as_dict(gemma3_27b()), tensor_parallel=TP, pipeline_parallel=4)
    allocation = layout.allocation
    args = (layout.layers, allocation.settings, allocation.stages, 2, 64 * MI)
    here, there = ask_for_layout(*args), ask_in_subprocess(*args)
    assert there == here
    assert len(there.per_stage_bytes) == 4
    assert there.per_rank_bytes == sum(layout.request_bytes(64 * MI))


def test_oracle_answers_for_the_plans_own_layers() -> None:
    """The plan's oracle path: this package's layers as vLLM specs, vLLM's functions."""
    from pytest_longctx.capacity.oracle import ask_vllm, specs_for_layers, vllm_version

    layout = cache_layout(as_dict(qwen3_next_80b()), tensor_parallel=TP)
    settings = layout.allocation.settings
    answer = ask_vllm(specs_for_layers(layout.layers, settings, kv_element_bytes=2), settings, MI)
    assert answer.per_rank_bytes == sum(layout.request_bytes(MI))
    assert answer.version.startswith("vLLM ")
    assert vllm_version() == answer.version


# --- the launched server's own report -------------------------------------------------------


def gpu_cache_labels(num_blocks: int, max_model_len: int) -> tuple[dict[str, str], int, int]:
    """``vllm:cache_config_info`` as a GPU server of Kimi Linear (FP8, FlashMLA, prefix caching
    on) exports it: vLLM's own CacheConfig labels, ``kv_cache_memory_bytes="None"`` as vLLM
    writes an unset size, and the group-aware capacity vLLM computes for ``num_blocks``.
    Returns the labels, vLLM's token capacity and its bytes per block."""
    from vllm.config.cache import CacheConfig
    from vllm.v1.core.kv_cache_utils import _pool_bytes_per_block

    from pytest_longctx.capacity.oracle import oracle_config

    specs, _ = kimi_specs(64, torch.float8_e4m3fn, "align")
    config = oracle_config(
        AllocatorSettings(64, 1, IN_FLIGHT, mamba_cache_mode="align"), max_model_len, TP
    )
    groups = kv_utils.get_kv_cache_groups(config, dict(specs))
    kv_config = kv_iface.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    tokens, _ = kv_utils.get_kv_cache_capacity(config, kv_config)
    block = groups[0].kv_cache_spec.block_size
    cache = CacheConfig(block_size=block, gpu_memory_utilization=0.95, cache_dtype="fp8_e4m3")
    cache.num_gpu_blocks = num_blocks
    cache.kv_cache_size_tokens = tokens
    labels = cache.metrics_info()
    assert labels["kv_cache_memory_bytes"] == "None"
    return labels, tokens, _pool_bytes_per_block(config, groups)


def test_a_gpu_servers_report_is_compared_on_the_blocks_it_made() -> None:
    """On GPUs vLLM sizes the cache itself and exports no byte count: the plan takes the
    server's blocks at its own cost per block and predicts vLLM's group-aware capacity."""
    from pytest_longctx.plan import capacity_check
    from pytest_longctx.profiles import load_profile

    profile = load_profile("kimi-linear-h200")
    max_model_len = 16 * MI + 1024
    labels, tokens, per_block = gpu_cache_labels(60_000, max_model_len)
    check = capacity_check.check_against_server(profile, labels, max_model_len)
    assert check.derived
    assert check.kv_cache_bytes == 60_000 * per_block
    assert (check.reported_tokens, check.compared) == (tokens, "kv_cache_size_tokens")
    assert check.agrees, check.describe()
    assert "(derived: the server's num_gpu_blocks x the plan's bytes per block)" in (
        check.describe()
    )
    # A server whose blocks hold other than the plan's layout is caught.
    wrong = {**labels, "kv_cache_size_tokens": str(tokens * 2)}
    assert not capacity_check.check_against_server(profile, wrong, max_model_len).agrees
