"""Per-rank KV cache against context length: the study's Figure 1 layout."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.sizes import format_size

from .fit import crossover_tokens
from .layout import GIB, CacheLayout


def plot_kv_footprint(
    layout_fp8: CacheLayout,
    layout_bf16: CacheLayout,
    lengths: Sequence[int],
    fixed_bytes_marks: Mapping[str, int | float],
    path: str | Path,
    *,
    device_memory_bytes: int | float | None = None,
    budget_label: str = "device memory",
    operating: CacheLayout | None = None,
    ranks_known: bool = True,
) -> Path:
    """Per-rank KV against context length (log-log), the study's Figure 1 layout.

    FP8 and BF16 lines, a horizontal line per fixed-memory reference with the FP8 crossover
    marked, the budget line (device memory, or the explicit KV cache budget) when given, and
    the operating point (the largest length, in ``operating``'s cache dtype, FP8 by default)
    as an open square. Drawn on matplotlib's object API, never pyplot, so a session's own
    backend and figures are left alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not lengths:
        raise ValueError("plot_kv_footprint needs at least one context length")
    xs = sorted(lengths)
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for layout, label, style in ((layout_fp8, "FP8 KV", "-"), (layout_bf16, "BF16 KV", "--")):
        ax.plot(
            xs,
            [layout.kv_bytes(x) / GIB for x in xs],
            style,
            marker="o",
            markersize=3,
            label=f"{label} ({layout.kv_bytes_per_token:,} B/token per rank)",
        )
    _draw_marks(ax, layout_fp8, xs, fixed_bytes_marks)
    if device_memory_bytes is not None:
        ax.axhline(
            device_memory_bytes / GIB,
            color="black",
            linewidth=1.2,
            label=f"{budget_label} ({device_memory_bytes / GIB:g} GiB)",
        )
    _draw_operating_point(ax, operating or layout_fp8, xs[-1])
    ranks = f"TP={layout_fp8.tensor_parallel}" if ranks_known else "TP not reported, per rank at 1"
    _format_axes(ax, xs, f"KV cache footprint: {layout_fp8.architecture}, {ranks}")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(Path(path), buffer.getvalue())


def _draw_marks(
    ax: Any, layout: CacheLayout, xs: Sequence[int], marks: Mapping[str, int | float]
) -> None:
    """A line per fixed-memory reference, and where the FP8 cache crosses it."""
    from matplotlib import rcParams

    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, size) in enumerate(marks.items()):
        color = colors[(index + 2) % len(colors)]
        ax.axhline(size / GIB, color=color, linestyle=":", linewidth=1.2, label=label)
        crossing = crossover_tokens(layout, size)
        if xs[0] <= crossing <= xs[-1]:
            ax.plot([crossing], [size / GIB], "D", color=color, markersize=6)
            ax.annotate(
                f"~{crossing / 1e6:.1f}M",
                (crossing, size / GIB),
                textcoords="offset points",
                xytext=(8, -12),
                ha="left",
                fontsize=8,
                color=color,
            )


def _draw_operating_point(ax: Any, served: CacheLayout, top: int) -> None:
    served_gib = served.kv_bytes(top) / GIB
    ax.plot(
        [top],
        [served_gib],
        "s",
        markersize=11,
        markerfacecolor="none",
        markeredgecolor="black",
        markeredgewidth=1.5,
        label=f"operating point {format_size(top)}: {served_gib:.3g} GiB ({served.cache_dtype} KV)",
    )


def _format_axes(ax: Any, xs: Sequence[int], title: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    top = xs[-1]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted({*xs[:: max(1, math.ceil(len(xs) / 9))], top})))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_size(int(round(value)))))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache per rank (GiB)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
