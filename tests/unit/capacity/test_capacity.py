"""The capacity model against the study's figures and vLLM's reported cache sizes.

Expected values are computed here by hand from the layout rules, never read back from the code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from longctx_testing import KIMI_CONFIG

from pytest_longctx.capacity import (
    GIB,
    Hardware,
    ModelConfigError,
    ParallelLayoutError,
    cache_layout,
    capacity_table,
    crossover_tokens,
    describe_layout,
    fit_point,
    load_model_config,
    plot_kv_footprint,
    render_capacity_table,
    token_capacity,
)

MI = 1024**2

# The study's node: 8 ranks of 288 GiB, vLLM at 0.952 utilisation, 91.5e9 bytes of weights.
STUDY_NODE = Hardware(
    devices=8,
    memory_per_device_bytes=288 * GIB,
    memory_utilization=0.952,
    weights_bytes=int(91.5e9),
)


@pytest.fixture(scope="module")
def kimi() -> dict:
    return load_model_config(KIMI_CONFIG)


def llama_8b_like() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    }


def deepseek_v3_like(layers: int = 61) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": layers,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "torch_dtype": "bfloat16",
    }


# --- loading ------------------------------------------------------------------------------


def test_loads_a_config_from_a_file_or_a_model_folder(tmp_path, kimi):
    (tmp_path / "config.json").write_text(KIMI_CONFIG.read_text())
    assert load_model_config(tmp_path) == kimi
    assert kimi["model_type"] == "kimi_linear"


def test_missing_config_names_the_path(tmp_path):
    with pytest.raises(ModelConfigError, match=str(tmp_path / "config.json")):
        load_model_config(tmp_path)
    with pytest.raises(ModelConfigError, match="nope.json"):
        load_model_config(tmp_path / "nope.json")


def test_malformed_config_names_the_path(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text('{"num_hidden_layers": 2,')
    with pytest.raises(ModelConfigError, match="config.json.*JSON"):
        load_model_config(broken)
    broken.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="list"):
        load_model_config(broken)


def test_missing_field_is_named():
    config = deepseek_v3_like()
    del config["qk_rope_head_dim"]
    with pytest.raises(ModelConfigError, match="qk_rope_head_dim"):
        cache_layout(config)


# --- Kimi Linear: the study's figures --------------------------------------------------------


def test_kimi_layout_matches_the_study(kimi):
    fp8 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    bf16 = cache_layout(kimi, cache_dtype="auto", tensor_parallel=8)
    assert (fp8.kind, fp8.attention, fp8.attention_layers, fp8.constant_state_layers) == (
        "hybrid",
        "mla",
        7,
        20,
    )
    latent = 512 + 64
    assert fp8.kv_bytes_per_token == 7 * latent * 1 == 4032
    assert bf16.kv_bytes_per_token == 7 * latent * 2 == 8064
    assert bf16.model_dtype == "bfloat16"
    # The MLA latent is whole on every rank: TP does not change it.
    assert cache_layout(kimi, cache_dtype="fp8", tensor_parallel=1).kv_bytes_per_token == 4032
    assert fp8.kv_replicated


def test_kimi_kv_at_1mi_and_64mi(kimi):
    fp8 = cache_layout(kimi, cache_dtype="fp8_e4m3", tensor_parallel=8)
    bf16 = cache_layout(kimi, cache_dtype="bfloat16", tensor_parallel=8)
    assert fp8.kv_bytes(1 * MI) == 1_048_576 * 4032
    assert fp8.kv_bytes(1 * MI) / GIB == pytest.approx(4, abs=0.07)  # "roughly 4 GiB"
    assert fp8.kv_bytes(64 * MI) == 252 * GIB
    assert bf16.kv_bytes(64 * MI) == 504 * GIB
    assert bf16.kv_bytes(64 * MI) / (96 * GIB) == pytest.approx(2 * 2.625)


def test_kimi_constant_state(kimi):
    layout = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    conv = (4 - 1) * 3 * 32 * 128 * 2  # bf16 model dtype
    recurrent = 32 * 128 * 128 * 4  # float32
    assert (conv, recurrent) == (73_728, 2_097_152)
    assert layout.state_bytes_unsharded == 20 * (conv + recurrent) == 43_417_600
    # vLLM splits the linear-attention heads across ranks.
    assert layout.state_bytes_per_rank == 43_417_600 // 8
    assert cache_layout(kimi, tensor_parallel=1).state_bytes_per_rank == 43_417_600
    # Independent of the KV-cache dtype: the conv state follows the model dtype.
    assert cache_layout(kimi, tensor_parallel=8).state_bytes_per_rank == 43_417_600 // 8


def test_kimi_tp_must_divide_linear_heads(kimi):
    """With 96 attention heads TP=3 divides those, not the 32 KDA heads: a layout error
    naming the profile key and the sizes that shard every part."""
    with pytest.raises(ParallelLayoutError) as info:
        cache_layout({**kimi, "num_attention_heads": 96}, tensor_parallel=3)
    assert str(info.value) == (
        "tensor_parallel_size = 3 does not divide the model's 32 linear-attention heads: vLLM "
        "shards them evenly over the tensor-parallel ranks (linear-attention heads % "
        "tensor_parallel_size == 0); choose one of 1, 2, 4, 8, 16, 32"
    )


def test_kimi_hybrid_block_size_hint(kimi):
    # vLLM: attention block = 128 * ceil(state page / (128 * attention bytes per token)).
    state_page = (73_728 + 2_097_152) // 8
    fp8 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    bf16 = cache_layout(kimi, tensor_parallel=8)
    assert fp8.block_size_hint == 128 * -(-state_page // (128 * 576))
    assert bf16.block_size_hint == 128 * -(-state_page // (128 * 1152))
    assert fp8.block_size_hint * 576 >= state_page
    assert (fp8.block_size_hint - 128) * 576 < state_page


@pytest.mark.parametrize(
    ("reference_gib", "study_millions"),
    [(6, 1.6), (48, 12.8), (96, 25.6)],
)
def test_kimi_crossovers_are_gib_over_decimal_millions(kimi, reference_gib, study_millions):
    fp8 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    tokens = crossover_tokens(fp8, reference_gib * GIB)
    assert fp8.kv_bytes(tokens) >= reference_gib * GIB > fp8.kv_bytes(tokens - 1)
    assert round(tokens / 1e6, 1) == study_millions
    # Decimal gigabytes would not give the study's figures.
    assert round(crossover_tokens(fp8, reference_gib * 1e9) / 1e6, 1) != study_millions


def kimi_request_bytes(layout, tokens: int) -> tuple[int, int, int]:
    """(kv, state, null block) by hand from vLLM's allocator rules for Kimi Linear at TP=8.

    7 MLA layers form one group, the 20 KDA layers three (7, 7, 6 + one padding layer); a
    block costs 7 pages of ``block x 576 x element`` bytes; one request holds
    ``cdiv(tokens, block)`` MLA blocks and two state blocks per state group with prefix
    caching on (vLLM's "align" mode), one with it off.
    """
    block = layout.block_size_hint
    per_block = 7 * block * 576 * layout.element_bytes
    state_blocks = 2 if layout.options["prefix_caching"] else 1
    return -(-tokens // block) * per_block, 3 * state_blocks * per_block, per_block


def test_kimi_64mi_fits_in_fp8_not_in_bf16(kimi):
    fp8 = cache_layout(kimi, cache_dtype="fp8_e4m3", tensor_parallel=8)
    bf16 = cache_layout(kimi, cache_dtype="auto", tensor_parallel=8)
    available = int(288 * GIB * 0.952)
    weights = int(91.5e9) / 8
    kv, state, null = kimi_request_bytes(fp8, 64 * MI + 64)

    good = fit_point(fp8, STUDY_NODE, 64 * MI, decode_tokens=64)
    assert good.fits
    assert good.available_bytes == available
    assert good.kv_bytes == kv
    assert good.kv_bytes == pytest.approx((64 * MI + 64) * 4032, rel=1e-5)
    assert good.state_bytes == state
    assert good.need_bytes == pytest.approx(kv + state + null + weights, abs=1)
    assert good.suggestion is None

    bad = fit_point(bf16, STUDY_NODE, 64 * MI, decode_tokens=64)
    assert not bad.fits
    assert bad.need_bytes > available
    # DCP at the same precision comes before FP8: 8064 B/token over 2 ranks, prefix caching
    # off as a hybrid under DCP runs.
    assert "decode_context_parallel_size = 2 with --no-enable-prefix-caching" in bad.suggestion
    bf16_dcp2 = bf16.with_changes(decode_context_parallel=2, prefix_caching=False)
    kv2, state2, null2 = kimi_request_bytes(bf16_dcp2, -(-(64 * MI + 64) // 2))
    assert f"{(kv2 + state2 + null2 + weights) / GIB:.2f} GiB" in bad.suggestion
    # The reason gives both figures in GiB.
    assert f"{bad.need_bytes / GIB:.2f} GiB" in bad.reason
    assert f"{available / GIB:.2f} GiB" in bad.reason
    # Longest context that fits as configured, by hand, to within a block.
    bf16_kv, bf16_state, bf16_null = kimi_request_bytes(bf16, 0)
    by_hand = (available - int(weights) - bf16_state - bf16_null) // 8064
    assert by_hand - bf16.block_size_hint <= bad.max_tokens <= by_hand


def test_kimi_128mi_needs_dcp_when_even_fp8_is_too_big(kimi):
    fp8 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    point = fit_point(fp8, STUDY_NODE, 128 * MI)
    assert not point.fits
    # More ranks do not shrink the MLA latent, but DCP shards its tokens over the TP ranks.
    assert point.suggestion.startswith("decode_context_parallel_size = 2 ")
    big = Hardware(devices=8, memory_per_device_bytes=16 * GIB, weights_bytes=int(91.5e9))
    assert fit_point(fp8, big, 1024 * MI).suggestion == "no change within this node fits it"
    # 1Gi: even DCP=8 leaves 504 GiB per rank; over 4 nodes (PP=4, vLLM's partition 7/7/7/6
    # layers) the fullest stage holds 2 MLA layers: 2 x 576 B x 1Gi / 8 = 144 GiB.
    far = fit_point(fp8, STUDY_NODE, 1024 * MI).suggestion
    assert far.startswith("no change within this node fits it; 4x the devices over Ray")
    assert "pipeline_parallel_size = 4" in far and "decode_context_parallel_size = 8" in far
    need = float(far.split(" would need ")[1].split(" GiB")[0])
    assert need == pytest.approx((144 * GIB + 91.5e9 / 32) / GIB, abs=0.02)  # + state pages


def test_more_ranks_only_help_mla_through_the_weights(kimi):
    fp8_tp1 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=1)
    node = Hardware(
        devices=8,
        memory_per_device_bytes=96 * GIB,
        memory_utilization=1.0,
        weights_bytes=int(91.5e9),
    )
    # 85.2 GiB of weights plus 15.75 GiB of KV overflow one 96 GiB rank.
    length = 4 * MI  # 15.75 GiB of KV
    point = fit_point(fp8_tp1, node, length)
    assert not point.fits
    # TP=2 halves the weights (42.6 GiB) while the KV stays 15.75 GiB: fits.
    assert point.suggestion.startswith("2 tensor-parallel ranks")


def test_capacity_table_renders_every_length(kimi):
    bf16 = cache_layout(kimi, tensor_parallel=8)
    lengths = [1024 * 2**i for i in range(17)]
    rows = capacity_table(bf16, STUDY_NODE, lengths, decode_tokens=64)
    assert [row.length for row in rows] == lengths
    assert [row.fits for row in rows] == [True] * 16 + [False]
    text = render_capacity_table(rows, bf16)
    assert "64Mi" in text and "1Ki" in text and "NO" in text
    assert "504.00" in text  # KV GiB per rank at 64Mi in BF16
    assert "8,064 B/token" in text
    # 32Mi in BF16 fits with 11.5 GiB of 274 GiB to spare: under 5 %, it reads as borderline.
    assert text.count("yes") == 15 and text.count("borderline") == 1
    assert rows[15].slack_bytes / GIB == pytest.approx(274.18 - 262.67, abs=0.01)


# --- GQA --------------------------------------------------------------------------------------


def test_gqa_llama_8b_like():
    layout = cache_layout(llama_8b_like(), tensor_parallel=1)
    head_dim = 4096 // 32
    assert layout.kind == "gqa"
    assert layout.kv_bytes_per_token == 32 * 2 * 8 * head_dim * 2 == 131_072
    assert cache_layout(llama_8b_like(), tensor_parallel=4).kv_bytes_per_token == 131_072 // 4
    assert not cache_layout(llama_8b_like(), tensor_parallel=8).kv_replicated


def test_gqa_kv_heads_never_go_below_one_per_rank():
    layout = cache_layout(llama_8b_like(), tensor_parallel=16)
    assert layout.kv_bytes_per_token == 32 * 2 * 1 * 128 * 2 == 16_384
    assert layout.kv_replicated


def test_gqa_defaults_and_explicit_head_dim():
    config = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4}
    # No num_key_value_heads: as many as the query heads; head_dim = 256 // 4.
    assert cache_layout(config).kv_bytes_per_token == 2 * 2 * 4 * 64 * 2
    config["head_dim"] = 128
    config["num_key_value_heads"] = 1
    assert cache_layout(config).kv_bytes_per_token == 2 * 2 * 1 * 128 * 2


def test_float32_checkpoints_are_served_in_bfloat16_like_vllm():
    config = {**llama_8b_like(), "torch_dtype": "float32"}
    assert cache_layout(config).model_dtype == "bfloat16"
    assert cache_layout(config, model_dtype="float32").kv_bytes_per_token == 131_072 * 2


def test_more_ranks_suggested_for_gqa():
    layout = cache_layout(llama_8b_like(), tensor_parallel=1, cache_dtype="bfloat16")
    node = Hardware(
        devices=8,
        memory_per_device_bytes=24 * GIB,
        memory_utilization=0.9,
        weights_bytes=16 * 10**9,
    )
    point = fit_point(layout, node, 1 * MI)
    assert not point.fits  # 128 GiB of KV on one 24 GiB device
    # Fewest devices first: FP8 alone needs 64 GiB, TP=2/4 in BF16 need 64/32 GiB,
    # TP=2 FP8 32 GiB, TP=4 FP8 = 16 GiB KV + 3.7 GiB weights <= 21.6 GiB.
    assert point.suggestion.startswith("4 tensor-parallel ranks with an FP8 KV cache")
    no_fp8 = cache_layout(llama_8b_like(), tensor_parallel=1, cache_dtype="fp8")
    assert fit_point(no_fp8, node, 1 * MI).suggestion.startswith("4 tensor-parallel ranks would")


# --- DeepSeek-V3-style MLA --------------------------------------------------------------------


def test_deepseek_v3_like_mla():
    for tp in (1, 8):
        layout = cache_layout(deepseek_v3_like(), tensor_parallel=tp)
        assert layout.kind == "mla"
        assert layout.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
        assert layout.state_bytes_per_rank == 0
        assert layout.block_size_hint is None
    fp8 = cache_layout(deepseek_v3_like(), cache_dtype="fp8_e5m2", tensor_parallel=8)
    assert fp8.kv_bytes_per_token == 61 * 576


# --- DeepSeek-V3.2's sparse MLA: the row is the attention backend's ------------------------


def deepseek_v32_like() -> dict:
    """deepseek-ai/DeepSeek-V3.2's fields that size its cache: 61 MLA layers of 512 + 64 and
    an indexer of 128 per layer."""
    return {
        **deepseek_v3_like(),
        "architectures": ["DeepseekV32ForCausalLM"],
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 2048,
    }


@pytest.mark.parametrize(
    ("backend", "cache_dtype", "row"),
    [
        # FlashMLA-sparse (Hopper) packs any FP8 cache as fp8_ds_mla: 512 + 16 + 128 B.
        ("FLASHMLA_SPARSE", "fp8", 656),
        ("FLASHMLA_SPARSE", "auto", 576 * 2),
        # FlashInfer-sparse (Blackwell SM100) and ROCm's AITER keep the FP8 latent as it is.
        ("FLASHINFER_MLA_SPARSE", "fp8", 576),
        ("FLASHINFER_MLA_SPARSE", "fp8_e4m3", 576),
        ("ROCM_AITER_MLA_SPARSE", "fp8", 576),
        ("ROCM_AITER_MLA_SPARSE", "fp8_e4m3", 576),
        ("ROCM_AITER_MLA_SPARSE", "auto", 576 * 2),
        # FlashInfer-sparse SM120 packs BF16 too (DeepSeek-V3.2's bfloat16 is auto to vLLM).
        ("FLASHINFER_MLA_SPARSE_SM120", "auto", 656),
        ("FLASHINFER_MLA_SPARSE_SM120", "bfloat16", 656),
        ("FLASHINFER_MLA_SPARSE_SM120", "fp8_e4m3", 656),
        # The GPU generation not known: the largest row a CUDA backend keeps for the dtype.
        (None, "fp8", 656),
        (None, "auto", 576 * 2),
    ],
)
def test_the_sparse_mla_row_is_the_backends(backend: str | None, cache_dtype: str, row: int):
    layout = cache_layout(
        deepseek_v32_like(), tensor_parallel=8, cache_dtype=cache_dtype, sparse_mla_backend=backend
    )
    indexer = 128 + 128 // 128 * 4  # FP8 keys and a float32 scale per 128
    assert layout.kv_bytes_per_token == 61 * (row + indexer)
    # The backend (or the assumption) travels with the layout into the plan's other layouts.
    assert layout.with_changes(tensor_parallel=4).kv_bytes_per_token == 61 * (row + indexer)


def test_the_layout_line_names_the_backend_and_what_it_assumes():
    rocm = cache_layout(
        deepseek_v32_like(), cache_dtype="fp8", sparse_mla_backend="ROCM_AITER_MLA_SPARSE"
    )
    line = describe_layout(rocm)
    assert "61 sparse MLA layers x (576 elements x 1 B + 132 B indexer keys)" in line
    assert "rows as vLLM's ROCM_AITER_MLA_SPARSE keeps them" in line
    assert "assumed" not in line
    unknown = describe_layout(cache_layout(deepseek_v32_like(), cache_dtype="fp8"))
    assert "rows as vLLM's FLASHMLA_SPARSE keeps them" in unknown
    assert "assumed, the profile naming no GPU generation" in unknown
    assert "[serving] attention_backend" in unknown


def test_an_unknown_sparse_mla_backend_is_refused_with_the_names():
    with pytest.raises(ValueError, match="sparse_mla_backend must be one of FLASHMLA_SPARSE, "):
        cache_layout(deepseek_v32_like(), sparse_mla_backend="FLASHMLA")


DEEPSEEK_V32_PROFILE = """\
[profile]
description = "DeepSeek-V3.2, 8 GPUs"

[model]
source = "deepseek-ai/DeepSeek-V3.2"
config = "config.json"

[serving]
device = "{device}"
kv_cache_dtype = "{kv_cache_dtype}"
tensor_parallel_size = 8
{backend}

[hardware]
devices = 8
memory_per_device = 309_237_645_312
"""


def deepseek_v32_profile(folder: Path, device: str, kv_cache_dtype: str = "fp8", backend=None):
    from pytest_longctx.profiles import load_profile

    (folder / "config.json").write_text(json.dumps(deepseek_v32_like()))
    path = folder / "deepseek-v32.toml"
    named = f'attention_backend = "{backend}"' if backend else ""
    path.write_text(
        DEEPSEEK_V32_PROFILE.format(device=device, kv_cache_dtype=kv_cache_dtype, backend=named)
    )
    return load_profile(str(path))


@pytest.mark.parametrize(
    ("device", "backend", "row"),
    [
        ("rocm", None, 576),  # ROCm has one sparse-MLA backend: AITER's, plain FP8 rows
        ("cuda", "FLASHINFER_MLA_SPARSE", 576),  # Blackwell SM100, named
        ("cuda", "FLASHMLA_SPARSE", 656),  # Hopper, named
        ("cuda", "FLASHINFER_MLA_SPARSE_SM120", 656),
        ("cuda", None, 656),  # the generation not known: assumed, and said
    ],
)
def test_the_plan_sizes_deepseek_v32_by_the_profiles_device(tmp_path, device, backend, row):
    """vLLM keeps 576 B FP8 rows on ROCm and on SM100's FlashInfer-sparse, 656 B fp8_ds_mla
    rows on FlashMLA-sparse and SM120: 11 % apart, so the plan reads the profile's device."""
    from pytest_longctx.plan import capacity_check

    layout = capacity_check.layout_for(deepseek_v32_profile(tmp_path, device, backend=backend))
    assert layout.kv_bytes_per_token == 61 * (row + 132)
    assert ("assumed" in describe_layout(layout)) == (device == "cuda" and backend is None)


def test_a_cpu_profile_of_a_sparse_mla_model_is_refused(tmp_path):
    from pytest_longctx.capacity import UnservedModelError
    from pytest_longctx.plan import capacity_check

    profile = deepseek_v32_profile(tmp_path, "cpu", kv_cache_dtype="auto")
    with pytest.raises(UnservedModelError, match="CPU platform refuses sparse attention"):
        capacity_check.layout_for(profile)


# --- dtypes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_dtype", "model_dtype", "element_bytes"),
    [
        ("auto", "bfloat16", 2),
        ("auto", "float16", 2),
        ("auto", "float32", 4),
        ("fp8", "bfloat16", 1),
        ("fp8_e4m3", "bfloat16", 1),
        ("fp8_e5m2", "float32", 1),
        ("bfloat16", "float32", 2),
        ("float16", "bfloat16", 2),
    ],
)
def test_element_size_follows_cache_dtype(cache_dtype, model_dtype, element_bytes):
    layout = cache_layout(llama_8b_like(), cache_dtype=cache_dtype, model_dtype=model_dtype)
    assert layout.element_bytes == element_bytes
    assert layout.kv_bytes_per_token == 32 * 2 * 8 * 128 * element_bytes


