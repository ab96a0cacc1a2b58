"""A point's progress samples, kept in the run folder: ``samples/<point id>.jsonl``.

The first line is a header (``{"samples": 1, "length": ..., "repeat": ..., "block_size": ...,
"capacity_tokens": ..., "telemetry": {...}}``), then one line per sample, appended and
flushed as it is taken:

* ``t``: seconds since the request's t0 (the baseline, read before the request, is negative);
* ``phase``: ``before``, ``prefill``, ``decode`` or ``after`` (read once the stream ended);
* ``kv_usage``: vLLM's ``vllm:kv_cache_usage_perc`` gauge; ``kv_tokens``: the gauge above its
  baseline times the KV capacity, i.e. tokens whose KV blocks are allocated (block-quantized);
* ``prefilled``: prompt tokens prefilled so far: ``min(kv_tokens, length)`` while prefilling,
  the whole prompt once the first token arrived (it proves the prefill done);
* ``received``: tokens the stream delivered so far;
* ``devices``: device telemetry readings (see :mod:`pytest_longctx.progress.telemetry`);
* on the ``after`` sample, ``first_token_t`` and ``last_token_t``: the stream's own times.

Readers (the prefill-rate plot) need nothing but this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import SAMPLES_DIR

SAMPLES_VERSION = 1


def samples_path(run_dir: Path, point_id: str) -> Path:
    return Path(run_dir) / SAMPLES_DIR / f"{point_id}.jsonl"


class SampleWriter:
    """Writes one point's file: the header at once, each sample as it comes, flushed."""

    def __init__(self, path: Path, header: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._write({"samples": SAMPLES_VERSION, **header})

    def _write(self, data: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(data, sort_keys=True) + "\n")
        self._handle.flush()

    def append(self, sample: Mapping[str, Any]) -> None:
        if not self._handle.closed:
            self._write(sample)

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()


@dataclass(frozen=True)
class PointSamples:
    """One point's samples file, read back."""

    path: Path
    header: Mapping[str, Any]
    samples: tuple[Mapping[str, Any], ...] = field(default=())

    @property
    def length(self) -> int:
        return int(self.header.get("length", 0))

    @property
    def repeat(self) -> int:
        return int(self.header.get("repeat", 0))

    @property
    def run_id(self) -> str | None:
        return self.header.get("run_id")

    @property
    def first_token_s(self) -> float | None:
        """When the first token arrived (from the ``after`` sample), if it did."""
        for sample in reversed(self.samples):
            if sample.get("first_token_t") is not None:
                return float(sample["first_token_t"])
        return None

    def prefill_curve(self) -> list[tuple[float, float]]:
        """``(position, tokens/s)``: the prefill rate between successive changes of the
        prefilled count, at the middle of the tokens prefilled in between.

        Each change is dated by the first ``prefill`` sample whose gauge reading saw it, so a
        date errs by up to one sampling interval; changes less than two intervals apart are
        merged. The last step ends at the first token (the whole prompt), or at the first
        ``decode`` reading when that is unknown.
        """
        steps: list[tuple[float, float]] = [(0.0, 0.0)]
        end: tuple[float, float] | None = None
        first_token = self.first_token_s
        if first_token is not None:
            end = (first_token, float(self.length))
        for sample in self.samples:
            phase, kv_tokens = sample.get("phase"), sample.get("kv_tokens")
            if phase not in ("prefill", "decode") or kv_tokens is None:
                continue
            position = min(float(kv_tokens), float(self.length))
            if phase == "decode":
                end = end or (float(sample["t"]), position)
                break
            if position > steps[-1][1] and position < self.length:
                steps.append((float(sample["t"]), position))
        if end is not None and end[1] > steps[-1][1]:
            steps.append(end)
        # Steps closer than two sampling intervals are merged: a step's date errs by up to
        # one interval, which would make neighbouring rates alternate high and low.
        span = 2 * float(self.header.get("interval_s") or 0.0)
        merged = [steps[0]]
        for step in steps[1:-1]:
            if step[0] - merged[-1][0] >= span:
                merged.append(step)
        if len(steps) > 1:
            # The last step (often exact: the first token) ends the last segment, which it
            # lengthens rather than follow it closely.
            if len(merged) > 1 and steps[-1][0] - merged[-1][0] < span:
                merged[-1] = steps[-1]
            else:
                merged.append(steps[-1])
        curve = []
        for (t0, p0), (t1, p1) in zip(merged, merged[1:], strict=False):
            if t1 > t0 and p1 > p0:
                curve.append(((p0 + p1) / 2, (p1 - p0) / (t1 - t0)))
        return curve


def read_samples(path: Path) -> PointSamples | None:
    """A samples file; None when it is not one. Corrupt lines (a crash mid-write) are skipped."""
    header: Mapping[str, Any] | None = None
    samples = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                if header is None:
                    if data.get("samples") != SAMPLES_VERSION:
                        return None
                    header = data
                elif isinstance(data.get("t"), (int, float)):
                    samples.append(data)
    except OSError:
        return None
    if header is None:
        return None
    return PointSamples(Path(path), header, tuple(samples))


def read_run_samples(run_dir: Path) -> list[PointSamples]:
    """Every point's samples in a run folder, by length then repeat."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    found = [read_samples(path) for path in sorted(folder.glob("*.jsonl"))]
    return sorted((s for s in found if s is not None), key=lambda s: (s.length, s.repeat))


def longest_curves(
    point_samples: Sequence[PointSamples], how_many: int = 3
) -> list[tuple[PointSamples, list[tuple[float, float]]]]:
    """The prefill curves of the ``how_many`` longest lengths that have one (the latest
    repeat of each)."""
    by_length: dict[int, tuple[PointSamples, list[tuple[float, float]]]] = {}
    for samples in point_samples:
        curve = samples.prefill_curve()
        if len(curve) >= 2:
            by_length[samples.length] = (samples, curve)
    return [by_length[length] for length in sorted(by_length, reverse=True)[:how_many]]
