"""The KV-cache plot of the measured model, drawn from records alone.

The session records what the plot needs (the served model's config, cache dtype, ranks and the
cache budget) in every record's fingerprint, so ``python -m pytest_longctx report`` draws the
same ``kv_cache.png`` as the session, and a model nothing describes gets a line saying why
instead of another model's curve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import KV_CACHE_PLOT as FILENAME
from pytest_longctx.core.records import Record


def kv_plot_info(records: Sequence[Record]) -> Mapping[str, Any] | None:
    """The newest record's description of the measured model's cache, if any."""
    for record in reversed(records):
        info = record.fingerprint.get("kv_plot")
        if isinstance(info, Mapping):
            return info
    return None


def kv_plot_note(records: Sequence[Record]) -> str | None:
    """Why there is no KV-cache plot, when the records say it cannot be drawn."""
    info = kv_plot_info(list(records))
    if info is not None and "unavailable" in info:
        return f"KV-cache plot not drawn: {info['unavailable']}"
    return None


def draw_kv_cache_plot(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Per-rank KV against context length at the measured lengths; None when not describable."""
    from pytest_longctx import capacity

    records = list(records)
    info = kv_plot_info(records)
    if not records or info is None or not isinstance(info.get("config"), Mapping):
        return None
    try:
        layout = capacity.cache_layout(
            info["config"],
            cache_dtype=str(info.get("cache_dtype") or "auto"),
            model_dtype=info.get("model_dtype"),
            tensor_parallel=int(info.get("tensor_parallel") or 1),
        )
    except (ValueError, KeyError):
        return None
    budget = info.get("budget_bytes")
    return capacity.plot_kv_footprint(
        layout.with_changes(cache_dtype="fp8"),
        layout.with_changes(cache_dtype="bfloat16"),
        sorted({record.length for record in records}),
        {str(k): int(v) for k, v in dict(info.get("marks") or {}).items()},
        Path(out_dir) / FILENAME,
        device_memory_bytes=int(budget) if budget else None,
        budget_label=str(info.get("budget_label") or "device memory"),
        operating=layout,
        ranks_known=bool(info.get("tensor_parallel_known", True)),
    )
