"""`--longctx-plan` on an 8x H200 profile pointing at each layer pattern's public config.

The plan's per-rank figure at 64Mi and TP=8 must come within 3% of vLLM's (the figures
``tests/unit/capacity/test_layer_kinds.py`` has vLLM's allocator compute), the session must end
cleanly even where no change fits, and an invalid layout must be a usage error naming vLLM's
rule.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST
from public_configs import (
    PUBLISHED,
    VLLM_GIB_AT_64MI_TP8,
    as_dict,
    deepseek_v32,
    gemma3_27b,
    gpt_oss_120b,
    llama4_scout,
    qwen3_next_80b,
)

pytestmark = pytest.mark.oracle

#: An 8x H200 node (memory as the driver reports it), the model's config beside the profile.
PROFILE = """\
[profile]
description = "{name}, 8x H200, TP=8"

[model]
source = "{name}"
config = "{config}"
weights_bytes = 100_000_000_000

[serving]
device = "{device}"
dtype = "bfloat16"
kv_cache_dtype = "{kv_cache_dtype}"
tensor_parallel_size = 8
gpu_memory_utilization = 0.95
{serving}

[sweep]
from = "1Mi"
to = "16Mi"
decode_tokens = 16

[hardware]
devices = 8
memory_per_device = 150_754_820_096
"""


def write_profile(
    folder: Path,
    name: str,
    config: dict,
    kv_cache_dtype: str = "auto",
    serving: str = "",
    device: str = "cuda",
) -> Path:
    (folder / f"{name}-config.json").write_text(json.dumps(config))
    path = folder / f"{name}.toml"
    path.write_text(
        PROFILE.format(
            name=name,
            config=f"{name}-config.json",
            kv_cache_dtype=kv_cache_dtype,
            serving=serving,
            device=device,
        )
    )
    return path


def run_plan(pytester: pytest.Pytester, profile: Path) -> pytest.RunResult:
    """A ``--longctx-plan`` session in its own process: this one has transformers (and so
    torch) imported, which an in-process session's module snapshot would tear down."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        f"--longctx-profile={profile}",
        "--longctx-to=64Mi",
        timeout=600,
    )


@pytest.fixture(scope="module")
def configs() -> dict[str, dict]:
    """The configs as their checkpoints ship them. Built before any test's ``pytester``
    (a wider scope is set up first): pytester's module snapshot would drop what transformers
    imports lazily while building one inside a test."""
    return {
        "gpt-oss-120b": as_dict(gpt_oss_120b()),
        "gemma-3-27b": as_dict(gemma3_27b()),
        "Llama-4-Scout": as_dict(llama4_scout()),
        "Qwen3-Next-80B": as_dict(qwen3_next_80b()),
        "DeepSeek-V3.2": as_dict(deepseek_v32()),
    }


@pytest.mark.parametrize(
    ("name", "kv_cache_dtype", "serving"),
    [
        ("gpt-oss-120b", "auto", ""),
        ("gemma-3-27b", "auto", ""),
        ("Llama-4-Scout", "auto", ""),
        ("Qwen3-Next-80B", "auto", ""),
        ("DeepSeek-V3.2", "fp8", 'attention_backend = "FLASHMLA_SPARSE"'),
    ],
)
def test_the_plan_gives_vllms_figure_for_every_layer_pattern(
    configs: dict[str, dict],
    pytester: pytest.Pytester,
    name: str,
    kv_cache_dtype: str,
    serving: str,
) -> None:
    profile = write_profile(
        pytester.path, name, configs[name], kv_cache_dtype=kv_cache_dtype, serving=serving
    )
    assert_vllms_figure_and_no_fit(run_plan(pytester, profile), VLLM_GIB_AT_64MI_TP8[name])


