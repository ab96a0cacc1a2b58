"""Records as pytest-benchmark benchmarks: its JSON, ``compare``, history and regression check.

pytest-benchmark times a callable over many rounds and treats lower as better. A sweep length
is such a benchmark twice over: one benchmark per length and metric whose rounds are that
length's passed repeats, in seconds: ``ttft`` (request sent to first token) and ``decode``
(seconds per decoded token, the inverse of decode throughput; pytest-benchmark's "OPS" column
of it is tokens per second). The objects are pytest-benchmark's own ``Metadata``, so their
statistics and JSON are exactly what pytest-benchmark computes and writes: the run folder's
``benchmark.json``, ``python -m pytest_longctx report`` and a session's pytest-benchmark output
(``--benchmark-json``, ``--benchmark-autosave``, ``--benchmark-compare``) hold the same entries.
Each round's record (run, repeat, every figure) travels in ``extra_info``.
"""

from __future__ import annotations

import copy
import functools
import json
import platform
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import FIGURE_UNITS, Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import answer_counts, latest_records
from pytest_longctx.reporting.view import reference_fingerprint

BENCHMARK_GROUP = "longctx"
#: Warm follow-ups are groups of their own: pytest-benchmark compares within a group, and a
#: warm TTFT must never be compared with a cold one.
WARM_GROUP = "longctx-warm"
#: Interference points: the long prompt's TTFT and decode beside the background streams.
INTERFERENCE_GROUP = "longctx-interference"
#: Concurrency levels: one benchmark per length and level (``len=8Ki-conc=4-...``).
CONCURRENCY_GROUP = "longctx-concurrency"
#: The group of each workload (a record's ``cache_state``), in report order.
_GROUPS = {
    "cold": BENCHMARK_GROUP,
    "warm": WARM_GROUP,
    "interference": INTERFERENCE_GROUP,
    "concurrency": CONCURRENCY_GROUP,
}
DEFAULT_TEST_NAME = "test_prefill_decode"


@dataclass(frozen=True)
class BenchmarkMetric:
    """A figure as pytest-benchmark sees it: seconds per round, lower is better."""

    name: str
    figure: str
    unit: str
    description: str
    seconds: Callable[[float], float]


METRICS: tuple[BenchmarkMetric, ...] = (
    BenchmarkMetric("ttft", "ttft", "s", "client wall clock, request sent to first token", float),
    BenchmarkMetric(
        "decode",
        "decode_throughput",
        "s/token",
        "client wall clock per decoded token after the first (1 / decode throughput)",
        lambda tokens_per_s: 1.0 / tokens_per_s,
    ),
    # A concurrency level's: its c requests' tokens together (only they have the figure).
    BenchmarkMetric(
        "aggregate_decode",
        "aggregate_decode_throughput",
        "s/token",
        "client wall clock per token the level's requests decoded together "
        "(1 / aggregate decode throughput)",
        lambda tokens_per_s: 1.0 / tokens_per_s,
    ),
)


@dataclass(frozen=True)
class SweepBenchmark:
    """One length and metric, in the shape of pytest-benchmark's fixture: ``Metadata`` reads
    its name, fullname, group, param, params, extra_info, cprofile_stats and has_error."""

    name: str
    fullname: str
    group: str
    param: str
    params: Mapping[str, Any]
    extra_info: dict[str, Any]
    rounds: tuple[float, ...]
    timer: str
    cprofile_stats: None = field(default=None, repr=False)
    has_error: bool = False

    def metadata(self) -> Any:
        """pytest-benchmark's ``Metadata`` of these rounds (one iteration each)."""
        from pytest_benchmark.stats import Metadata

        options = {"rounds": len(self.rounds), "iterations": 1, "warmup": False}
        metadata = Metadata(self, iterations=1, options={**options, "timer": self.timer})
        for seconds in self.rounds:
            metadata.update(seconds)
        return metadata

    def entry(self) -> dict[str, Any]:
        """The benchmark as pytest-benchmark writes it to ``--benchmark-json``."""
        return _json_safe(self.metadata().as_dict(include_data=True))


def _test_path(record: Record) -> str:
    """``tests/test_sweep.py::test_prefill_decode``: the node id without its parameters."""
    path = record.nodeid.split("[", 1)[0]
    return path if path.rsplit("::", 1)[-1] else f"{path}::{DEFAULT_TEST_NAME}"


def _round(record: Record, metric: BenchmarkMetric) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "repeat": record.repeat,
        "question": record.question,
        "cache_state": record.cache_state,
        "cache": dict(record.cache),
        "nodeid": record.nodeid,
        "seconds": metric.seconds(record.figures[metric.figure]),
        "figures": dict(record.figures),
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "server_metrics": dict(record.server_metrics),
        "fidelity": dict(record.fidelity),
        "started_at": record.started_at,
        "finished_at": record.finished_at,
    }


