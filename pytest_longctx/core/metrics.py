"""A gated metric: which figure of which workload's records it reads and which direction
hurts. Each workload declares its own (``Workload.gate_metrics``); the gate iterates them."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_longctx.core.records import FIGURE_UNITS


@dataclass(frozen=True)
class Metric:
    """One gated quantity: which figure it reads and which direction hurts."""

    name: str  # the key in the tolerance spec
    figure: str  # the key in Record.figures
    label: str  # how messages name it
    higher_is_worse: bool
    default_tolerance_pct: float
    worse_verb: str
    better_verb: str
    #: Which points it reads: cold prefills, warm follow-ups or interference points (each
    #: gated only against the baseline's points of the same kind, never against cold ones).
    cache_state: str = "cold"
    #: The metric whose tolerance it takes unless a spec sets its own (warm TTFT: TTFT's;
    #: TTFT under load: TTFT's; the background's stall: ITL's).
    falls_back_to: str | None = None
    #: Judged per concurrency level (each level against the baseline's at the same length and
    #: level), never calibrated: levels differ by design.
    per_level: bool = False

    @property
    def optional(self) -> bool:
        """Gated only where both sides measured its points (every workload's but the
        cold points', which a gated length always has)."""
        return self.cache_state != "cold"

    @property
    def is_decode(self) -> bool:
        """Whether it reads the decode throughput, whose source a record's stream says."""
        return self.figure == "decode_throughput"

    @property
    def unit(self) -> str:
        return FIGURE_UNITS.get(self.figure, "")
