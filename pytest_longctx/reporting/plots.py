"""TTFT and decode-throughput curves against prompt length (the study's Figures 2 and 3).

Figures are drawn on matplotlib's object API with the Agg canvas, never through pyplot, so
drawing a report inside a pytest session leaves the user's backend and global state alone.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from pytest_longctx.core.file_names import DECODE_PLOT as DECODE_FILENAME
from pytest_longctx.core.file_names import TTFT_PLOT as TTFT_FILENAME
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.stats import summarize
from pytest_longctx.rendering.axes import length_axis

#: A plot another module contributes: draws from records into the run folder, or returns None.
ExtraPlot = Callable[[Sequence[Record], Path], "Path | None"]


def _series(records: Iterable[Record], figure: str) -> tuple[list[int], list[float], list[float]]:
    """Lengths with at least one passed value, their means and standard deviations."""
    lengths, means, stds = [], [], []
    for summary in summarize(records, figures=(figure,)):
        stat = summary.figure(figure)
        if stat is None:
            continue
        lengths.append(summary.length)
        means.append(stat.mean)
        stds.append(stat.std)
    return lengths, means, stds


def _draw(
    path: Path,
    lengths: list[int],
    means: list[float],
    stds: list[float],
    *,
    ylabel: str,
    title: str,
    log_y: bool,
) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.errorbar(lengths, means, yerr=stds, marker="o", markersize=4, capsize=3, linewidth=1.5)
    length_axis(axes, lengths, log_y=log_y, pad=False)
    axes.set_xlabel("Prompt length (tokens)")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="major", alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(path, buffer.getvalue())


def plot_ttft(records: Iterable[Record], path: Path) -> Path | None:
    """Log-log TTFT against length, mean ± std; None (and no file) without passed points."""
    lengths, means, stds = _series(records, "ttft")
    if not lengths:
        return None
    # A log axis cannot show 0; a non-positive TTFT would be a broken clock, not a point.
    keep = [i for i, mean in enumerate(means) if mean > 0]
    lengths = [lengths[i] for i in keep]
    means, stds = ([seq[i] for i in keep] for seq in (means, stds))
    if not lengths:
        return None
    return _draw(
        Path(path),
        lengths,
        means,
        stds,
        ylabel="Time to first token (s)",
        title="Prefill: time to first token vs prompt length (mean ± std)",
        log_y=True,
    )


def plot_decode(records: Iterable[Record], path: Path) -> Path | None:
    """Decode throughput against length (log x), mean ± std; None without passed points."""
    lengths, means, stds = _series(records, "decode_throughput")
    if not lengths:
        return None
    return _draw(
        Path(path),
        lengths,
        means,
        stds,
        ylabel="Decode throughput (tok/s)",
        title="Decode throughput vs prompt length (mean ± std)",
        log_y=False,
    )


def write_plots(
    run_dir: Path, records: Iterable[Record], extra_plots: Iterable[ExtraPlot] = ()
) -> list[Path]:
    """``ttft.png``, ``decode.png`` and any contributed plots; only those actually drawn."""
    run_dir = Path(run_dir)
    records = list(records)
    written = [
        plot_ttft(records, run_dir / TTFT_FILENAME),
        plot_decode(records, run_dir / DECODE_FILENAME),
    ]
    written += [extra(records, run_dir) for extra in extra_plots]
    return [Path(path) for path in written if path is not None]
