"""``reports/index.html``: every run in an output root, newest first, with links to its reports.

Read from each run folder's ``results.jsonl`` alone (date, profile, model, points passed of
recorded, outcome); a self-contained page with no script and no network.
"""

from __future__ import annotations

import html
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pytest_longctx.core.file_names import HTML, INDEX, LATEST, MARKDOWN, RESULTS_FILE
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import OUTCOMES, read_records
from pytest_longctx.core.stats import latest_records
from pytest_longctx.reporting.view import format_fingerprint_value

#: (label, file) of the links each run gets, when the file is there.
LINKS: tuple[tuple[str, str], ...] = (
    (HTML, HTML),
    (MARKDOWN, MARKDOWN),
    (RESULTS_FILE, RESULTS_FILE),
)


@dataclass(frozen=True)
class RunEntry:
    folder: str  # the run folder's name under the root (its run id)
    started_at: float | None  # unix seconds of its first point
    profile: str
    model: str
    passed: int
    total: int
    #: Every recorded point's outcome counted (the latest record of a re-measured point).
    outcomes: Counter
    links: tuple[tuple[str, str], ...]  # (label, href relative to the index)
    latest: bool = False
    #: Lines of results.jsonl that could not be read.
    problems: int = 0

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` (some point did not pass) or ``no points``."""
        if not self.total:
            return "no points"
        return "passed" if self.passed == self.total else "failed"

    def outcome_words(self) -> str:
        counts = [f"{self.outcomes[o]} {o}" for o in OUTCOMES if self.outcomes.get(o)]
        if self.outcome == "passed":
            return "passed"
        return f"{self.outcome}: " + ", ".join(counts) if counts else self.outcome

    def date(self) -> str:
        if self.started_at is None:
            return "–"
        moment = datetime.fromtimestamp(self.started_at, timezone.utc)
        return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _run_time(folder: Path, started: list[float]) -> float | None:
    if started:
        return min(started)
    try:  # a run id is its start: 20260101T000000Z-c0ffee
        stamp = datetime.strptime(folder.name.split("-")[0], "%Y%m%dT%H%M%SZ")
        return stamp.replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def read_run(folder: Path, *, latest: bool = False) -> RunEntry:
    result = read_records(folder / RESULTS_FILE)
    records = latest_records(result.records)
    fingerprint = next((r.fingerprint for r in reversed(records) if r.fingerprint), {})
    model = format_fingerprint_value(fingerprint.get("model")) if fingerprint else "–"
    revision = fingerprint.get("revision")
    if revision and model != "–":
        model = f"{model} @ {revision}"
    outcomes = Counter(record.outcome for record in records)
    started = [r.started_at for r in records if r.started_at is not None]
    links = tuple(
        (label, f"{folder.name}/{name}") for label, name in LINKS if (folder / name).is_file()
    )
    return RunEntry(
        folder=folder.name,
        started_at=_run_time(folder, started),
        profile=str(fingerprint.get("profile") or "–"),
        model=model,
        passed=outcomes.get("passed", 0),
        total=len(records),
        outcomes=outcomes,
        links=links,
        latest=latest,
        problems=len(result.problems),
    )


def scan_runs(root: Path) -> list[RunEntry]:
    """Every run folder under ``root`` (one holding results.jsonl), newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    latest_link = root / LATEST
    latest = os.path.basename(os.readlink(latest_link)) if latest_link.is_symlink() else None
    entries = [
        read_run(folder, latest=folder.name == latest)
        for folder in root.iterdir()
        if folder.name != LATEST
        and not folder.name.startswith(".")
        and not folder.is_symlink()
        and (folder / RESULTS_FILE).is_file()
    ]
    return sorted(entries, key=lambda e: (e.started_at or 0.0, e.folder), reverse=True)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
td.points { text-align: right; }
td.nowrap { white-space: nowrap; }
tr.passed td.outcome { color: #070; }
tr.failed td.outcome { color: #a00; font-weight: bold; }
.latest { background: #eef5ff; }
a { margin-right: 0.6em; }
"""

COLUMNS = ("Run", "Date", "Profile", "Model", "Points (passed/total)", "Outcome", "Reports")


def _row(entry: RunEntry) -> str:
    name = html.escape(entry.folder) + (" <b>(latest)</b>" if entry.latest else "")
    links = " ".join(
        f'<a href="{html.escape(href)}">{html.escape(label)}</a>' for label, href in entry.links
    )
    outcome = html.escape(entry.outcome_words())
    if entry.problems:
        outcome += html.escape(f" ({entry.problems} unreadable line(s))")
    classes = entry.outcome.replace(" ", "-") + (" latest" if entry.latest else "")
    cells = [
        f'<td class="nowrap">{name}</td>',
        f'<td class="nowrap">{html.escape(entry.date())}</td>',
        f"<td>{html.escape(entry.profile)}</td>",
        f"<td>{html.escape(entry.model)}</td>",
        f'<td class="points">{entry.passed}/{entry.total}</td>',
        f'<td class="outcome">{outcome}</td>',
        f"<td>{links}</td>",
    ]
    return f'<tr class="{classes}" data-run="{html.escape(entry.folder)}">{"".join(cells)}</tr>'


def render_index(entries: Sequence[RunEntry], title: str = "Long-context runs") -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in COLUMNS)
    if entries:
        body = (
            f'<table class="longctx-runs"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(map(_row, entries))}</tbody></table>"
        )
    else:
        body = "<p>No run folder with results here yet.</p>"
    escaped = html.escape(title)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escaped}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{escaped}</h1>"
        f"<p>{len(entries)} run(s), newest first.</p>{body}</body></html>\n"
    )


def write_index(root: Path) -> Path:
    """Write ``index.html`` in the output root ``root``, listing every run folder in it."""
    root = Path(root)
    return write_atomically(root / INDEX, render_index(scan_runs(root)))
