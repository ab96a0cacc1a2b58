"""Real public model configs for every layer pattern, built from the transformers config
classes in the environment with the public ``config.json`` values of the named checkpoints
(nothing is downloaded), and vLLM 0.32's per-rank figure for each at 64Mi and TP=8.

``tests/unit/capacity/test_layer_kinds.py`` computes those figures with vLLM's own allocator on
specs built from vLLM's model code; the plan's session tests compare against them.

Configs built from the classes carry every default the class fills in; a checkpoint's
``config.json`` as published often does not. :data:`PUBLISHED` names the published files kept
under ``tests/support/published_configs/``, each with the public copy it was transcribed from
(``SOURCES.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from longctx_testing import deferred_import

transformers = deferred_import("transformers")

PUBLISHED_DIR = Path(__file__).parent / "published_configs"


@dataclass(frozen=True)
class Published:
    """A checkpoint's config.json as published, and where its copy here was transcribed from."""

    key: str
    model: str
    repo: str
    path: str
    commit: str

    @property
    def file(self) -> Path:
        return PUBLISHED_DIR / f"{self.key}.json"

    def config(self) -> dict:
        """The file's fields as written, nothing filled in."""
        return json.loads(self.file.read_text(encoding="utf-8"))


def _published() -> dict[str, Published]:
    sources = json.loads((PUBLISHED_DIR / "SOURCES.json").read_text(encoding="utf-8"))["files"]
    return {
        name.removesuffix(".json"): Published(name.removesuffix(".json"), **source)
        for name, source in sources.items()
    }


#: The published config.json files, by file name without ``.json``.
PUBLISHED = _published()

#: vLLM 0.32's memory for one request of 64Mi tokens on one rank at TP=8, in GiB (BF16 KV;
#: DeepSeek-V3.2 in FP8, fp8_ds_mla rows or plain ones, and the indexer), as
#: tests/unit/capacity/test_layer_kinds.py has vLLM's allocator compute them.
VLLM_GIB_AT_64MI_TP8 = {
    "gpt-oss-120b": 288.07,
    "gemma-3-27b": 641.00,
    "Llama-4-Scout": 384.42,
    "Qwen3-Next-80B": 768.01,
    "DeepSeek-V3.2": 3004.25,
    # ROCm's and SM100's FlashInfer-sparse FP8 rows: 576 B, not fp8_ds_mla's 656 B.
    "DeepSeek-V3.2 plain FP8 rows": 2699.25,
}


def llama31_70b():
    """meta-llama/Llama-3.1-70B: 80 layers of full attention, 64 heads, 8 KV heads of 128."""
    return transformers.LlamaConfig(
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        hidden_size=8192,
    )


def gpt_oss_120b():
    """openai/gpt-oss-120b: 36 layers, 64 heads, 8 KV heads of 64, 128-token window."""
    return transformers.GptOssConfig(
        num_hidden_layers=36,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        hidden_size=2880,
        sliding_window=128,
        num_local_experts=128,
    )


def gemma3_27b():
    """google/gemma-3-27b-it text config: 62 layers, 5 local : 1 global, window 1024."""
    return transformers.Gemma3TextConfig(
        num_hidden_layers=62,
        num_attention_heads=32,
        num_key_value_heads=16,
        head_dim=128,
        hidden_size=5376,
        sliding_window=1024,
        sliding_window_pattern=6,
    )


def llama4_scout():
    """meta-llama/Llama-4-Scout-17B-16E text config: chunks of 8192, every 4th layer NoPE."""
    return transformers.Llama4TextConfig(
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        hidden_size=5120,
        attention_chunk_size=8192,
        no_rope_layer_interval=4,
    )


def qwen3_next_80b():
    """Qwen/Qwen3-Next-80B-A3B-Instruct: Gated DeltaNet, full attention every 4th layer."""
    return transformers.Qwen3NextConfig(
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        hidden_size=2048,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
    )


def deepseek_v32():
    """deepseek-ai/DeepSeek-V3.2-Exp: 61 MLA layers (512 + 64), indexer head_dim 128."""
    return transformers.DeepseekV32Config(
        num_hidden_layers=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_head_dim=128,
        index_n_heads=64,
        index_topk=2048,
    )


def jamba_v01():
    """ai21labs/Jamba-v0.1: 32 layers, attention at 4 mod 8, Mamba1 (d_state 16, expand 2)."""
    return transformers.JambaConfig(
        num_hidden_layers=32,
        attn_layer_period=8,
        attn_layer_offset=4,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=4096,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
    )


NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def nemotron_h_8b():
    """nvidia/Nemotron-H-8B-Base-8K: Mamba2 (128 heads of 64, state 128, 8 groups)."""
    return transformers.NemotronHConfig(
        hybrid_override_pattern=NEMOTRON_H_8B_PATTERN,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_size=4096,
        mamba_num_heads=128,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
        conv_kernel=4,
    )


#: granite-4.0-h-tiny's ``layer_types`` as its config.json spells them: attention at 5, 15, 25
#: and 35, Mamba2 elsewhere.
GRANITE_4_H_TINY_LAYERS = ["mamba"] * 5 + (["attention"] + ["mamba"] * 9) * 3 + ["attention"]
GRANITE_4_H_TINY_LAYERS += ["mamba"] * 4


def granite_4_h_tiny():
    """ibm-granite/granite-4.0-h-tiny (Granite 4, GraniteMoeHybrid): 40 layers over 1536, 4 of
    GQA attention (12 heads, 4 KV heads of 128), 36 Mamba2 (48 heads of 64, state 128, one
    group, kernel 4, expand 2). transformers spells the layer types ``full_attention`` /
    ``linear_attention``; the published config.json spells them ``attention`` / ``mamba``."""
    return transformers.GraniteMoeHybridConfig(
        num_hidden_layers=40,
        hidden_size=1536,
        intermediate_size=512,
        shared_intermediate_size=1024,
        num_local_experts=64,
        num_experts_per_tok=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        mamba_n_heads=48,
        mamba_d_head=64,
        mamba_d_state=128,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
        layer_types=GRANITE_4_H_TINY_LAYERS,
        position_embedding_type="nope",
        vocab_size=100352,
        max_position_embeddings=131072,
    )


def as_dict(hf_config) -> dict:
    """The config.json a checkpoint ships: what the plan reads."""
    data = hf_config.to_dict()
    if isinstance(hf_config, transformers.NemotronHConfig):  # its config.json spells it so
        data["hybrid_override_pattern"] = NEMOTRON_H_8B_PATTERN
        data["num_hidden_layers"] = len(NEMOTRON_H_8B_PATTERN)
    return data


def lfm2_1_2b():
    """LiquidAI/LFM2-1.2B: 16 layers, short convolutions (conv_dim 2048, L_cache 3) and 6
    GQA layers (32 heads, 8 KV heads of 64). ``conv_dim`` is no field of transformers'
    Lfm2Config; the checkpoint's config.json carries it and vLLM's lfm2.py reads it."""
    return transformers.Lfm2Config(
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=2048,
        conv_L_cache=3,
        conv_dim=2048,
        full_attn_idxs=[2, 5, 8, 10, 12, 14],
    )


def mistral_7b_v01():
    """mistralai/Mistral-7B-v0.1: 32 layers, every one windowed at 4096 tokens."""
    return transformers.MistralConfig(
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_size=4096,
        sliding_window=4096,
    )
