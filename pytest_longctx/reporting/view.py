"""What every report shows, computed once: the view model behind ``report.md``, the HTML
pages, the terminal table, the index and the benchmark file.

Rows per length (mean ± std over repeats, Table 1), the fingerprint as text, what varied
between merged runs, the servers of a campaign, the points that did not pass, and how to
reproduce the numbers. Each renderer (``markdown.py``, ``html.py``) only lays these out.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import (
    FigureSummary,
    LengthSummary,
    label_counts,
    latest_records,
    summarize,
)
from pytest_longctx.gate.fingerprint import hardware_identity
from pytest_longctx.rendering.text_table import format_summary
from pytest_longctx.reporting.streaming import stream_items
from pytest_longctx.workloads import BY_NAME

DEFAULT_TITLE = "Long-context sweep"

TABLE_COLUMNS: tuple[str, ...] = (
    "Prompt",
    "Tokens",
    "n",
    "TTFT (s) mean ± std",
    "TTFT CV",
    "Decode tok/s mean ± std",
    "Decode CV",
    "answers",
    "outcomes",
)

#: Fingerprint keys shown in the header, in this order, with their labels.
_HEADER_KEYS: tuple[tuple[str, str], ...] = (
    ("profile", "Profile"),
    ("model", "Model"),
    ("revision", "Revision"),
    ("vllm_version", "vLLM"),
    ("torch_version", "torch"),
    ("hardware", "Hardware"),
)
#: Fingerprint keys of the "How to reproduce" section, in this order, with their labels.
REPRODUCE_LABELS: Mapping[str, str] = {
    "command_line": "Command line",
    "server_command": "Server command",
    "server_env": "Server environment (besides the inherited one; secrets redacted)",
    "server_url": "Server URL",
    "profile": "Profile",
    "model": "Model",
    "revision": "Revision",
    "vllm_version": "vLLM",
    "torch_version": "torch",
    "expected_versions": "Versions the profile was measured with",
}
#: Reproduce keys printed as shell commands rather than as list items.
COMMAND_KEYS = ("command_line", "server_command")
_MISSING = "–"
_REASON_LIMIT = 500


# --------------------------------------------------------------------------- writing


# --------------------------------------------------------------------------- numbers


def ttft_decimals(mean: float) -> int:
    """2 decimals like the study; more below 0.1 s so a 12 ms TTFT does not print as 0.01."""
    if mean >= 0.1 or mean <= 0 or not math.isfinite(mean):
        return 2
    return min(6, 1 - math.floor(math.log10(mean)))


def format_ttft(summary: FigureSummary | None) -> str:
    return format_summary(summary, ttft_decimals(summary.mean) if summary else 2)


def format_decode(summary: FigureSummary | None) -> str:
    return format_summary(summary, 1)


def format_cv(summary: FigureSummary | None) -> str:
    """CV in percent, as the study quotes it ("under 1%"); none without two samples."""
    if summary is None or summary.n < 2 or summary.cv is None:
        return _MISSING
    return f"{summary.cv * 100:.1f}%"


def format_tokens(summary: LengthSummary) -> str:
    """Target length with thousands separators, plus the server's count when it differs."""
    text = f"{summary.length:,}"
    measured = [tokens for tokens in summary.prompt_tokens if tokens != summary.length]
    if measured:
        text += " (measured " + ", ".join(f"{tokens:,}" for tokens in summary.prompt_tokens) + ")"
    return text


def format_outcomes(outcomes: Mapping[str, int]) -> str:
    """``2 passed, 1 oom``: counts of outcomes or of :func:`~core.stats.label_counts` labels."""
    parts = [f"{count} {name}" for name, count in outcomes.items() if count]
    return ", ".join(parts) or _MISSING


def format_answers(answers: Mapping[str, int]) -> str:
    """``2 correct, 1 wrong``: the fidelity verdicts of a length's points; – when none."""
    if not answers:
        return _MISSING
    return ", ".join(f"{count} {verdict.replace('_', ' ')}" for verdict, count in answers.items())


