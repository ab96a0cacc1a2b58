"""The interference question: what one long prefill costs the streams beside it.

Per length, over the passed interference points (mean over repeats): the long prompt's TTFT
under the load against its cold TTFT alone (the cold points of the same records), the
server's effective chunk, the background tokens that came during the prefill (zero: it
stalled every stream), the background token rate idle against during the prefill, and the
background inter-token gaps (median, p99, max) idle, during the prefill and during the
decode. Two plots: background p99 gap against L, and TTFT under load against alone.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import INTERFERENCE_ITL_PLOT as ITL_PLOT
from pytest_longctx.core.file_names import INTERFERENCE_TTFT_PLOT as TTFT_PLOT
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import FigureSummary, format_mean_std, latest_records, summarize
from pytest_longctx.rendering.text_table import aligned_table, html_table, markdown_table_lines

WINDOWS = ("idle", "prefill", "decode")
STATISTICS = ("median", "p99", "max")
_MISSING = "–"

COLUMNS = (
    "Prompt",
    "n",
    "Streams",
    "Chunk",
    "TTFT alone (s)",
    "TTFT under load (s)",
    "Under load / alone",
    "Background tokens during prefill",
    "Background tok/s idle → prefill",
    "Background TTFT idle → prefill, max (s)",
)
GAP_COLUMNS = (
    "Prompt",
    "Idle: median / p99 / max (ms)",
    "Prefill: median / p99 / max (ms)",
    "Decode: median / p99 / max (ms)",
)

INTRO = (
    "Each length is measured again on a server with room for its background streams: K "
    "short requests (each its own nonce, re-issued as they end) stream beside it from a "
    "process of their own, a few seconds alone first (idle), then while the long prompt is "
    "prefilled (its send to its first token) and decoded. A gap is one stream's wait between "
    "two tokens, counted in the window its middle falls in; the tokens during the prefill "
    "are each stream's from the first step the prefill slowed to the step that finished it, so "
    "zero means the prefill stalled every stream. A background request's TTFT is its own wait "
    "for its first token, in the window its middle falls in. "
    "TTFT alone is the cold points' of the same length. Each point passes only when nothing "
    "was preempted and no background request failed; where the server's own figures (its "
    "inter-token histogram, its timing of each request) refute the streams' gaps, its "
    "background figures are set aside, out of these tables and the gate, unless "
    "--longctx-allow-unconfirmed keeps them. On a small host the figures show the mechanism, "
    "not a gate's numbers."
)


@dataclass(frozen=True)
class InterferenceRow:
    """One length's interference figures (means over its passed interference points)."""

    length: int
    n: int
    streams: tuple[int, ...]
    chunks: tuple[str, ...]
    alone: FigureSummary | None
    under_load: FigureSummary | None
    figures: Mapping[str, float]

    @property
    def ratio(self) -> float | None:
        if self.alone is None or self.under_load is None or self.alone.mean <= 0:
            return None
        return self.under_load.mean / self.alone.mean

    def gap(self, window: str, statistic: str) -> float | None:
        return self.figures.get(f"bg_itl_{window}_{statistic}")


def chunk_words(interference: Mapping[str, Any]) -> str:
    """The server's effective chunk as a record says it: its config's, else the estimate
    the background streams' tokens per prefill step give (marked ``~``)."""
    chunk = interference.get("chunk") or {}
    if chunk.get("max_num_batched_tokens") is not None:
        return f"{int(chunk['max_num_batched_tokens']):,}"
    seen = chunk.get("seen") or {}
    if seen.get("estimated_chunk_tokens"):
        return f"~{int(seen['estimated_chunk_tokens']):,}"
    return _MISSING


