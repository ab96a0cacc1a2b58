"""Capacity of the selected points under the session's profile, before any server starts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import capacity
from .profiles import Profile
from .run import Run


def model_config(profile: Profile) -> dict[str, Any] | None:
    """The model's config.json without a download: shipped copy, local folder or embedded spec."""
    model = profile.model
    if model.config is not None:
        return capacity.load_model_config(model.config)
    if model.embedded_name is not None:
        from .embedded import get_spec

        return get_spec(model.embedded_name).model_config()
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
    )


def hardware_for(profile: Profile) -> capacity.Hardware:
    serving, hardware = profile.serving, profile.hardware
    memory = hardware.memory_per_device
    if memory is None:  # a CPU profile: the host's memory
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return capacity.Hardware(
        devices=max(hardware.devices, serving.tensor_parallel_size),
        memory_per_device_bytes=memory,
        memory_utilization=serving.gpu_memory_utilization or 0.9,
        kv_cache_bytes=serving.kv_cache_memory,
        weights_bytes=profile.model.weights_bytes or 0,
    )


def check_points(run: Run, lengths: Sequence[int]) -> dict[int, capacity.PointFit]:
    """One verdict per selected length; empty when the model's config is not at hand."""
    profile = run.plan.profile
    layout = layout_for(profile)
    if layout is None or not lengths:
        return {}
    hardware = hardware_for(profile)
    return {
        fit.length: fit
        for fit in capacity.capacity_table(layout, hardware, lengths, run.plan.decode_tokens)
    }


def render_table(run: Run, lengths: Sequence[int]) -> str:
    profile = run.plan.profile
    layout = layout_for(profile)
    if layout is None:
        return f"capacity: unknown (no config.json for {profile.model.source} at hand)"
    rows = capacity.capacity_table(layout, hardware_for(profile), lengths, run.plan.decode_tokens)
    return "capacity plan:\n" + capacity.render_capacity_table(rows, layout)
