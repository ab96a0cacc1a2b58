"""vLLM's own start-up limit: its API server gives up on an engine not ready within
``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s in every supported release), however long the profile
lets the start take. A GPU launch raises it to the profile's budget, and the plan says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from vllm_sources import SourceUnavailable, source_tree

from pytest_longctx.profiles import load_profile
from pytest_longctx.serving.vllm_command import (
    ENGINE_READY_DEFAULT_S,
    ENGINE_READY_ENV,
    build_server_command,
    engine_ready_note,
)


def _command(profile):  # noqa: ANN001, ANN202
    return build_server_command(
        profile, model_path="m", tokenizer_path=None, max_model_len=4096, port=1
    )


def _with(profile, **changes):  # noqa: ANN001, ANN003, ANN202
    return dataclasses.replace(profile, serving=dataclasses.replace(profile.serving, **changes))


def test_a_gpu_launch_waits_for_its_engine_as_long_as_the_profile_allows() -> None:
    profile = load_profile("deepseek-v3.2-mi355x")
    assert profile.serving.startup_timeout_s > ENGINE_READY_DEFAULT_S
    command = _command(profile)
    assert command.env[ENGINE_READY_ENV] == "7200"
    assert "the launch sets it to 7200 s" in (engine_ready_note(profile) or "")


def test_a_budget_vllm_already_covers_and_a_cpu_launch_set_nothing() -> None:
    gpu = _with(load_profile("deepseek-v3.2-mi355x"), startup_timeout_s=600.0)
    assert ENGINE_READY_ENV not in _command(gpu).env and engine_ready_note(gpu) is None
    cpu = load_profile("cpu-tiny")
    assert ENGINE_READY_ENV not in _command(cpu).env


def test_the_profiles_own_value_is_kept_and_a_shorter_one_is_named() -> None:
    profile = load_profile("deepseek-v3.2-mi355x")
    shorter = _with(profile, env={**profile.serving.env, ENGINE_READY_ENV: "900"})
    assert _command(shorter).env[ENGINE_READY_ENV] == "900"
    assert "shorter than startup_timeout_s (7200 s)" in (engine_ready_note(shorter) or "")


@pytest.mark.parametrize("version", ["0.25.1", "0.34.0"])
def test_vllms_default_is_the_one_the_launch_knows(version: str) -> None:
    try:
        folder = Path(source_tree(version))
    except SourceUnavailable as exc:
        pytest.skip(str(exc))
    envs = (folder / "vllm/envs.py").read_text()
    assert f'"{ENGINE_READY_ENV}", "{ENGINE_READY_DEFAULT_S}"' in envs
