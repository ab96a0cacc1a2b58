"""Each workload's own part of every report, in one list the renderers iterate: its
Markdown section, its HTML fragment, its terminal table and its plots (the cold points' are
the summary's, which every report opens with).

A workload with a report of its own adds one :class:`WorkloadSection` to :data:`SECTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.core.records import Record
from pytest_longctx.reporting import concurrency_report, interference_report, reuse

Plot = Callable[[Sequence[Record], Path], "Path | None"]


@dataclass(frozen=True)
class WorkloadSection:
    """One workload's report: each renderer reads the records and says nothing where the
    workload has none."""

    #: The workload (``--longctx-workload`` word, the records' ``cache_state``).
    workload: str
    #: The terminal summary's title above its table.
    title: str
    markdown_lines: Callable[[Sequence[Record]], list[str]]
    html_fragment: Callable[[Sequence[Record]], str]
    terminal_table: Callable[[Sequence[Record]], str | None]
    plots: tuple[Plot, ...]


SECTIONS: tuple[WorkloadSection, ...] = (
    WorkloadSection(
        "warm",
        "reuse: questions on a cached prefix (warm follow-ups)",
        reuse.markdown_lines,
        reuse.html_fragment,
        reuse.terminal_table,
        (reuse.draw_reuse_plot,),
    ),
    WorkloadSection(
        "interference",
        "interference: the prefill beside background streams, and what it cost them",
        interference_report.markdown_lines,
        interference_report.html_fragment,
        interference_report.terminal_table,
        (interference_report.draw_itl_plot, interference_report.draw_ttft_plot),
    ),
    WorkloadSection(
        "concurrency",
        "concurrency: how many long requests fit at once",
        concurrency_report.markdown_lines,
        concurrency_report.html_fragment,
        concurrency_report.terminal_table,
        (concurrency_report.draw_plot,),
    ),
)
