"""Records in pytest-benchmark's JSON layout, for its ``compare``, CI dashboards and history.

pytest-benchmark times a callable over many rounds; a sweep point is one cold request, so each
passed record becomes one benchmark with a single round whose time is the TTFT. The statistics
of that single round come from pytest-benchmark's own ``Stats`` class, so the fields match what
pytest-benchmark itself writes for one sample. Every other figure travels in ``extra_info``.
"""

from __future__ import annotations

import copy
import functools
import json
import platform
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.records import FIGURE_UNITS, Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.core.stats import latest_records
from pytest_longctx.reporting.markdown import reference_fingerprint

BENCHMARK_GROUP = "longctx"
#: Warm follow-ups are a group of their own: pytest-benchmark compares within a group.
WARM_GROUP = "longctx-warm"
#: The figure pytest-benchmark treats as "the time" of a benchmark.
TIMED_FIGURE = "ttft"
DEFAULT_TEST_NAME = "test_prefill_decode"


def benchmark_param(record: Record) -> str:
    """The parametrization id: taken from the node id when it has one."""
    name = record.nodeid.rsplit("::", 1)[-1]
    if name.endswith("]") and "[" in name:
        return name[name.index("[") + 1 : -1]
    warm = f"-warm={record.question}" if record.warm else ""
    return f"len={format_size(record.length)}-rep={record.repeat}{warm}"


def benchmark_name(record: Record) -> str:
    """``test_prefill_decode[len=1Ki-rep=0]``: the test's name as pytest shows it."""
    name = record.nodeid.rsplit("::", 1)[-1]
    function = name.split("[", 1)[0] or DEFAULT_TEST_NAME
    return f"{function}[{benchmark_param(record)}]"


def single_round_stats(seconds: float) -> dict[str, Any]:
    """pytest-benchmark's statistics of one round lasting ``seconds``."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    stats.update(seconds)
    result = stats.as_dict()
    result["data"] = [seconds]
    result["iterations"] = 1
    return result


def benchmark_entry(record: Record) -> dict[str, Any] | None:
    """One benchmark for a passed record with a TTFT; None for anything else."""
    if record.outcome != "passed" or TIMED_FIGURE not in record.figures:
        return None
    figures = {
        name: {"value": value, "unit": FIGURE_UNITS.get(name, "")}
        for name, value in record.figures.items()
        if name != TIMED_FIGURE
    }
    return {
        "group": WARM_GROUP if record.warm else BENCHMARK_GROUP,
        "name": benchmark_name(record),
        "fullname": record.nodeid,
        "params": {"length": record.length, "repeat": record.repeat},
        "param": benchmark_param(record),
        "extra_info": {
            "run_id": record.run_id,
            "length": record.length,
            "length_label": format_size(record.length),
            "repeat": record.repeat,
            "cache_state": record.cache_state,
            "cache": dict(record.cache),
            "timed_figure": {"name": TIMED_FIGURE, "unit": FIGURE_UNITS[TIMED_FIGURE]},
            "figures": figures,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "server_metrics": dict(record.server_metrics),
            "started_at": record.started_at,
            "finished_at": record.finished_at,
        },
        "options": {"rounds": 1, "warmup": False, "timer": "client wall clock, first token"},
        "stats": single_round_stats(record.figures[TIMED_FIGURE]),
    }


def benchmark_entries(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Entries for every passed point, ordered by length; also appended to a user's own JSON."""
    latest = sorted(
        latest_records(records), key=lambda r: (r.length, r.run_id, r.repeat, r.question)
    )
    return [entry for entry in map(benchmark_entry, latest) if entry is not None]


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