def sweep_benchmarks(records: Iterable[Record]) -> list[SweepBenchmark]:
    """One benchmark per length, cache state and metric over the passed points, by length.

    Repeats of every run count, as in every report: a merged campaign's length has the rounds
    of all its runs. A record superseded by a later one of the same point (a resume) does not.
    The warm follow-ups of a length (every question of every repeat) are its warm rounds.
    """
    passed = [
        record
        for record in latest_records(records)
        if record.outcome == "passed" and record.cache_state in _GROUPS
    ]
    by_length: dict[tuple[int, str, int], list[Record]] = {}
    # rounds in the order they were measured; each concurrency level a benchmark of its own
    for record in sorted(passed, key=lambda r: (r.length, r.started_at or 0.0, r.run_id, r.repeat)):
        key = (record.length, record.cache_state, record.concurrency_level)
        by_length.setdefault(key, []).append(record)
    benchmarks = []
    order = list(_GROUPS)
    for (length, state, level), group in sorted(
        by_length.items(), key=lambda item: (item[0][0], order.index(item[0][1]), item[0][2])
    ):
        label = format_size(length)
        path = _test_path(group[0])
        for metric in METRICS:
            measured = [r for r in group if r.figures.get(metric.figure, 0) > 0]
            if not measured:
                continue
            tag = "" if state == "cold" else f"-conc={level}" if level else f"-{state}"
            param = f"len={label}{tag}-{metric.name}"
            family = _GROUPS[state]
            benchmarks.append(
                SweepBenchmark(
                    name=f"{path.rsplit('::', 1)[-1]}[{param}]",
                    fullname=f"{path}[{param}]",
                    group=f"{family} {metric.name} ({metric.unit})",
                    param=param,
                    params={
                        "length": length,
                        "metric": metric.name,
                        **({state: level or True} if state != "cold" else {}),
                    },
                    extra_info={
                        "length": length,
                        "length_label": label,
                        "cache_state": state,
                        "metric": metric.name,
                        "unit": metric.unit,
                        "figure": metric.figure,
                        "figure_units": {
                            name: FIGURE_UNITS.get(name, "") for r in measured for name in r.figures
                        },
                        "runs": sorted({r.run_id for r in measured}),
                        "answers": answer_counts(measured),
                        "rounds": [_round(r, metric) for r in measured],
                    },
                    rounds=tuple(metric.seconds(r.figures[metric.figure]) for r in measured),
                    timer=metric.description,
                )
            )
    return benchmarks


def benchmark_entries(records: Iterable[Record]) -> list[dict[str, Any]]:
    """The entries of :func:`sweep_benchmarks`, as pytest-benchmark writes them."""
    return [benchmark.entry() for benchmark in sweep_benchmarks(records)]


def default_machine_info() -> dict[str, Any]:
    """What pytest-benchmark records about this machine, or the basics if that fails."""
    return copy.deepcopy(_machine_info_once())


@functools.cache
def _machine_info_once() -> dict[str, Any]:
    # Probing the CPU takes a noticeable fraction of a second; reports are rebuilt often.
    try:
        from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info

        return dict(pytest_benchmark_generate_machine_info())
    except Exception:  # cpu probing can fail in containers; the report must still be written
        return {
            "node": platform.node(),
            "machine": platform.machine(),
            "system": platform.system(),
            "release": platform.release(),
            "python_implementation": platform.python_implementation(),
            "python_version": platform.python_version(),
        }


def default_commit_info() -> dict[str, Any]:
    """pytest-benchmark's view of the current checkout, or an explicit "unknown"."""
    try:
        from pytest_benchmark.utils import get_commit_info

        return dict(get_commit_info())
    except Exception as exc:
        return {"id": "unknown", "time": None, "author_time": None, "dirty": False,
                "error": repr(exc), "project": None, "branch": "(unknown)"}  # fmt: skip


def _pytest_benchmark_version() -> str:
    try:
        from pytest_benchmark import __version__

        return str(__version__)
    except ImportError:
        return "unknown"


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def build_benchmark_json(
    records: Iterable[Record],
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole document; ``machine_info["longctx_fingerprint"]`` names the measured setup.

    pytest-benchmark's machine_info describes the machine writing the file, which for a
    rebuilt report or a remote server is not the one that served the requests, so the
    records' own fingerprint is added alongside.
    """
    records = list(records)
    machine = dict(machine_info) if machine_info is not None else default_machine_info()
    machine["longctx_fingerprint"] = _json_safe(dict(reference_fingerprint(records)))
    return {
        "machine_info": machine,
        "commit_info": dict(commit_info) if commit_info is not None else default_commit_info(),
        "benchmarks": benchmark_entries(records),
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": _pytest_benchmark_version(),
    }


def write_benchmark_json(
    path: Path,
    records: Iterable[Record],
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
) -> Path:
    document = build_benchmark_json(records, machine_info, commit_info)
    return write_atomically(path, json.dumps(document, indent=4, default=str) + "\n")
