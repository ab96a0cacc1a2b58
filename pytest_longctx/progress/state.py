"""Where the sweep is, as one plain object: what ``progress.json`` holds and what every
display prints.

The sampler (or the session, between points) builds a :class:`ProgressState`; whoever shows
progress only renders states: the session's terminal, a file another machine watches, or
(under pytest-xdist) a controller printing what its workers wrote.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pytest_longctx.core.file_names import PROGRESS_FILE, progress_file_name
from pytest_longctx.core.files import write_atomically
from pytest_longctx.core.sizes import format_size
from pytest_longctx.progress.eta import format_duration

#: ``phase`` values: a point's request before its first token, after it; the session
#: between points; the session over.
PREFILL, DECODE, BETWEEN, FINISHED = "prefill", "decode", "between points", "finished"


@dataclass(frozen=True)
class RemainingPoint:
    """A selected point not measured yet, with its predicted cost (None: unknown yet)."""

    length: int
    repeat: int
    predicted_s: float | None = None


@dataclass(frozen=True)
class ProgressState:
    run_id: str
    phase: str
    updated_at: float = field(default_factory=time.time)  # unix seconds
    #: The point being measured (None between points).
    length: int | None = None
    repeat: int | None = None
    #: A warm follow-up's question (1..Q) on its cold point's cached prefix; None: cold.
    question: int | None = None
    #: An interference point's background streams; None: none.
    background: int | None = None
    #: Its 1-based position among the points this session measures, and their count.
    index: int | None = None
    of: int | None = None
    elapsed_s: float | None = None
    #: Prompt tokens prefilled so far (block-quantized, from the KV gauge), None if unknown.
    prefilled: int | None = None
    prefill_rate: float | None = None  # tokens/s, over the last few samples
    received: int = 0  # tokens the stream delivered
    decode_tokens: int | None = None
    decode_rate: float | None = None  # tokens/s since the first token
    predicted_ttft_s: float | None = None
    first_token_eta_s: float | None = None
    point_eta_s: float | None = None
    sweep_eta_s: float | None = None
    remaining: tuple[RemainingPoint, ...] = ()
    kv_usage: float | None = None
    devices: tuple[Mapping[str, Any], ...] = ()
    #: The last line a display should add (e.g. the ETA model), or why progress is partial.
    note: str | None = None

    # -- the file ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["remaining_points"] = len(self.remaining)
        data["remaining"] = [asdict(point) for point in self.remaining]
        data["devices"] = [dict(device) for device in self.devices]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProgressState:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["remaining"] = tuple(RemainingPoint(**point) for point in data.get("remaining", ()))
        values["devices"] = tuple(data.get("devices") or ())
        return cls(**values)

    # -- words -------------------------------------------------------------------------------

    @property
    def point_label(self) -> str:
        if self.length is None:
            return ""
        where = f" [{self.index}/{self.of}]" if self.index and self.of else ""
        warm = f" warm {self.question}" if self.question else ""
        if self.background:
            warm = f" beside {self.background} streams"
        return f"{format_size(self.length)} rep {self.repeat}{warm}{where}"

    def sweep_words(self) -> str:
        left = len(self.remaining)
        after = f"{left} more point{'s' if left != 1 else ''}" if left else "no more points"
        return f"sweep ~{format_duration(self.sweep_eta_s)} left ({after})"

    def parts(self) -> list[str]:
        """The pieces of a progress line, most important first."""
        if self.phase in (BETWEEN, FINISHED):
            return [self.phase, self.sweep_words()]
        parts = [self.point_label, format_duration(self.elapsed_s)]
        if self.phase == PREFILL:
            if self.question:
                parts.append("warm: prefix cached, prefilling the new tokens")
            elif self.prefilled is not None and self.length:
                share = 100 * self.prefilled / self.length
                parts.append(f"~{self.prefilled:,}/{self.length:,} prefilled ({share:.0f}%)")
            else:
                parts.append("prefilling")
            if self.prefill_rate:
                parts.append(f"{self.prefill_rate:,.0f} tok/s")
            if not self.question:
                parts.append(f"first token in ~{format_duration(self.first_token_eta_s)}")
        else:
            of = f"/{self.decode_tokens}" if self.decode_tokens else ""
            rate = f" at {self.decode_rate:,.1f} tok/s" if self.decode_rate else ""
            parts.append(f"decode {self.received}{of} tokens{rate}")
            parts.append(f"point ~{format_duration(self.point_eta_s)} left")
        parts.append(self.sweep_words())
        return parts

    def line(self, width: int | None = None) -> str:
        """One line for a terminal, cut to ``width``."""
        text = "longctx " + " | ".join(part for part in self.parts() if part)
        if width is not None and len(text) > width:
            text = text[: max(0, width - 1)] + "…"
        return text


def upcoming_line(state: ProgressState) -> str:
    """What is said before a point starts: its predicted TTFT and the sweep's ETA."""
    predicted = (
        f"predicted TTFT {format_duration(state.predicted_ttft_s)}"
        if state.predicted_ttft_s is not None
        else "TTFT not predicted yet (two lengths needed)"
    )
    return (
        f"longctx next: {state.point_label}: {predicted}, point "
        f"~{format_duration(state.point_eta_s)}; {state.sweep_words()}"
    )


def write_progress_file(run_dir: Path, state: ProgressState, worker: str | None = None) -> Path:
    """``progress.json`` replaced atomically: a reader never sees half of it."""
    text = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
    return write_atomically(Path(run_dir) / progress_file_name(worker), text)


def read_worker_states(run_dir: Path) -> dict[str, ProgressState]:
    """The states the workers of a distributed run wrote, by worker; unreadable ones left out."""
    states = {}
    for path in sorted(Path(run_dir).glob("progress-*.json")):
        try:
            states[path.stem[len("progress-") :]] = read_progress_file(path)
        except (OSError, ValueError, TypeError):
            continue
    return states


def combined_state(
    run_id: str, states: Mapping[str, ProgressState], servers: int
) -> dict[str, Any]:
    """``progress.json`` of a distributed run: the serial file's fields, taken from the server
    whose point has run longest, plus every server's own state under ``servers``.

    The sweep's ETA spreads the remaining points' predicted cost over the servers (longest
    first keeps them near evenly loaded), never below the longest remaining point.
    """
    active = [s for s in states.values() if s.phase in (PREFILL, DECODE)]
    lead = max(active, key=lambda s: s.elapsed_s or 0.0) if active else None
    newest = max(states.values(), key=lambda s: s.updated_at) if states else None
    base = lead or newest or ProgressState(run_id, BETWEEN)
    running = {(s.length, s.repeat) for s in active}
    # The newest state knows best what is left (workers read the shared results file).
    left = tuple(
        p for p in (newest.remaining if newest else ()) if (p.length, p.repeat) not in running
    )
    costs = [p.predicted_s for p in left]
    eta = None
    if all(cost is not None for cost in costs):
        known = [float(c) for c in costs if c is not None]
        eta = max(sum(known) / max(servers, 1), max(known, default=0.0))
    data = base.to_json()
    data.update(
        run_id=run_id,
        remaining=[asdict(p) for p in left],
        remaining_points=len(left),
        sweep_eta_s=eta,
        servers={worker: state.to_json() for worker, state in sorted(states.items())},
    )
    return data


def read_progress_file(path: Path) -> ProgressState:
    """The state a session (or a worker) wrote; a run folder or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / PROGRESS_FILE
    return ProgressState.from_json(json.loads(path.read_text(encoding="utf-8")))
