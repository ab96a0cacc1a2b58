"""The prefill curve: prefill rate against position in the context, from the longest points'
progress samples (``samples/*.jsonl`` beside the records).

One long request shows how prefill slows as its context grows: every chunk attends to all the
tokens before it. The rates come from the KV-usage readings the sampler took, so they are
block-quantized and dated to a sampling interval (see ``progress.samples``).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from pytest_longctx.core.file_names import PREFILL_RATE_PLOT as FILENAME
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.progress.samples import longest_curves, read_run_samples

#: How many of the longest lengths the plot shows.
CURVES = 3


def draw_prefill_rate_plot(records: Sequence[Record], out_dir: Path) -> Path | None:
    """``prefill_rate.png`` from the samples in ``out_dir``; None when no point has a curve
    (no samples, a server without the KV gauge, or points shorter than two readings)."""
    run_ids = {record.run_id for record in records}
    point_samples = [
        samples
        for samples in read_run_samples(out_dir)
        if samples.run_id is None or not run_ids or samples.run_id in run_ids
    ]
    curves = longest_curves(point_samples, CURVES)
    if not curves:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for samples, curve in curves:
        positions = [position for position, _ in curve]
        rates = [rate for _, rate in curve]
        label = f"{format_size(samples.length)} (repeat {samples.repeat})"
        axes.plot(positions, rates, marker="o", markersize=3, linewidth=1.5, label=label)
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_xlabel("Position in the context (tokens prefilled)")
    axes.set_ylabel("Prefill rate (tokens/s)")
    axes.set_title("Prefill rate along the prompt (longest points, from KV-cache usage)")
    axes.grid(True, alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(Path(out_dir) / FILENAME, buffer.getvalue())