def test_deepseek_v32_on_rocm_is_sized_with_rocms_fp8_rows(
    configs: dict[str, dict], pytester: pytest.Pytester
) -> None:
    """ROCm's one sparse-MLA backend keeps an FP8 cache as 576 B rows, not FlashMLA-sparse's
    656 B fp8_ds_mla ones: the plan for a ROCm node was 11 % high, and now gives vLLM's figure
    and says which backend's rows it counted."""
    config = configs["DeepSeek-V3.2"]
    profile = write_profile(pytester.path, "DeepSeek-V3.2", config, "fp8", device="rocm")
    result = run_plan(pytester, profile)
    assert_vllms_figure_and_no_fit(result, VLLM_GIB_AT_64MI_TP8["DeepSeek-V3.2 plain FP8 rows"])
    result.stdout.fnmatch_lines(["*rows as vLLM's ROCM_AITER_MLA_SPARSE keeps them*"])


def test_minimax_m1_is_refused_before_anything_starts(pytester: pytest.Pytester) -> None:
    """vLLM serves MiniMax-Text-01 and -M1 no more (its last was 0.23.0): the plan says so in
    one line naming the architecture and the versions, instead of sizing layers it guessed."""
    published = PUBLISHED["MiniMax-M1"]
    result = run_plan(pytester, write_profile(pytester.path, "MiniMax-M1", published.config()))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(
        [
            "*MiniMaxM1ForCausalLM is not served by vLLM after 0.23.0: every supported release "
            "(vLLM 0.25.1 to 0.34.0) refuses it*"
        ]
    )
    assert "Traceback" not in result.stderr.str()


def test_a_published_config_json_does_not_fit_where_vllm_refuses(
    pytester: pytest.Pytester,
) -> None:
    """Gemma 3 27B's config.json as published leaves its local/global interleave to the config
    class: read as written, all 62 layers looked windowed (1.03 GiB per rank at 64Mi) and the
    plan said the length fits where vLLM, reading it through the class, needs 641 GiB."""
    published = PUBLISHED["gemma-3-27b-it"]
    profile = write_profile(pytester.path, "gemma-3-27b-it", published.config())
    result = run_plan(pytester, profile)
    assert_vllms_figure_and_no_fit(result, VLLM_GIB_AT_64MI_TP8["gemma-3-27b"])


def assert_vllms_figure_and_no_fit(result: pytest.RunResult, expected: float) -> None:
    """The 64Mi row gives vLLM's per-rank GiB, and the point is skipped as not fitting."""
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    row = re.search(r"^64Mi\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s", out, re.MULTILINE)
    assert row, out
    assert float(row.group(2)) == pytest.approx(expected, rel=0.03)  # KV GiB per rank
    # Nothing this large fits one node: the point is skipped with a change that would fit it.
    assert re.search(r"^64Mi: .*does not fit in .*; \S", out, re.MULTILINE), out
    if importlib.util.find_spec("vllm") is not None:
        # vLLM's allocator is asked at the largest length that can start (64Mi where nothing
        # stops the start): its figure is the plan's row for the tokens it was asked of.
        asked = re.search(r"([\d,]+) tokens need ([\d,.]+) GiB per rank; the plan (\w+)", out)
        assert asked, out
        assert asked.group(3) == "agrees", asked.group(0)
        tokens = asked.group(1)
        at = re.search(rf"^\S+\s+{tokens}\s+([\d.]+)\s", out, re.MULTILINE)
        assert at, out
        figure = float(asked.group(2).replace(",", ""))
        assert figure == pytest.approx(float(at.group(1)), rel=0.03)
        if tokens == row.group(1):
            assert figure == pytest.approx(expected, rel=0.03)


def test_an_invalid_layout_is_a_usage_error_before_anything_starts(
    pytester: pytest.Pytester,
) -> None:
    qwen25_7b = {  # Qwen/Qwen2.5-7B-Instruct: 28 attention heads
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
    }
    result = run_plan(pytester, write_profile(pytester.path, "Qwen2.5-7B", qwen25_7b))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*tensor_parallel_size = 8 does not divide the model's 28 attention heads: vLLM "
            "requires num_attention_heads % tensor_parallel_size == 0; choose one of 1, 2, 4, 28"
        ]
    )
