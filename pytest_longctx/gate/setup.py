"""What a gated session or a rebuilt report judges with: the baseline, the tolerances and where
they came from, and the level. One precedence for the tolerances, wherever the gate runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_longctx.core.records import Record

from .noise import DEFAULT_LEVEL
from .tolerances import Tolerances, parse_tolerances
from .verdicts import session_count

BUILT_IN = "built-in defaults"


def choose_tolerances(
    given: str | None,
    given_by: str,
    calibrated: Tolerances | None,
    calibrated_by: str,
    profile_spec: str | None,
    profile_name: str | None,
) -> tuple[Tolerances, str]:
    """The tolerances and their source: the ones given (an option), else the baseline file's
    calibration, else the profile's ``[gate] tolerance``, else the built-in defaults.

    Raises :class:`~.tolerances.ToleranceError` for a spec that does not parse; the caller
    names the option or file it came from.
    """
    if given:
        return parse_tolerances(given), given_by
    if calibrated is not None:
        return calibrated, calibrated_by
    if profile_spec:
        return parse_tolerances(profile_spec), f"profile {profile_name} [gate]"
    return parse_tolerances(None), BUILT_IN


@dataclass
class GateState:
    """A session's gate: mutable only by what it learns while judging (improvements)."""

    baseline: list[Record]
    tolerances: Tolerances
    #: Messages of metrics that improved beyond tolerance: time to refresh the baseline.
    improved: list[str] = field(default_factory=list)
    level: float = DEFAULT_LEVEL
    #: Where the tolerances came from: the option, the baseline file, the profile or built in.
    tolerance_source: str = BUILT_IN

    @property
    def sessions(self) -> int:
        return session_count(self.baseline)