def outcome_words(record: Record) -> str:
    """``failed (oom)``: the outcome, and the failure class when it says more."""
    if record.failure_class and record.failure_class != record.outcome:
        return f"{record.outcome} ({record.failure_class})"
    return record.outcome


def starts_text(records: Iterable[Record]) -> str | None:
    """The server starts behind the records, when there was more than one in a run: each
    relaunch with its cause and start-up time."""
    starts: dict[tuple[str, int], Mapping[str, Any]] = {}
    for record in records:
        start = record.server_start
        if start and isinstance(start.get("index"), int):
            starts.setdefault((record.run_id, start["index"]), start)
    if not any(start.get("cause") for start in starts.values()):
        return None
    parts = []
    for (_, index), start in sorted(starts.items()):
        text = f"#{index}"
        if start.get("startup_s") is not None:
            text += f" up in {start['startup_s']:.1f} s"
        if start.get("cause"):
            text += f" after {one_line(str(start['cause']))}"
        parts.append(text)
    return f"{len(starts)}: " + "; ".join(parts)


def summary_row(summary: LengthSummary) -> list[str]:
    """The cells of one length's row, in :data:`TABLE_COLUMNS` order (shared by all reports)."""
    ttft = summary.figure("ttft")
    decode = summary.figure("decode_throughput")
    return [
        format_size(summary.length),
        format_tokens(summary),
        str(summary.n),
        format_ttft(ttft),
        format_cv(ttft),
        format_decode(decode),
        format_cv(decode),
        format_answers(summary.answers),
        format_outcomes(summary.labels),
    ]


def summary_rows(records: Iterable[Record]) -> list[list[str]]:
    return [summary_row(summary) for summary in summarize(records)]


# --------------------------------------------------------------------------- fingerprint


