"""Baseline files: passed records of one or more sessions, and the gate's settings."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import (
    BASELINE_HEADER_KEY,
    Record,
    read_records,
    record_line,
    results_path,
)

from .tolerances import ToleranceError, Tolerances, parse_tolerances
from .verdicts import session_count


class BaselineError(ValueError):
    """A baseline that cannot serve as one; raised before any server starts."""


BASELINE_FORM = "a run folder, its results.jsonl, or a baseline .jsonl written from a passing run"


#: The key that marks a baseline file's header line.
HEADER_KEY = BASELINE_HEADER_KEY
HEADER_VERSION = 1


@dataclass(frozen=True)
class BaselineInfo:
    """A baseline file's header: what a calibration stored next to the records."""

    #: Tolerance spec proposed by a calibration; used unless --longctx-tolerance is given.
    tolerance: str | None = None
    #: Cap on sessions kept when runs are appended.
    max_sessions: int | None = None
    #: The calibration's level, session count and per length/metric table.
    calibration: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {HEADER_KEY: HEADER_VERSION}
        if self.tolerance is not None:
            data["tolerance"] = self.tolerance
        if self.max_sessions is not None:
            data["max_sessions"] = self.max_sessions
        if self.calibration is not None:
            data["calibration"] = dict(self.calibration)
        return data

    @property
    def empty(self) -> bool:
        return self.tolerance is None and self.max_sessions is None and self.calibration is None


@dataclass(frozen=True)
class Baseline:
    """A baseline's passed records (of one or more sessions) and its header."""

    records: list[Record]
    info: BaselineInfo = field(default_factory=BaselineInfo)
    path: Path | None = None

    @property
    def sessions(self) -> int:
        return session_count(self.records)

    def tolerances(self) -> Tolerances | None:
        """The stored tolerances, or None when the file stores none."""
        return parse_tolerances(self.info.tolerance) if self.info.tolerance else None


def load_baseline(path: Path | str, problems: list[str] | None = None) -> list[Record]:
    """The passed records of a baseline; corrupt lines among good ones go to ``problems``.

    Only passed records are returned: a failed point has no figure worth comparing against.
    """
    return load_baseline_file(path, problems).records


def load_baseline_file(path: Path | str, problems: list[str] | None = None) -> Baseline:
    """A baseline's passed records and its header (see :class:`BaselineInfo`)."""
    given = Path(path)
    file = results_path(given)
    if given.is_dir() and not file.exists():
        raise BaselineError(
            f"baseline {given}: folder holds no results.jsonl; expected {BASELINE_FORM}"
        )
    if not file.exists():
        raise BaselineError(f"baseline {file}: no such file; expected {BASELINE_FORM}")
    if not file.is_file():
        raise BaselineError(f"baseline {file}: not a regular file; expected {BASELINE_FORM}")
    try:
        records, info, found = _read_baseline_lines(file)
    except OSError as exc:
        raise BaselineError(f"baseline {file}: cannot be read ({exc.strerror or exc})") from None
    if not records and not found:
        raise BaselineError(f"baseline {file}: the file is empty, it holds no records")
    if not records:
        raise BaselineError(
            f"baseline {file}: every line is corrupt ({len(found)} lines), first: {found[0]}"
        )
    passed = [record for record in records if record.outcome == "passed"]
    if not passed:
        outcomes = Counter(record.outcome for record in records)
        tally = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
        raise BaselineError(
            f"baseline {file}: none of its {len(records)} records passed ({tally}); "
            "a baseline needs passed measurements"
        )
    if problems is not None:
        problems.extend(found)
    return Baseline(passed, info, file)


def _read_baseline_lines(file: Path) -> tuple[list[Record], BaselineInfo, list[str]]:
    """The records schema's own reader; the header line is checked here."""
    result = read_records(file)
    info = BaselineInfo()
    if result.header is not None:  # a bad header is fatal, not skipped
        info = _header_from_json(file, result.header_line, result.header)
    return list(result.records), info, list(result.problems)


def _header_from_json(file: Path, lineno: int, data: Mapping[str, Any]) -> BaselineInfo:
    """The header, checked: a bad stored tolerance is the file's fault and names the line."""
    where = f"baseline {file}:{lineno}: header"
    if data.get(HEADER_KEY) != HEADER_VERSION:
        raise BaselineError(
            f"{where} has version {data.get(HEADER_KEY)!r}; this reader knows {HEADER_VERSION}"
        )
    tolerance = data.get("tolerance")
    if tolerance is not None:
        try:
            parse_tolerances(str(tolerance))
        except ToleranceError as exc:
            raise BaselineError(f"{where} stores a bad tolerance: {exc}") from None
    cap = data.get("max_sessions")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise BaselineError(f"{where} has max_sessions {cap!r}; expected a whole number >= 1")
    calibration = data.get("calibration")
    return BaselineInfo(
        tolerance=None if tolerance is None else str(tolerance),
        max_sessions=cap,
        calibration=dict(calibration) if isinstance(calibration, Mapping) else None,
    )


def write_baseline(
    records: Iterable[Record], path: Path | str, info: BaselineInfo | None = None
) -> int:
    """Store the passed records, every field, as a baseline file; returns how many.

    A header line comes first when ``info`` holds anything. The file appears whole or not at
    all (written aside, then renamed), so an interrupted refresh never leaves the team a
    truncated baseline to commit.
    """
    target = Path(path)
    if target.is_dir():
        raise BaselineError(
            f"baseline {target}: is a folder; give a file path such as baseline.jsonl"
        )
    passed = [record for record in records if record.outcome == "passed"]
    if not passed:
        raise BaselineError(f"baseline {target}: not written, the run has no passed records")
    header = []
    if info is not None and not info.empty:
        header = [json.dumps(info.to_json(), sort_keys=True) + "\n"]
    write_atomically(target, "".join(header + [record_line(record) for record in passed]))
    return len(passed)


def sessions_of(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records by session (run id), in the order sessions first appear."""
    grouped: dict[str, list[Record]] = {}
    for record in records:
        grouped.setdefault(record.run_id, []).append(record)
    return grouped


def keep_newest_sessions(records: Iterable[Record], cap: int) -> list[Record]:
    """The records of the ``cap`` most recent sessions (by their last finish time)."""
    grouped = sessions_of(records)

    def finished(item: tuple[int, tuple[str, list[Record]]]) -> tuple[float, int]:
        position, (_, group) = item
        times = [r.finished_at or r.started_at or 0.0 for r in group]
        return (max(times), position)

    ordered = sorted(enumerate(grouped.items()), key=finished)
    kept = {run_id for _, (run_id, _) in ordered[-cap:]} if cap > 0 else set()
    return [record for run_id, group in grouped.items() if run_id in kept for record in group]