def interference_rows(records: Iterable[Record]) -> list[InterferenceRow]:
    """One row per length with passed interference points; empty without any."""
    records = list(records)
    passed = [
        r
        for r in latest_records(records)
        if r.cache_state == "interference" and r.outcome == "passed"
    ]
    if not passed:
        return []
    alone = {s.length: s.figure("ttft") for s in summarize(records, figures=("ttft",))}
    loaded = {
        s.length: s.figure("ttft")
        for s in summarize(records, figures=("ttft",), cache_state="interference")
    }
    rows = []
    for length in sorted({r.length for r in passed}):
        here = [r for r in passed if r.length == length]
        names = sorted({name for r in here for name in r.figures if name.startswith("bg_")})
        figures = {}
        for name in names:
            values = [r.figures[name] for r in here if name in r.figures]
            figures[name] = math.fsum(values) / len(values)
        rows.append(
            InterferenceRow(
                length=length,
                n=len(here),
                streams=tuple(sorted({r.background_streams for r in here})),
                chunks=tuple(dict.fromkeys(chunk_words(r.interference) for r in here)),
                alone=alone.get(length),
                under_load=loaded.get(length),
                figures=figures,
            )
        )
    return rows


def _seconds(summary: FigureSummary | None) -> str:
    if summary is None:
        return _MISSING
    decimals = 3 if summary.mean < 10 else 2
    return format_mean_std(summary.mean, summary.std if summary.n > 1 else None, decimals)


def _ms(value: float | None) -> str:
    return _MISSING if value is None else f"{value * 1000:,.1f}"


def row_cells(row: InterferenceRow) -> list[str]:
    ratio = row.ratio
    during = row.figures.get("bg_tokens_during_prefill")
    idle, prefill = row.figures.get("bg_rate_idle"), row.figures.get("bg_rate_prefill")
    rates = (
        f"{idle:,.0f} → {prefill:,.0f}" if idle is not None and prefill is not None else _MISSING
    )
    waited = [row.figures.get(f"bg_ttft_{w}_max") for w in ("idle", "prefill")]
    waits = " → ".join(_MISSING if v is None else f"{v:,.2f}" for v in waited)
    return [
        format_size(row.length),
        str(row.n),
        ", ".join(str(k) for k in row.streams),
        ", ".join(row.chunks),
        _seconds(row.alone),
        _seconds(row.under_load),
        _MISSING if ratio is None else f"{ratio:.2f}x",
        _MISSING if during is None else f"{during:,.0f}" + (" (stalled)" if during == 0 else ""),
        rates,
        waits,
    ]


def gap_cells(row: InterferenceRow) -> list[str]:
    return [format_size(row.length)] + [
        " / ".join(_ms(row.gap(window, statistic)) for statistic in STATISTICS)
        for window in WINDOWS
    ]


