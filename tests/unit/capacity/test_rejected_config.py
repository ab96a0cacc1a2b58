"""A config.json the model's transformers class rejects is the user's to fix: one line naming
the file and the class's reason, with a usage error's exit status, never an INTERNALERROR.

The file is Falcon-H1-0.5B's as published, less ``mamba_d_ssm``: FalconH1Config then takes its
default (1,024), which its 24 Mamba heads of 64 do not divide, and refuses it, as vLLM would
refuse to load it. With the key given its value (24 x 64 = 1,536) the same file is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST

pytestmark = pytest.mark.oracle

#: tiiuae/Falcon-H1-0.5B's config.json fields as NVIDIA-NeMo/Megatron-Bridge transcribes them
#: (tests/unit_tests/models/falcon_h1/test_falcon_h1_bridge.py, FALCON_H1_500M_CONFIG, commit
#: ebd91e974d0b2caba82fc91c09b47e77e2dd53fc), where ``mamba_d_ssm`` is left out.
FALCON_H1_WITHOUT_D_SSM = {
    "architectures": ["FalconH1ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_in_multiplier": 1.0,
    "attention_out_multiplier": 0.9375,
    "attn_layer_indices": None,
    "embedding_multiplier": 5.656854249492381,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "key_multiplier": 0.39062499999999994,
    "lm_head_multiplier": 0.0390625,
    "mamba_chunk_size": 128,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 24,
    "mamba_norm_before_gate": False,
    "mamba_proj_bias": False,
    "mamba_rms_norm": False,
    "mamba_use_mlp": True,
    "max_position_embeddings": 16384,
    "mlp_bias": False,
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "model_type": "falcon_h1",
    "num_attention_heads": 8,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "projectors_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_scaling": None,
    "rope_theta": 100000000000.0,
    "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32784,
}

PROFILE = """
[model]
source = "tiiuae/Falcon-H1-0.5B-Instruct"
config = "falcon-h1-config.json"

[serving]
device = "cuda"

[sweep]
from = "1Ki"
to = "4Ki"

[hardware]
devices = 1
memory_per_device = "80Gi"
"""


def plan(pytester: pytest.Pytester, config: dict, *args: str) -> pytest.RunResult:
    """``--longctx-plan`` in a Python of its own (transformers not imported: the class runs
    in the warm Python, as in a user's session) with a profile beside ``config``."""
    (pytester.path / "falcon-h1-config.json").write_text(json.dumps(config, indent=2))
    (pytester.path / "falcon-h1.toml").write_text(PROFILE)
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--longctx-profile=falcon-h1.toml", "--longctx-plan", *args
    )


@pytest.mark.parametrize(
    "attach", [(), ("--longctx-url=http://127.0.0.1:9",)], ids=["launched", "attached"]
)
def test_a_config_its_class_rejects_is_one_line_and_a_usage_error(
    pytester: pytest.Pytester, attach: tuple[str, ...]
) -> None:
    result = plan(pytester, FALCON_H1_WITHOUT_D_SSM, *attach)
    said = result.stdout.lines + result.stderr.lines
    assert result.ret == pytest.ExitCode.USAGE_ERROR, "\n".join(said)
    assert not [line for line in said if "INTERNALERROR" in line or "Traceback" in line], said
    errors = [line for line in said if line.startswith("ERROR:")]
    config = Path(pytester.path / "falcon-h1-config.json").resolve()
    assert len(errors) == 1, said
    assert errors[0].startswith(
        f"ERROR: profile falcon-h1: {config}: transformers' FalconH1Config rejects it: "
    ), said
    assert "mamba_n_heads must divide mamba_expand * hidden_size" in errors[0], said


def test_the_same_file_with_the_key_is_read(pytester: pytest.Pytester) -> None:
    """The control: the file is fine but for the key its class cannot do without."""
    heads, head = FALCON_H1_WITHOUT_D_SSM["mamba_n_heads"], FALCON_H1_WITHOUT_D_SSM["mamba_d_head"]
    result = plan(pytester, {**FALCON_H1_WITHOUT_D_SSM, "mamba_d_ssm": heads * head})
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert "capacity plan:" in result.stdout.str()