def test_unknown_cache_dtype_names_the_accepted_values():
    with pytest.raises(ValueError, match="'int4'.*auto.*fp8_e4m3"):
        cache_layout(llama_8b_like(), cache_dtype="int4")


def test_unknown_model_dtype_names_the_accepted_values():
    with pytest.raises(ValueError, match="'float8'.*bfloat16"):
        cache_layout(llama_8b_like(), model_dtype="float8")


# --- vLLM on CPU: reported token capacity ----------------------------------------------------


def test_cpu_llama_tiny_holds_2097152_tokens_in_1gib_at_any_block_size():
    tiny = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    layout = cache_layout(tiny)
    assert layout.kv_bytes_per_token == 2 * 2 * 1 * 64 * 2 == 512
    # 1 GiB / 512 B is a power of two: every power-of-two block divides it.
    for block in (16, 32, 128):
        assert token_capacity(layout, GIB, block) == 2_097_152
        assert token_capacity(layout, GIB, block, max_model_len=32_768) == 2_097_152


@pytest.mark.parametrize("block", [16, 32, 128])
def test_cpu_mla_tiny_capacity_is_whole_blocks_and_the_last_block_effect(block: int):
    """The block size is vLLM's choice (16 or 128 for MLA on CPU, by CPU features): the
    capacity is whole blocks of whichever it chose, and a max_model_len that is not a multiple
    of it wastes part of each request's last block."""
    layout = cache_layout(deepseek_v3_like(layers=2))
    per_token = 2 * 576 * 2
    assert layout.kv_bytes_per_token == per_token == 2304
    whole_blocks = GIB // (block * per_token)
    capacity = token_capacity(layout, GIB, block)
    assert capacity == whole_blocks * block
    # Block rounding alone costs less than one block against the raw quotient ...
    assert 0 <= GIB // per_token - capacity < block
    # ... a max_model_len that is a whole number of blocks costs nothing more ...
    assert token_capacity(layout, GIB, block, max_model_len=block * 1000) == capacity
    # ... and one that is not scales the blocks by max_model_len / (its blocks x block).
    max_model_len = block * 1000 + 1  # 1001 blocks per request, one token of the last used
    expected = int(whole_blocks / 1001 * max_model_len)
    assert token_capacity(layout, GIB, block, max_model_len=max_model_len) == expected
    assert capacity - expected > 0
    assert capacity - expected <= capacity * (block - 1) / max_model_len + 1  # int() truncates