def kept_words(records: Iterable[Record]) -> str | None:
    """The passed points whose background streams' gaps the server's own figures refuted:
    their background figures set aside (the default) or kept (``--longctx-allow-unconfirmed``),
    with why; None when there is none."""
    refuted = [
        r
        for r in latest_records(records)
        if r.cache_state == "interference"
        and r.outcome == "passed"
        and (r.interference.get("background_gaps") or {}).get("verdict") == "refuted"
    ]
    if not refuted:
        return None
    set_aside = [r for r in refuted if r.interference.get("unconfirmed_figures")]
    kept = [r for r in refuted if not r.interference.get("unconfirmed_figures")]

    def points(chosen: list[Record]) -> str:
        return "; ".join(
            f"{format_size(r.length)} repeat {r.repeat} "
            f"({r.interference['background_gaps']['why']})"
            for r in chosen
        )

    parts = []
    if set_aside:
        parts.append(
            "Background figures set aside, out of these tables and the gate, where the "
            "server's own figures refuted the streams' gaps (tokens held back or flushed whole; "
            "--longctx-allow-unconfirmed keeps and gates them, --longctx-strict-stream fails "
            f"such points): {points(set_aside)}"
        )
    if kept:
        parts.append(
            "Background figures kept and gated although the server's own figures refuted the "
            f"streams' gaps (--longctx-allow-unconfirmed): {points(kept)}"
        )
    decode_lost = [r for r in refuted if r.stream.get("decode_source") == "none"]
    if decode_lost:
        parts.append(
            "The long prompt's decode figures left out where the server's decode time counts "
            f"the background requests too: {len(decode_lost)} of these points"
        )
    return ". ".join(parts)


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Interference`` section; empty without interference points."""
    rows = interference_rows(records)
    if not rows:
        return []
    lines = ["## Interference: what one long prefill costs the streams beside it", "", INTRO, ""]
    lines += markdown_table_lines(COLUMNS, [row_cells(row) for row in rows])
    lines += ["", "Background inter-token gaps in each window (means over the repeats):", ""]
    lines += markdown_table_lines(GAP_COLUMNS, [gap_cells(row) for row in rows])
    kept = kept_words(records)
    lines += ["", kept] if kept else []
    lines.append("")
    return lines


def terminal_table(records: Sequence[Record]) -> str | None:
    """The interference tables for the end-of-session summary; None without them."""
    rows = interference_rows(records)
    if not rows:
        return None
    return "\n\n".join(
        (
            aligned_table(COLUMNS, [row_cells(row) for row in rows]),
            aligned_table(GAP_COLUMNS, [gap_cells(row) for row in rows]),
        )
    )


def html_fragment(records: Sequence[Record]) -> str:
    rows = interference_rows(records)
    if not rows:
        return ""
    css = "longctx-summary-table longctx-interference-table"
    return (
        "<h3>Interference: what one long prefill costs the streams beside it</h3>"
        f"<p>{html.escape(INTRO)}</p>"
        + html_table(COLUMNS, [row_cells(row) for row in rows], css)
        + html_table(GAP_COLUMNS, [gap_cells(row) for row in rows], css)
        + (f"<p>{html.escape(kept)}</p>" if (kept := kept_words(records)) else "")
    )


def _figure():  # noqa: ANN202 - matplotlib's
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(path, buffer.getvalue())


def draw_itl_plot(records: Sequence[Record], run_dir: Path) -> Path | None:
    """``interference_itl.png``: the background streams' p99 gap against L, idle, during the
    prefill and during the decode (log-log)."""
    rows = interference_rows(records)
    if not rows:
        return None
    from pytest_longctx.rendering.axes import length_axis

    figure = _figure()
    axes = figure.add_subplot()
    for window, marker in zip(WINDOWS, ("o", "s", "^"), strict=True):
        points = [(r.length, gap) for r in rows if (gap := r.gap(window, "p99"))]
        if points:
            axes.plot(
                [n for n, _ in points],
                [value * 1000 for _, value in points],
                marker=marker,
                label=f"{window}",
            )
    length_axis(axes, [r.length for r in rows], log_y=True, pad=False)
    axes.set_xlabel("Long prompt length L (tokens)")
    axes.set_ylabel("Background p99 inter-token gap (ms)")
    axes.set_title("Interference: what the background streams waited, p99 per window")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    return _save(figure, Path(run_dir) / ITL_PLOT)


def draw_ttft_plot(records: Sequence[Record], run_dir: Path) -> Path | None:
    """``interference_ttft.png``: the long prompt's TTFT under load against alone (log-log,
    mean ± std)."""
    rows = [r for r in interference_rows(records) if r.under_load is not None]
    if not rows:
        return None
    from pytest_longctx.rendering.axes import length_axis

    figure = _figure()
    axes = figure.add_subplot()
    for label, pick, marker in (
        ("alone (cold points)", lambda r: r.alone, "o"),
        ("under load", lambda r: r.under_load, "s"),
    ):
        series = [(r.length, pick(r)) for r in rows if pick(r) is not None]
        if series:
            axes.errorbar(
                [n for n, _ in series],
                [s.mean for _, s in series],
                yerr=[s.std for _, s in series],
                marker=marker,
                markersize=4,
                capsize=3,
                label=label,
            )
    length_axis(axes, [r.length for r in rows], log_y=True, pad=False)
    axes.set_xlabel("Prompt length L (tokens)")
    axes.set_ylabel("Time to first token (s)")
    streams = ", ".join(sorted({str(k) for r in rows for k in r.streams}))
    axes.set_title(f"Interference: TTFT beside {streams} background streams against alone")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    return _save(figure, Path(run_dir) / TTFT_PLOT)