def format_fingerprint_value(value: Any) -> str:
    """Lists are command lines (shell-quoted); mappings print as ``key: value`` pairs."""
    if value is None:
        return _MISSING
    if isinstance(value, (list, tuple)):
        return shlex.join(str(part) for part in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{key}: {format_fingerprint_value(item)}" for key, item in value.items())
    return str(value)


def reference_fingerprint(records: Sequence[Record]) -> Mapping[str, Any]:
    """The newest record's fingerprint: what the latest measurement ran on."""
    for record in reversed(records):
        if record.fingerprint:
            return record.fingerprint
    return {}


def setup_variations(records: Iterable[Record]) -> dict[str, dict[str, list[str]]]:
    """Fingerprint keys whose value is not the same everywhere: ``{key: {value: [run ids]}}``.

    Merged campaigns must say when their passes ran on different software or hardware, since
    the spread then mixes run-to-run noise with a change of setup.
    """
    seen: dict[str, dict[str, list[str]]] = {}
    records = [record for record in records if record.fingerprint]
    keys = sorted({key for record in records for key in record.fingerprint} - set(PER_SERVER_KEYS))
    for key in keys:
        values: dict[str, list[str]] = {}
        for record in records:
            value = record.fingerprint.get(key)
            # The servers of one campaign differ in the cores or devices they were given.
            text = (
                hardware_identity(value) if key == "hardware" else format_fingerprint_value(value)
            )
            run_ids = values.setdefault(text, [])
            if record.run_id not in run_ids:
                run_ids.append(record.run_id)
        if len(values) > 1:
            seen[key] = values
    return seen


def run_ids_of(records: Iterable[Record]) -> list[str]:
    return list(dict.fromkeys(record.run_id for record in records))


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _time_span(records: Sequence[Record]) -> str | None:
    starts = [record.started_at for record in records if record.started_at is not None]
    ends = [record.finished_at for record in records if record.finished_at is not None]
    if not starts and not ends:
        return None
    first = min(starts or ends)
    last = max(ends or starts)
    return f"{_utc(first)} to {_utc(last)}"


def one_line(text: str | None) -> str:
    """A reason fit for a list item or table cell: one line, bounded length."""
    if not text:
        return "no reason recorded"
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= _REASON_LIMIT else flat[: _REASON_LIMIT - 1] + "…"


def reproduce_items(
    records: Sequence[Record], reproduce: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a reader needs to re-run: fingerprint keys, overridden or extended by ``reproduce``."""
    fingerprint = reference_fingerprint(records)
    items = {key: fingerprint[key] for key in REPRODUCE_LABELS if fingerprint.get(key) is not None}
    items.update(reproduce or {})
    return items


def header_items(records: Sequence[Record]) -> list[tuple[str, str]]:
    """``(label, text)`` pairs saying what was measured, shared by every report format."""
    fingerprint = reference_fingerprint(records)
    latest = latest_records(records)
    counts = label_counts(latest)
    items = [("Runs", ", ".join(run_ids_of(records)))]
    for key, label in _HEADER_KEYS:
        if fingerprint.get(key) is not None:
            items.append((label, format_fingerprint_value(fingerprint[key])))
        elif key == "profile" and isinstance(fingerprint.get("settings"), Mapping):
            # attached without a profile: where the settings came from instead
            items.append((label, f"none ({fingerprint['settings'].get('source')})"))
    if fingerprint.get("unverified_points_allowed"):
        kept = "points kept without the server's counters (--longctx-allow-unverified)"
        items.append(("Verification", kept))
    items += stream_items(latest)
    span = _time_span(records)
    if span:
        items.append(("Measured", span))
    items.append(("Points", f"{len(latest)} recorded ({format_outcomes(counts)})"))
    starts = starts_text(latest)
    if starts:
        items.append(("Server starts", starts))
    servers = server_counts(latest)
    if len(servers) > 1:
        listed = ", ".join(f"{name} ({n} points)" for name, n in servers.items())
        items.append(("Servers", f"{len(servers)}: {listed}"))
    split = lengths_on_several_servers(latest)
    if split:
        items.append(
            (
                "Repeats on different servers",
                "; ".join(f"{format_size(n)} on {', '.join(names)}" for n, names in split.items()),
            )
        )
    return items


#: Fingerprint keys that name one server of a campaign, not what was measured.
PER_SERVER_KEYS = ("server", "server_url", "server_command", "server_env")


def server_name(record: Record) -> str | None:
    """The server that measured a record: its worker and endpoint, or its URL."""
    server = record.fingerprint.get("server")
    if isinstance(server, Mapping):
        worker, endpoint = server.get("worker"), server.get("endpoint")
        return f"{worker} {endpoint}" if worker else str(endpoint)
    url = record.fingerprint.get("server_url")
    return str(url) if url else None


def server_counts(records: Iterable[Record]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        name = server_name(record)
        if name and record.outcome == "passed":
            counts[name] = counts.get(name, 0) + 1
    return counts


def lengths_on_several_servers(records: Iterable[Record]) -> dict[int, list[str]]:
    """Lengths whose passed repeats came from more than one server: their spread mixes them."""
    by_length: dict[int, list[str]] = {}
    for record in records:
        name = server_name(record)
        if name and record.outcome == "passed":
            names = by_length.setdefault(record.length, [])
            if name not in names:
                names.append(name)
    return {n: sorted(names) for n, names in sorted(by_length.items()) if len(names) > 1}


def point_words(record: Record) -> str:
    """``16Ki repeat 0``, ``16Ki repeat 0 warm 2`` for a warm follow-up, ``16Ki repeat 0
    under 4 background streams`` for an interference point, ``16Ki repeat 0 at 4 requests at
    once`` for a concurrency level."""
    return f"{format_size(record.length)} repeat {record.repeat}{workload_words(record)}"


def workload_words(record: Record) -> str:
    """What follows a point's repeat in words: its question, its background load or its
    concurrency level."""
    workload = BY_NAME.get(record.cache_state)
    return workload.record_words(record) if workload is not None else ""


def non_passed_records(records: Iterable[Record]) -> list[Record]:
    """The current non-passed points (re-measured ones excluded), by length then repeat."""
    return sorted(
        (record for record in latest_records(records) if record.outcome != "passed"),
        key=lambda record: (
            record.length,
            record.run_id,
            record.repeat,
            record.question,
            record.cache_state,
        ),
    )
