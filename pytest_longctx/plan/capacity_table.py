"""Capacity of the selected points under the session's profile, before any server starts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_longctx import capacity
from pytest_longctx.plan.sweep import SweepPlan
from pytest_longctx.profiles import Profile
from pytest_longctx.profiles import hardware as host


def model_config(profile: Profile) -> dict[str, Any] | None:
    """The model's config.json without a download: shipped copy, local folder or embedded spec."""
    model = profile.model
    if model.config is not None:
        return capacity.load_model_config(model.config)
    if model.embedded_name is not None:
        from pytest_longctx.profiles.embedded_models import get_spec

        spec = get_spec(model.embedded_name)
        return {**spec.model_config(), "architectures": [spec.architecture]}
    source = Path(model.source)
    if (source / "config.json").exists():
        return capacity.load_model_config(source)
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model.source, "config.json", revision=model.revision)
        if isinstance(cached, str):
            return capacity.load_model_config(cached)
    return None


def layout_for(profile: Profile) -> capacity.CacheLayout | None:
    config = model_config(profile)
    if config is None:
        return None
    serving = profile.serving
    return capacity.cache_layout(
        config,
        cache_dtype=serving.kv_cache_dtype,
        model_dtype=None if serving.dtype == "auto" else serving.dtype,
        tensor_parallel=serving.tensor_parallel_size,
        pipeline_parallel=serving.pipeline_parallel_size,
    )


def hardware_for(profile: Profile) -> capacity.Hardware:
    """The profile's hardware; a GPU present here is sized by what its driver reports."""
    serving, hardware = profile.serving, profile.hardware
    memory = hardware.memory_per_device
    reported = None if serving.device == "cpu" else host.reported_device_memory()
    if reported is not None:
        memory = reported[0]
    elif memory is None:  # a CPU profile: the host's memory
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ranks = serving.tensor_parallel_size * serving.pipeline_parallel_size
    return capacity.Hardware(
        devices=max(hardware.devices * hardware.nodes, ranks),
        pipeline_parallel=serving.pipeline_parallel_size,
        memory_per_device_bytes=memory,
        memory_utilization=serving.gpu_memory_utilization or 0.9,
        kv_cache_bytes=serving.kv_cache_memory,
        weights_bytes=profile.model.weights_bytes or 0,
    )


def check_points(plan: SweepPlan, lengths: Sequence[int]) -> dict[int, capacity.PointFit]:
    """One verdict per length for the server the profile launches; empty when the model's
    config is not at hand. (An attached server serves what it serves on hardware the profile
    does not describe: its ``max_model_len`` decides instead.)"""
    profile = plan.profile
    layout = layout_for(profile)
    if layout is None or not lengths:
        return {}
    hardware = hardware_for(profile)
    return {
        fit.length: fit
        for fit in capacity.capacity_table(layout, hardware, lengths, plan.tokens_after_prefix)
    }


def render_table(plan: SweepPlan, lengths: Sequence[int]) -> str:
    profile = plan.profile
    layout = layout_for(profile)
    if layout is None:
        return f"capacity: unknown (no config.json for {profile.model.source} at hand)"
    rows = capacity.capacity_table(layout, hardware_for(profile), lengths, plan.tokens_after_prefix)
    return "capacity plan:\n" + capacity.render_capacity_table(rows, layout)


@dataclass(frozen=True)
class ServerCapacityCheck:
    """The plan's token capacity for the cache vLLM was given, against what vLLM reports."""

    planned_tokens: int
    reported_tokens: int
    block_size: int
    kv_cache_bytes: int

    @property
    def agrees(self) -> bool:
        return abs(self.planned_tokens - self.reported_tokens) < self.block_size

    def describe(self) -> str:
        verdict = "agrees" if self.agrees else "DISAGREES"
        return (
            f"KV cache of {self.kv_cache_bytes:,} B: plan {self.planned_tokens:,} tokens, vLLM "
            f"{self.reported_tokens:,} tokens (block {self.block_size}): {verdict} within a block"
        )


def check_against_server(profile: Profile, cache_labels: dict[str, str]) -> ServerCapacityCheck:
    """Compare with ``vllm:cache_config_info``: its ``num_gpu_blocks`` x ``block_size``.

    (Its ``kv_cache_size_tokens`` is lower when ``--max-model-len`` is not a whole number of
    blocks: a request at full length wastes part of its last block.)
    """
    layout = layout_for(profile)
    if layout is None:
        raise ValueError(f"no model config for {profile.model.source}")
    block_size = int(cache_labels["block_size"])
    kv_bytes = int(
        cache_labels.get("kv_cache_memory_bytes") or profile.serving.kv_cache_memory or 0
    )
    reported = int(cache_labels["num_gpu_blocks"]) * block_size
    planned = capacity.token_capacity(layout, kv_bytes, block_size)
    return ServerCapacityCheck(planned, reported, block_size, kv_bytes)
