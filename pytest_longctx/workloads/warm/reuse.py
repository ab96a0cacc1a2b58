"""The reuse question: what a question costs when its context is already cached.

Per length: the cold TTFT (a prefill of L), the warm TTFT (a follow-up of L cached + S new
tokens; mean ± std over the follow-ups and repeats), their ratio, the rate the suffix was
prefilled at (S / warm TTFT), the KV memory the resident prefix holds, and the TTFT n
questions cost (1..Q) with the context resident (one cold prefill, then n warm ones) against
re-prefilling L + S for every question. A prefill of L + S takes at least the cold prefill
of L, so the re-prefilling figure is a lower bound: the payback it shows is the least one.
Follow-ups whose prefix came from different tiers of the cache (the device's, or a KV
connector's host memory or disk) are rows of their own: a load from host memory is no device
hit, and one mean over both would be neither.
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.core.file_names import REUSE_PLOT
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_bytes, format_size
from pytest_longctx.core.stats import FigureSummary, latest_records, summarize, summarize_values
from pytest_longctx.rendering.text_table import (
    aligned_table,
    format_summary,
    html_table,
    markdown_table_lines,
)

_MISSING = "–"

COLUMNS = (
    "Prompt",
    "Suffix",
    "n warm",
    "Cold TTFT (s)",
    "Warm TTFT (s) mean ± std",
    "Warm / cold",
    "Suffix prefill tok/s",
    "Served from cache",
    "Tier",
    "Resident KV",
)
PAYBACK_COLUMNS = (
    "Prompt",
    "Questions",
    "Resident: TTFT per question (s)",
    "Re-prefill (s), at least",
)


@dataclass(frozen=True)
class ReuseRow:
    """One length's cold and warm figures (warm ones over every passed follow-up)."""

    length: int
    suffix_tokens: int
    cold_ttft: FigureSummary | None
    warm_ttft: FigureSummary
    questions: int
    served_min: int | None
    resident_kv_bytes: float | None
    #: The cache tier that served these follow-ups' prefix (``cache.tier``); None: not said.
    tier: str | None = None

    @property
    def ratio(self) -> float | None:
        """Warm TTFT over cold TTFT: the share of a cold prefill a question costs."""
        cold = self.cold_ttft
        return self.warm_ttft.mean / cold.mean if cold and cold.mean > 0 else None

    @property
    def suffix_rate(self) -> float | None:
        return self.suffix_tokens / self.warm_ttft.mean if self.warm_ttft.mean > 0 else None

    def payback(self) -> list[tuple[int, float, float]]:
        """(n, resident TTFT per question, re-prefill per question) for n = 1..Q.

        Resident: the cold prefill once, then n warm questions, spread over the n. Re-prefill:
        every question prefills L + S, at least the cold TTFT of L each."""
        if self.cold_ttft is None:
            return []
        return [
            (n, (self.cold_ttft.mean + n * self.warm_ttft.mean) / n, self.cold_ttft.mean)
            for n in range(1, self.questions + 1)
        ]


def reuse_rows(records: Iterable[Record]) -> list[ReuseRow]:
    """One row per length with passed warm points; empty for a cold-only run."""
    records = list(records)
    warm_passed = [r for r in latest_records(records) if r.warm and r.outcome == "passed"]
    if not warm_passed:
        return []
    cold = {s.length: s.figure("ttft") for s in summarize(records, figures=("ttft",))}
    rows = []
    for summary in summarize(records, figures=("ttft",), cache_state="warm"):
        ttft = summary.figure("ttft")
        here = [r for r in warm_passed if r.length == summary.length]
        if ttft is None or not here:
            continue
        by_tier: dict[str | None, list[Record]] = {}
        for record in here:
            by_tier.setdefault(record.cache.get("tier"), []).append(record)
        for tier, group in by_tier.items():
            if len(by_tier) > 1:
                ttfts = [r.figures["ttft"] for r in group if "ttft" in r.figures]
                if not ttfts:
                    continue
                ttft = summarize_values("ttft", ttfts)
            rows.append(_row(summary.length, group, cold.get(summary.length), ttft, tier))
    return rows


def _row(
    length: int,
    here: Sequence[Record],
    cold: FigureSummary | None,
    warm: FigureSummary,
    tier: str | None,
) -> ReuseRow:
    served = [int(r.cache["served"]) for r in here if r.cache.get("served") is not None]
    resident = [
        float(r.cache["resident_kv_bytes"]) for r in here if r.cache.get("resident_kv_bytes")
    ]
    return ReuseRow(
        length=length,
        suffix_tokens=max(r.suffix_tokens for r in here),
        cold_ttft=cold,
        warm_ttft=warm,
        questions=max(r.question for r in here),
        served_min=min(served) if served else None,
        resident_kv_bytes=max(resident) if resident else None,
        tier=tier,
    )


def _decimals(seconds: float) -> int:
    """Milliseconds below ten seconds, hundredths above."""
    return 3 if seconds < 10 else 2


