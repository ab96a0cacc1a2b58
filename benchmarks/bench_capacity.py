"""The capacity plan against vLLM's own KV-cache code, per layer pattern, at TP=8.

For each pattern a real model's config (the public config.json values set on the
transformers config class, see tests/unit/capacity/test_layer_kinds.py), per-rank memory for
one request of the given length: the plan, vLLM 0.32's ``get_kv_cache_groups`` +
``_max_memory_usage_bytes_from_groups`` on specs built from its model code, and what counting
every layer as full attention (the plan before it knew the layer kinds) would have said.
Then each published config.json under tests/support/published_configs/ as its checkpoint ships
it: the plan reading the file, vLLM's own config loader reading it for vLLM's side.

    .venv/bin/python benchmarks/bench_capacity.py            # 64Mi
    .venv/bin/python benchmarks/bench_capacity.py --length 1Mi
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "capacity"))
sys.path.insert(0, str(ROOT))

import test_layer_kinds as models  # noqa: E402
import test_published_configs as published  # noqa: E402

from pytest_longctx.capacity import GIB, cache_layout, load_model_config  # noqa: E402
from pytest_longctx.capacity.oracle import vllm_version  # noqa: E402
from pytest_longctx.core.sizes import parse_size  # noqa: E402


def rows(tokens: int) -> list[tuple[str, str, float, float, float]]:
    out = []

    def add(label, source, config, specs, mode="none", dcp=1, **plan_options):  # noqa: ANN001, ANN003
        layout = cache_layout(
            config,
            tensor_parallel=models.TP,
            in_flight_tokens=models.IN_FLIGHT,
            decode_context_parallel=dcp,
            **plan_options,
        )
        plan = sum(layout.request_bytes(tokens))
        vllm = models.vllm_bytes(specs, tokens, dcp=dcp, mode=mode)
        full = float("nan")
        if "kv_lora_rank" not in config:  # every layer counted as full attention
            heads = config["num_attention_heads"]
            head_dim = config.get("head_dim") or config["hidden_size"] // heads
            per_layer = 2 * max(1, config["num_key_value_heads"] // models.TP) * head_dim * 2
            full = config["num_hidden_layers"] * per_layer * tokens
        out.append((label, source, plan / GIB, vllm / GIB, full / GIB))

    cases = [
        ("full attention, 8 KV heads", "meta-llama/Llama-3.1-70B", models.llama31_70b,
         models.llama_specs, None),
        ("alternating 128-token window", "openai/gpt-oss-120b", models.gpt_oss_120b,
         models.gpt_oss_specs, None),
        ("5 local : 1 global, window 1024", "google/gemma-3-27b-it", models.gemma3_27b,
         models.gemma3_specs, None),
        ("chunked local 8192 + NoPE", "meta-llama/Llama-4-Scout-17B-16E", models.llama4_scout,
         models.llama4_specs, None),
        ("Gated DeltaNet + full every 4th", "Qwen/Qwen3-Next-80B-A3B-Instruct",
         models.qwen3_next_80b, models.qwen3_next_specs, "align"),
        ("Mamba1 + attention 1:7", "ai21labs/Jamba-v0.1", models.jamba_v01, models.jamba_specs,
         "align"),
        ("Mamba2 (fp32 SSM) + attention", "nvidia/Nemotron-H-8B-Base-8K", models.nemotron_h_8b,
         models.nemotron_h_specs, "align"),
        ("short conv + attention", "LiquidAI/LFM2-1.2B", models.lfm2_1_2b, models.lfm2_specs,
         "align"),
        ("uniform 4096-token window", "mistralai/Mistral-7B-v0.1", models.mistral_7b_v01,
         models.mistral_specs, None),
    ]  # fmt: skip
    for label, source, config_of, specs_of, mode in cases:
        hf = config_of()
        specs = specs_of(hf) if mode is None else specs_of(hf, mode)
        add(label, source, models.as_dict(hf), specs, mode or "none")
    specs, raw = models.kimi_specs(64, torch.float8_e4m3fn, "none")
    add("KDA + MLA, FP8, DCP=8", "moonshotai/Kimi-Linear-48B-A3B-Instruct", raw, specs,
        dcp=8, cache_dtype="fp8_e4m3", prefix_caching=False)  # fmt: skip
    return out


def sparse_mla_row(tokens: int) -> tuple[str, str, float, float, float]:
    hf = models.deepseek_v32()
    plan = cache_layout(
        models.as_dict(hf), tensor_parallel=models.TP, cache_dtype="fp8", block_size=64
    )
    vllm = models.vllm_bytes(models.deepseek_v32_specs(hf), tokens)
    return (
        "sparse MLA + indexer, fp8_ds_mla",
        "deepseek-ai/DeepSeek-V3.2-Exp",
        sum(plan.request_bytes(tokens)) / GIB,
        vllm / GIB,
        61 * 576 * tokens / GIB,  # as plain MLA in FP8
    )


def published_rows(tokens: int) -> list[tuple[str, str, float, float, float]]:
    """The published files, read as written by the plan and by vLLM's config loader."""
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        for key, cache_dtype, pattern_of in published.CASES:
            folder = Path(scratch) / key
            folder.mkdir()
            hf = published.vllm_text_config(key, folder)
            fp8 = cache_dtype == "fp8"
            kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            specs = models.vllm_specs(hf, pattern_of(hf), kv_dtype=kv_dtype, block=16)
            config = load_model_config(published.PUBLISHED[key].file)
            layout = cache_layout(
                config,
                tensor_parallel=models.TP,
                in_flight_tokens=models.IN_FLIGHT,
                cache_dtype=cache_dtype,
            )
            per_layer = 2 * max(1, hf.num_key_value_heads // models.TP) * hf.head_dim
            full = hf.num_hidden_layers * per_layer * (1 if fp8 else 2) * tokens
            out.append(
                (
                    "published config.json" + (", FP8" if fp8 else ""),
                    published.PUBLISHED[key].model,
                    sum(layout.request_bytes(tokens)) / GIB,
                    models.vllm_bytes(specs, tokens) / GIB,
                    full / GIB,
                )
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", default="64Mi")
    tokens = parse_size(parser.parse_args().length)
    started = time.perf_counter()
    table = [*rows(tokens), sparse_mla_row(tokens), *published_rows(tokens)]
    print(
        f"per-rank KV memory for one request of {tokens:,} tokens, TP=8, BF16 unless said;"
        f" oracle {vllm_version()}"
    )
    header = ("layer pattern", "real config", "plan GiB", "vLLM GiB", "error", "as full attn")
    print(" | ".join(header))
    for label, source, plan, vllm, full in table:
        print(
            f"{label} | {source} | {plan:,.2f} | {vllm:,.2f} | "
            f"{(plan - vllm) / vllm:+.3%} | {full:,.0f}"
        )
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
