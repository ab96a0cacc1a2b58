"""The capacity plan against vLLM's own KV-cache code, per layer pattern, at TP=8.

For each pattern a real model's config (the public config.json values set on the
transformers config class, see tests/test_layer_kinds.py), per-rank memory for one request
of the given length: the plan, vLLM 0.32's ``get_kv_cache_groups`` +
``_max_memory_usage_bytes_from_groups`` on specs built from its model code, and what counting
every layer as full attention (the plan before it knew the layer kinds) would have said.

    .venv/bin/python benchmarks/bench_capacity.py            # 64Mi
    .venv/bin/python benchmarks/bench_capacity.py --length 1Mi
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import test_layer_kinds as models  # noqa: E402

from pytest_longctx.capacity import GIB, cache_layout  # noqa: E402
from pytest_longctx.capacity.oracle import vllm_version  # noqa: E402
from pytest_longctx.core.sizes import parse_size  # noqa: E402


def rows(tokens: int) -> list[tuple[str, str, float, float, float]]:
    from vllm.model_executor.models.config import NemotronHForCausalLMConfig
    from vllm.model_executor.models.jamba import JambaForCausalLM
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

    bf16 = torch.bfloat16
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
            per_layer = (
                2
                * max(1, config["num_key_value_heads"] // models.TP)
                * (config.get("head_dim") or config["hidden_size"] // heads)
                * 2
            )
            full = config["num_hidden_layers"] * per_layer * tokens
        out.append((label, source, plan / GIB, vllm / GIB, full / GIB))

    hf = models.gpt_oss_120b()
    pattern = ["sliding" if i % 2 == 0 else "full" for i in range(hf.num_hidden_layers)]
    add(
        "alternating 128-token window",
        "openai/gpt-oss-120b",
        models.as_dict(hf),
        models.vllm_specs(hf, pattern, kv_dtype=bf16, block=16),
    )
    hf = models.gemma3_27b()
    pattern = ["sliding" if t == "sliding_attention" else "full" for t in hf.layer_types]
    add(
        "5 local : 1 global, window 1024",
        "google/gemma-3-27b-it",
        models.as_dict(hf),
        models.vllm_specs(hf, pattern, kv_dtype=bf16, block=16),
    )
    hf = models.llama4_scout()
    pattern = ["full" if flag == 0 else "chunked" for flag in hf.no_rope_layers]
    add(
        "chunked local 8192 + NoPE",
        "meta-llama/Llama-4-Scout-17B-16E",
        models.as_dict(hf),
        models.vllm_specs(hf, pattern, kv_dtype=bf16, block=16),
    )
    hf = models.qwen3_next_80b()
    state = (Qwen3NextForCausalLM, models.vllm_config_for(hf, bf16, models.TP))
    pattern = ["full" if t == "full_attention" else "state" for t in hf.layer_types]
    add(
        "Gated DeltaNet + full every 4th",
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        models.as_dict(hf),
        models.vllm_specs(hf, pattern, kv_dtype=bf16, block=16, state=state, mode="align"),
        mode="align",
    )
    hf = models.jamba_v01()
    state = (JambaForCausalLM, models.vllm_config_for(hf, bf16, models.TP))
    pattern = ["full" if t == "attention" else "state" for t in hf.layers_block_type]
    add(
        "Mamba1 + attention 1:7",
        "ai21labs/Jamba-v0.1",
        models.as_dict(hf),
        models.vllm_specs(hf, pattern, kv_dtype=bf16, block=16, state=state, mode="align"),
        mode="align",
    )
    hf = models.nemotron_h_8b()
    config = models.vllm_config_for(hf, bf16, models.TP)
    NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
        cache_config=config.cache_config, hf_config=hf
    )
    pattern = [{"M": "state", "*": "full"}.get(c, "none") for c in models.NEMOTRON_H_8B_PATTERN]
    add(
        "Mamba2 (fp32 SSM) + attention",
        "nvidia/Nemotron-H-8B-Base-8K",
        models.as_dict(hf),
        models.vllm_specs(
            hf, pattern, kv_dtype=bf16, block=16, state=(NemotronHForCausalLM, config), mode="align"
        ),
        mode="align",
    )
    specs, raw = models.kimi_specs(64, torch.float8_e4m3fn, "none")
    add(
        "KDA + MLA, FP8, DCP=8",
        "moonshotai/Kimi-Linear-48B-A3B-Instruct",
        raw,
        specs,
        dcp=8,
        cache_dtype="fp8_e4m3",
        prefix_caching=False,
    )
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", default="64Mi")
    tokens = parse_size(parser.parse_args().length)
    started = time.perf_counter()
    table = [*rows(tokens), sparse_mla_row(tokens)]
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