def _seconds(value: float | None) -> str:
    if value is None:
        return _MISSING
    return f"{value:,.{_decimals(value)}f}"


def _mean_std(summary: FigureSummary | None) -> str:
    return format_summary(summary, _decimals(summary.mean) if summary else 3)


def row_cells(row: ReuseRow) -> list[str]:
    ratio = row.ratio
    return [
        format_size(row.length),
        f"{row.suffix_tokens:,}",
        str(row.warm_ttft.n),
        _mean_std(row.cold_ttft),
        _mean_std(row.warm_ttft),
        _MISSING if ratio is None else f"{ratio:.3f} ({1 / ratio:,.1f}x faster)",
        _MISSING if row.suffix_rate is None else f"{row.suffix_rate:,.0f}",
        _MISSING if row.served_min is None else f"{row.served_min:,} of {row.length:,}",
        row.tier or _MISSING,
        _MISSING if row.resident_kv_bytes is None else format_bytes(row.resident_kv_bytes),
    ]


def payback_cells(row: ReuseRow) -> list[list[str]]:
    return [
        [format_size(row.length), str(n), _seconds(resident), _seconds(again)]
        for n, resident, again in row.payback()
    ]


INTRO = (
    "Each cold point of length L is followed by questions that repeat its L tokens exactly "
    "and append S new ones; each is measured like a point and passes only when the server's "
    "prefix cache served the whole prefix (usage and /metrics, to the cache's alignment), "
    "from the tier the Tier column names (device: the device's own cache; host, disk, p2p: "
    "a KV connector's). "
    "Warm TTFT is mean ± std over the follow-ups and repeats; the suffix prefill rate is S "
    "over it. Per question, n questions cost (cold TTFT + n x warm TTFT) / n with the context "
    "resident, and at least the cold TTFT each when every question re-prefills L + S."
)


def markdown_lines(records: Sequence[Record]) -> list[str]:
    """The ``## Reuse`` section; empty without warm points."""
    rows = reuse_rows(records)
    if not rows:
        return []
    lines = ["## Reuse: questions on a cached prefix", "", INTRO, ""]
    lines += markdown_table_lines(COLUMNS, [row_cells(row) for row in rows])
    lines += ["", "TTFT per question over 1..Q questions:", ""]
    lines += markdown_table_lines(PAYBACK_COLUMNS, [c for row in rows for c in payback_cells(row)])
    lines.append("")
    return lines


def terminal_table(records: Sequence[Record]) -> str | None:
    """The reuse table for the end-of-session summary; None without warm points."""
    rows = reuse_rows(records)
    if not rows:
        return None
    return aligned_table(COLUMNS, [row_cells(row) for row in rows])


def html_fragment(records: Sequence[Record]) -> str:
    rows = reuse_rows(records)
    if not rows:
        return ""

    def table(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
        return html_table(columns, cells, "longctx-summary-table longctx-reuse-table")

    return (
        "<h3>Reuse: questions on a cached prefix</h3>"
        f"<p>{html.escape(INTRO)}</p>"
        + table(COLUMNS, [row_cells(row) for row in rows])
        + table(PAYBACK_COLUMNS, [c for row in rows for c in payback_cells(row)])
    )


def draw_reuse_plot(records: Sequence[Record], run_dir: Path) -> Path | None:
    """``reuse.png``: cold against warm TTFT over the ladder (log-log, mean ± std)."""
    rows = [row for row in reuse_rows(records) if row.warm_ttft.mean > 0]
    if not rows:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pytest_longctx.rendering.axes import length_axis

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    cold = list(
        {row.length: row for row in rows if row.cold_ttft and row.cold_ttft.mean > 0}.values()
    )
    if cold:
        axes.errorbar(
            [r.length for r in cold],
            [r.cold_ttft.mean for r in cold if r.cold_ttft],
            yerr=[(r.cold_ttft.std or 0.0) for r in cold if r.cold_ttft],
            marker="o",
            markersize=4,
            capsize=3,
            label="cold: prefill of L",
        )
    suffix = max(row.suffix_tokens for row in rows)
    tiers = list(dict.fromkeys(row.tier for row in rows))
    for tier in tiers:
        series = [r for r in rows if r.tier == tier]
        from_tier = f", from {tier}" if len(tiers) > 1 or tier not in (None, "device") else ""
        axes.errorbar(
            [r.length for r in series],
            [r.warm_ttft.mean for r in series],
            yerr=[r.warm_ttft.std or 0.0 for r in series],
            marker="s",
            markersize=4,
            capsize=3,
            label=f"warm: L cached + {suffix} new tokens{from_tier}",
        )
    length_axis(axes, [r.length for r in rows], log_y=True, pad=False)
    axes.set_xlabel("Prefix length L (tokens)")
    axes.set_ylabel("Time to first token (s)")
    axes.set_title("Reuse: cold against warm TTFT (mean ± std)")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(Path(run_dir) / REUSE_PLOT, buffer.getvalue())