def test_explicit_kv_cache_size_excludes_the_weights():
    tiny = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
    }
    layout = cache_layout(tiny)
    cpu = Hardware(
        devices=1, memory_per_device_bytes=24 * GIB, kv_cache_bytes=GIB, weights_bytes=20 * GIB
    )
    inside = fit_point(layout, cpu, 1 * MI)  # 1Mi x 512 B = 0.5 GiB
    null_block = 16 * 512  # vLLM holds one block (16 tokens here) back before it checks
    assert inside.fits
    assert inside.need_bytes == 1 * MI * 512 + null_block
    assert inside.available_bytes == GIB
    assert inside.weights_bytes == 20 * GIB
    outside = fit_point(layout, cpu, 7 * MI // 2)  # 1.75 GiB of KV in a 1 GiB cache
    assert not outside.fits
    assert "--kv-cache-memory-bytes" in outside.reason
    # 1.75 GiB of cache + 20 GiB of weights > 0.9 x 24 GiB: only a narrower cache would do.
    assert "FP8" in outside.suggestion
    roomy = Hardware(devices=1, memory_per_device_bytes=64 * GIB, kv_cache_bytes=GIB)
    wanted = 4 * MI * 512 + null_block
    assert f"--kv-cache-memory-bytes {wanted}" in fit_point(layout, roomy, 4 * MI).suggestion


def test_fit_point_rejects_more_ranks_than_devices(kimi):
    layout = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    with pytest.raises(ValueError, match="8 tensor-parallel ranks.*4 devices"):
        fit_point(layout, Hardware(devices=4, memory_per_device_bytes=GIB), 1024)


# --- figure -------------------------------------------------------------------------------------


def test_plot_writes_a_png(tmp_path, kimi):
    pytest.importorskip("matplotlib")
    fp8 = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8)
    bf16 = cache_layout(kimi, tensor_parallel=8)
    lengths = [1024 * 2**i for i in range(17)]
    marks = {
        "active decode footprint (6 GiB)": 6 * GIB,
        "half checkpoint (48 GiB)": 48 * GIB,
        "checkpoint (96 GiB)": 96 * GIB,
    }
    out = plot_kv_footprint(
        fp8, bf16, lengths, marks, tmp_path / "fig" / "kv.png", device_memory_bytes=288 * GIB
    )
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 400 and height >= 300
    assert len(data) > 20_000  # lines, labels and legend, not a blank canvas


