"""The results schema: one JSON line per finished sweep item, the only input of every report.

``results.jsonl`` is appended and flushed to disk the moment an item finishes, so a crash,
a timeout, Ctrl-C or SIGKILL loses at most the point that was running.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import RESULTS_FILE

SCHEMA_VERSION = 1

#: Every figure a measurement can carry, with its unit. Reports read units from here.
FIGURE_UNITS: Mapping[str, str] = {
    "ttft": "s",  # client-side time to first generated token
    # (N-1) / (t_last - t_first); the server's, (N-1) / its decode time, for a point whose
    # stream disagreed with it, and absent where neither is this request's own (the record's
    # stream.decode_source says which: stream, server or none)
    "decode_throughput": "tok/s",
    # Inter-token latencies: only when every chunk carried one token.
    "itl_median": "s",
    "itl_p90": "s",
    "itl_max": "s",
    # With chunks of several tokens (--stream-interval): the gaps between chunks as such, and
    # per-token figures derived from them (each gap over its chunk's tokens), never ITLs.
    "chunk_gap_median": "s",
    "chunk_gap_p90": "s",
    "chunk_gap_max": "s",
    "derived_itl_median": "s",
    "derived_itl_p90": "s",
    # A point kept with the server's decode figure keeps the stream's own under these names.
    "stream_decode_throughput": "tok/s",
    "stream_itl_median": "s",
    "stream_itl_p90": "s",
    "stream_itl_max": "s",
    "stream_chunk_gap_median": "s",
    "stream_chunk_gap_p90": "s",
    "stream_chunk_gap_max": "s",
    "stream_derived_itl_median": "s",
    "stream_derived_itl_p90": "s",
    "e2e": "s",  # request sent -> stream closed
    "server_ttft": "s",  # vLLM's own histogram sum delta
    "server_prefill": "s",
    "server_queue": "s",
    "server_decode": "s",
    "server_decode_throughput": "tok/s",  # (N-1) / vLLM's decode time: no client scheduling
    # vLLM's own timing of the measured request (its per-request metrics; the record's
    # server_timing): scheduled to first token, queued to scheduled, and the client's TTFT
    # less the server's, the front end's share (upload, parsing, the ids' validation, queue);
    # and its mean inter-token latency (first to last token over the tokens after the first),
    # which the gate judges ITL on where a stream shows no gap of one token.
    "server_request_ttft": "s",
    "server_request_queue": "s",
    "front_end_ttft": "s",
    "server_request_itl": "s",
    "request_body_bytes": "B",
    "prompt_build": "s",
    # The ETA model's TTFT for this length, fitted to the points measured before it (progress/).
    "predicted_ttft": "s",
    # Device energy from the power sampled during the point (progress/energy.py): t0 to the
    # first token, first to last token, both; per prompt token and per token decoded after
    # the first. Absent where no device tool reports power (a CPU host).
    "energy": "J",
    "prefill_energy": "J",
    "decode_energy": "J",
    "energy_per_prompt_token": "J/tok",
    "energy_per_generated_token": "J/tok",
    # An interference point (its ttft is the long prompt's TTFT under the background load):
    # the background streams' inter-token gaps in each window (idle reference before the long
    # prompt is sent; its prefill, send to first token; its decode, first to last token),
    # median, p99 and max over the gaps of every stream; their tokens per second there (all
    # streams together); the background tokens that arrived during the prefill (0: the
    # prefill stalled every stream).
    **{
        f"bg_itl_{window}_{statistic}": "s"
        for window in ("idle", "prefill", "decode")
        for statistic in ("median", "p99", "max")
    },
    **{f"bg_rate_{window}": "tok/s" for window in ("idle", "prefill", "decode")},
    # each background request's own wait for its first token, in the window it lies in
    **{
        f"bg_ttft_{window}_{statistic}": "s"
        for window in ("idle", "prefill", "decode")
        for statistic in ("median", "max")
    },
    "bg_tokens_during_prefill": "tok",
    # A concurrency point (its ttft is the last request's to start: the queueing shows in
    # it): the decode tokens of all its requests over the span they decoded in, and the
    # slowest request's own decode rate.
    "aggregate_decode_throughput": "tok/s",
    "min_request_decode_throughput": "tok/s",
}

#: The key of a baseline file's first line, which holds the gate's settings (gate/baseline.py).
BASELINE_HEADER_KEY = "longctx_baseline"

#: ``interrupted``: the point was being measured when the session was stopped (Ctrl-C,
#: SIGTERM, SIGHUP); it has no figures and ``--longctx-resume`` measures it again.
OUTCOMES = ("passed", "failed", "skipped", "error", "interrupted")

#: Why a point did not pass, from evidence (status codes, error frames, the server's log and
#: exit status, the cgroup's OOM kills); every failed, error and interrupted record has one.
FAILURE_CLASSES: Mapping[str, str] = {
    "contract": "measured, but not exact, not cold, not alone or not streamed as decoded",
    "timeout": "the first-token or inter-token budget ran out while the server kept answering",
    "hang": "the budget ran out and the server no longer answered",
    "oom": "out of memory, named by the server's log, vLLM's KV check or the OOM killer",
    "engine_died": "the engine or the server process died during the point",
    "server_gone": "the attached server stopped answering",
    "connection_cut": "the connection broke while the server stayed up (a proxy, NAT or "
    "load balancer between them)",
    "refused": "the server rejected the request (too long, bad request, no key)",
    "start_failed": "the server could not start",
    "interrupted": "the session was stopped during the point",
    "wrong_answer": "measured, but the answer to the probe the prompt carried was wrong",
    "error": "anything else, with its text",
}

#: ``cache.tier``: the tier of the server's KV cache that served a point's cached prompt tokens,
#: nearest the accelerator first (vLLM's own order); of several, the farthest one, as vLLM
#: names a mixed hit. ``cache.served_by`` holds the tokens per tier (measure/cache_state.py).
CACHE_TIERS: Mapping[str, str] = {
    "device": "the device prefix cache",
    "host": "host memory (CPU offload)",
    "p2p": "another vLLM instance (p2p)",
    "disk": "disk offload",
    "external_unspecified": "a KV connector that does not name its tier (LMCache, ...)",
    "external": "a KV connector (vLLM before 0.32 does not say which tier)",
}


@dataclass(frozen=True)
class Record:
    """What one sweep item produced, whatever its outcome."""

    #: The session that measured it (``20261205T075320Z-b49b3a``): its run folder's name.
    run_id: str
    #: The item's pytest node id (``...::test_prefill_decode[len=1Ki-rep=0]``).
    nodeid: str
    #: The prompt length L in tokens (a warm point's: its cold prefix).
    length: int
    #: Which pass over the lengths, from 0.
    repeat: int
    #: One of :data:`OUTCOMES`.
    outcome: str
    #: Why it did not pass, in words; None when it passed.
    reason: str | None = None
    #: Each measured figure (:data:`FIGURE_UNITS`), in the file ``{"value": ..., "unit": ...}``.
    figures: Mapping[str, float] = field(default_factory=dict)
    #: Prompt tokens the server counted (``usage.prompt_tokens``).
    prompt_tokens: int | None = None
    #: Tokens the server generated (``usage.completion_tokens``).
    completion_tokens: int | None = None
    #: vLLM's /metrics deltas over the request (prompt tokens, cache hits, ...).
    server_metrics: Mapping[str, float] = field(default_factory=dict)
    #: What was measured: profile, model, revision, command, versions, hardware.
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    #: How the stream was chunked (tokens per chunk, their source, the stream interval),
    #: whether it agreed with the server's decode (measure/agreement.py) and whose figure
    #: ``decode_throughput`` is (``decode_source``: ``stream``, ``server``, or ``none`` with
    #: ``decode_problem`` saying why); a record without ``decode_source`` is ``stream``.
    stream: Mapping[str, Any] = field(default_factory=dict)
    #: The point's workload, as the cache sees its prompt: ``cold`` (a prefill no cache
    #: served), ``warm`` (a follow-up on a cold point's prefix) or ``interference`` (a cold
    #: prefill measured while background streams ran on the server) or ``concurrency`` (cold
    #: prompts of one length sent at once).
    cache_state: str = "cold"
    #: What the server served from its prefix cache and, where it served any, from which tier
    #: (``tier``, one of :data:`CACHE_TIERS`; ``served_by``, tokens per tier; ``tier_counter``,
    #: the counters they were read from); for a warm point also which question it is, its
    #: prefix and suffix tokens, the tokens the contract required and the alignment.
    cache: Mapping[str, Any] = field(default_factory=dict)
    started_at: float | None = None  # unix seconds
    finished_at: float | None = None  # unix seconds
    #: :data:`SCHEMA_VERSION` when written; a reader refuses another.
    schema_version: int = SCHEMA_VERSION
    #: One of :data:`FAILURE_CLASSES` for a point that did not pass (None when it passed).
    failure_class: str | None = None
    #: The lines that show the class: the server log's, the error frame, memory.events.
    evidence: tuple[str, ...] = ()
    #: The server start that measured the point: its number in the session (0 the first),
    #: when it started, its start-up time and, for a relaunch, its cause.
    server_start: Mapping[str, Any] = field(default_factory=dict)
    #: An interference point's load and what it did: the background streams and their
    #: requests, the windows, the gaps per window, the server's own inter-token histogram
    #: and its timing of each background request against them (``server_itl``,
    #: ``background_timing``) and the verdict on the gaps (``background_gaps``: ``confirmed``
    #: or ``refuted``, with why), how the streams became ready (``streams_ready``), the
    #: ``bg_*`` figures a refuted point set aside (``unconfirmed_figures``, not gated), its
    #: effective chunk size, sequence limit and preemptions
    #: (workloads/interference/windows.py). Empty for other points.
    interference: Mapping[str, Any] = field(default_factory=dict)
    #: The devices the energy figures cover (the server's own; on a server over several
    #: nodes, what share of its GPUs) and each energy figure not measured, with why
    #: (``not_measured``: a phase shorter than the power tool's averaging window).
    energy: Mapping[str, Any] = field(default_factory=dict)
    #: The probe the measured prompt carried and its verdict: ``expected``, ``answer``,
    #: ``depth`` (fraction of the prompt), ``verdict`` (``correct``, ``wrong`` or
    #: ``not_checked`` with a ``reason``), ``judged_by``, ``mode`` (``check`` or ``record``),
    #: ``key`` (the name the question asks for) and ``needles`` (how many the prompt holds);
    #: ``reasoning_chars`` when the answer followed a reasoning block, and ``answered`` (the
    #: verdict it would have had) when ``auto`` recorded it unjudged (the model did not answer
    #: the probe in the warm-ups).
    fidelity: Mapping[str, Any] = field(default_factory=dict)
    #: A concurrency point's level and what it did (``cache_state`` ``concurrency``): the
    #: ``level`` (requests of this length sent at once), ``aggregate_decode_throughput``,
    #: each request's figures (``requests``), the peaks of the scheduler's gauges, the
    #: preemptions, ``ran_at_once``, and the length's ``fit_measured`` (where known),
    #: ``fit_planned``, ``fit_vllm`` and ``verdict``
    #: (workloads/concurrency/concurrent.py). Empty for other points.
    concurrency: Mapping[str, Any] = field(default_factory=dict)
    #: The server's own timing of each request of the point beside the client's
    #: (measure/server_timing.py): ``source`` ``per_request`` (vLLM's per-request metrics)
    #: with ``request`` (the measured one), ``background`` (an interference point's) or
    #: ``requests`` (a concurrency level's), each with its front end's share and its decode
    #: judged against its own; or ``metrics`` (the server sent none: its figures are
    #: /metrics' sums, ``server_metrics``) with ``why``. Empty for a point not measured.
    server_timing: Mapping[str, Any] = field(default_factory=dict)
    #: The model's trained positions (its ``max_position_embeddings``) where this point's
    #: prompt and decode run past them: vLLM serves such a length only under
    #: ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` and warns that the model may give NaN or
    #: out-of-range results there. None within them, or where they are not known.
    past_positions: int | None = None

    def figure(self, name: str) -> float | None:
        return self.figures.get(name)

    @property
    def question(self) -> int:
        """0 for a cold point, 1..Q for its warm follow-ups."""
        return int(self.cache.get("question") or 0)

    @property
    def suffix_tokens(self) -> int:
        return int(self.cache.get("suffix_tokens") or 0)

    @property
    def warm(self) -> bool:
        return self.cache_state == "warm"

    @property
    def background_streams(self) -> int:
        """K for an interference point (its background streams), 0 for any other."""
        if self.cache_state != "interference":
            return 0
        return int(self.interference.get("background_streams") or 0)

    @property
    def concurrency_level(self) -> int:
        """c for a concurrency point (its requests sent at once), 0 for any other."""
        if self.cache_state != "concurrency":
            return 0
        return int(self.concurrency.get("level") or 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "nodeid": self.nodeid,
            "length": self.length,
            "repeat": self.repeat,
            "outcome": self.outcome,
            "reason": self.reason,
            "figures": {
                name: {"value": value, "unit": FIGURE_UNITS.get(name, "")}
                for name, value in self.figures.items()
            },
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "server_metrics": dict(self.server_metrics),
            "fingerprint": dict(self.fingerprint),
            "stream": dict(self.stream),
            "cache_state": self.cache_state,
            "cache": dict(self.cache),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "failure_class": self.failure_class,
            "evidence": list(self.evidence),
            "server_start": dict(self.server_start),
            "interference": dict(self.interference),
            "energy": dict(self.energy),
            "fidelity": dict(self.fidelity),
            "concurrency": dict(self.concurrency),
            "server_timing": dict(self.server_timing),
            "past_positions": self.past_positions,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"schema_version {version!r}, this reader knows {SCHEMA_VERSION}")
        if data.get("outcome") not in OUTCOMES:
            raise ValueError(f"outcome {data.get('outcome')!r} is not one of {OUTCOMES}")
        failure_class = data.get("failure_class")
        if failure_class is not None and failure_class not in FAILURE_CLASSES:
            raise ValueError(
                f"failure_class {failure_class!r} is not one of {tuple(FAILURE_CLASSES)}"
            )
        return cls(
            run_id=str(data["run_id"]),
            nodeid=str(data["nodeid"]),
            length=int(data["length"]),
            repeat=int(data["repeat"]),
            outcome=data["outcome"],
            reason=data.get("reason"),
            figures={k: float(v["value"]) for k, v in (data.get("figures") or {}).items()},
            prompt_tokens=data.get("prompt_tokens"),
            completion_tokens=data.get("completion_tokens"),
            server_metrics=dict(data.get("server_metrics") or {}),
            fingerprint=dict(data.get("fingerprint") or {}),
            stream=dict(data.get("stream") or {}),
            cache_state=str(data.get("cache_state") or "cold"),
            cache=dict(data.get("cache") or {}),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            failure_class=failure_class,
            evidence=tuple(str(line) for line in data.get("evidence") or ()),
            server_start=dict(data.get("server_start") or {}),
            interference=dict(data.get("interference") or {}),
            energy=dict(data.get("energy") or {}),
            fidelity=dict(data.get("fidelity") or {}),
            concurrency=dict(data.get("concurrency") or {}),
            server_timing=dict(data.get("server_timing") or {}),
            past_positions=data.get("past_positions"),
        )


@dataclass(frozen=True)
class ReadResult:
    records: tuple[Record, ...]
    #: One line per skipped line: ``path:lineno: why``. Never fatal.
    problems: tuple[str, ...] = ()
    #: A baseline file's header line, and its line number (gate/baseline.py checks it).
    header: Mapping[str, Any] | None = None
    header_line: int = 0


def record_line(record: Record) -> str:
    """One record as its line of ``results.jsonl``."""
    return json.dumps(record.to_json(), sort_keys=True) + "\n"


def append_record(path: Path, record: Record) -> None:
    """Append one line and force it to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = record_line(record)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: Path) -> ReadResult:
    """Every well-formed record in ``path``; a corrupt line is reported and skipped."""
    records: list[Record] = []
    problems: list[str] = []
    header: Mapping[str, Any] | None = None
    header_line = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if isinstance(data, dict) and BASELINE_HEADER_KEY in data:
                    header, header_line = data, lineno  # a baseline's settings, not a record
                    continue
                records.append(Record.from_json(data))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{path}:{lineno}: skipped a corrupt record ({exc})")
    return ReadResult(tuple(records), tuple(problems), header, header_line)


def results_path(run_or_file: Path) -> Path:
    """Accept a run folder or its ``results.jsonl``."""
    run_or_file = Path(run_or_file)
    return run_or_file / RESULTS_FILE if run_or_file.is_dir() else run_or_file


def read_runs(paths: Iterable[Path]) -> ReadResult:
    """Records of several runs merged in order (e.g. three passes made on different days)."""
    records: list[Record] = []
    problems: list[str] = []
    for path in paths:
        result = read_records(results_path(path))
        records.extend(result.records)
        problems.extend(result.problems)
    return ReadResult(tuple(records), tuple(problems))