def test_kimi_test_data_uses_the_real_field_names():
    config = json.loads(KIMI_CONFIG.read_text())
    linear = config["linear_attn_config"]
    assert sorted(linear["full_attn_layers"] + linear["kda_layers"]) == list(range(1, 28))
    assert config["architectures"] == ["KimiLinearForCausalLM"]
    assert "max_position_embeddings" not in config


# --- device memory as the driver reports it ---------------------------------------------------


def fake_tool(folder: Path, name: str, output: str) -> None:
    """An executable on PATH that prints what the real tool prints (its documented format)."""
    path = folder / name
    lines = " ".join(f"'{line}'" for line in output.splitlines())
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines}\n")  # a shell builtin: PATH is bare
    path.chmod(0o755)


def test_the_plan_uses_the_memory_nvidia_smi_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_longctx.plan.capacity_check import hardware_for
    from pytest_longctx.profiles import load_profile

    profile = load_profile("kimi-linear-h200")
    monkeypatch.setenv("PATH", str(tmp_path))  # no GPU tool at all: the profile's figure
    assert hardware_for(profile).memory_per_device_bytes == 143_771 * 2**20
    # --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits
    fake_tool(tmp_path, "nvidia-smi", "\n".join(["NVIDIA H200 NVL, 143000, 580.159.03"] * 8))
    assert hardware_for(profile).memory_per_device_bytes == 143_000 * 2**20


def test_the_plan_uses_the_memory_rocm_smi_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_longctx.plan.capacity_check import hardware_for
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.profiles.hardware import reported_device_memory

    monkeypatch.setenv("PATH", str(tmp_path))
    script = tmp_path / "rocm-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *showproductname*) printf "device,Card series\\ncard0,AMD Instinct MI355X\\n" ;;\n'
        '  *showmeminfo*) printf "device,VRAM Total Memory (B),VRAM Total Used Memory (B)\\n'
        'card0,309220868096,10960896\\n" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    assert reported_device_memory() == (309_220_868_096, "rocm-smi")
    profile = load_profile("kimi-linear-mi355x")
    assert hardware_for(profile).memory_per_device_bytes == 309_220_868_096


#: ``amd-smi static --asic --vram --json`` on an 8x MI355X node (ROCm 7 releases wrap the
#: list in ``gpu_data``; amd-smi's "MB" is MiB: 294896 MiB is rocm-smi's 309,220,868,096 B).
AMD_SMI_STATIC = json.dumps(
    {
        "gpu_data": [
            {
                "gpu": index,
                "asic": {"market_name": "AMD Instinct MI355X", "target_graphics_version": "gfx950"},
                "vram": {"type": "HBM3E", "size": {"value": 294896, "unit": "MB"}},
            }
            for index in range(8)
        ]
    }
)


def test_a_rocm_node_with_only_amd_smi_is_found_and_its_memory_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROCm 7 nodes may carry amd-smi without the deprecated rocm-smi: the launch check finds
    their GPUs and the plan reads their memory from it."""
    from pytest_longctx.plan.capacity_check import hardware_for
    from pytest_longctx.profiles import hardware, load_profile

    monkeypatch.setenv("PATH", str(tmp_path))
    profile = load_profile("kimi-linear-mi355x")
    assert "amd-smi or rocm-smi finds none" in (hardware.missing_devices(profile) or "")
    fake_tool(tmp_path, "amd-smi", AMD_SMI_STATIC)
    assert hardware.missing_devices(profile) is None
    assert hardware.reported_device_memory() == (309_220_868_096, "amd-smi")
    assert hardware_for(profile).memory_per_device_bytes == 309_220_868_096
    assert {gpu["name"] for gpu in hardware.gpus()} == {"AMD Instinct MI355X"}
    # a list of GPUs (earlier releases' form), fewer than the profile needs
    fake_tool(tmp_path, "amd-smi", json.dumps(json.loads(AMD_SMI_STATIC)["gpu_data"][:4]))
    assert hardware.missing_devices(profile) == (
        "it needs 8 ROCM devices and amd-smi finds 4 on this machine"
    )


def test_the_kv_plot_calls_an_explicit_cache_a_budget_not_device_memory() -> None:
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.serving.model_description import describe_launched

    cpu = describe_launched(load_profile("cpu-tiny")).kv_plot()
    assert (cpu["budget_bytes"], cpu["budget_label"]) == (GIB, "KV cache budget")
    gpu = describe_launched(load_profile("kimi-linear-mi355x")).kv_plot()
    assert gpu["budget_label"] == "device memory"
    assert gpu["budget_bytes"] == int(309_237_645_312 * 0.952)


def test_the_kv_gauge_of_a_hybrid_counts_prompt_tokens_not_state_pages(kimi):
    """Kimi Linear: 4 groups share the pool; a request holds cdiv(T, 512) MLA blocks plus two
    blocks of each of its 3 state groups. The gauge's blocks are not all prompt tokens."""
    from pytest_longctx.progress.eta import CostModel, TtftModel
    from pytest_longctx.progress.sampler import Outlook, PointWatch

    allocation = cache_layout(kimi, cache_dtype="fp8", tensor_parallel=8).allocation
    blocks = 4097  # num_gpu_blocks, the null block included
    usage = {"value": 0.0}

    def metrics() -> str:
        return (
            f'vllm:cache_config_info{{block_size="512",num_gpu_blocks="{blocks}"}} 1.0\n'
            f"vllm:kv_cache_usage_perc {usage['value']}\n"
        )

    watch = PointWatch(
        length=100_000,
        repeat=0,
        decode_tokens=16,
        interval_s=3600.0,
        outlook=Outlook(
            "run", 1, 1, CostModel(TtftModel(0.0, 1e-4, 0.0, (1024,)), (0.01, 0.0), 16)
        ),
        read_metrics=metrics,
        tokens_for_blocks=lambda used, block: allocation.tokens_for_blocks(used),
    )
    watch.start()
    try:
        for prompt in (0, 512, 100_000, 1_000_000):
            held = (-(-prompt // 512) + 3 * 2) if prompt else 0  # by hand
            usage["value"] = held / (blocks - 1)
            expected = -(-prompt // 512) * 512
            assert watch._kv_tokens(usage["value"]) == expected
            # The blocks-times-block-size reading would count the 6 state blocks as tokens.
            assert held * 512 - expected == (3072 if prompt else 0)
    finally:
        watch.stop()
    # Capacity: the longest request the 4096 usable blocks hold (6 of them state).
    assert allocation.tokens_for_blocks(blocks - 1) == (blocks - 1 - 6) * 512
