"""How long to wait for the first token at a length nobody has measured yet.

Prefill time spans seven orders of magnitude over a sweep (the reference: 0.08 s at 1Ki,
about 11 hours at 64Mi), so one fixed limit is either useless at the short end or kills the
long end. The budget grows from what the sweep has already measured: with prefill cost
``c + a*L + b*L**2`` (constant, linear and attention terms, none negative),
``ttft(L) <= ttft(L0) * (L / L0)**2`` for any ``L >= L0``, so exponent 2 gives an upper bound
and the safety factor only has to absorb noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_longctx.core.sizes import format_size


@dataclass(frozen=True)
class FirstTokenBudget:
    """First-token limits: an override, else an extrapolation, else a generous default."""

    floor_s: float = 60.0  # never less: start-up jitter, a first compile, a busy machine
    safety_factor: float = 3.0
    exponent: float = 2.0
    default_s: float = 6 * 3600.0  # nothing measured yet: wait long rather than kill a run
    override_s: float | None = None  # an explicit user option wins over everything

    def __post_init__(self) -> None:
        for name in ("floor_s", "safety_factor", "exponent", "default_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}: expected a positive finite number")
        if self.override_s is not None and not self.override_s > 0:
            raise ValueError(f"override_s={self.override_s!r}: expected a positive number")

    def for_length(
        self, length: int, measured: Mapping[int, float], requests: int = 1
    ) -> tuple[float, str]:
        """Seconds to wait for the first token of a ``length``-token prompt, and why.

        ``measured`` maps lengths to the slowest TTFT seen there. The base is the largest
        measured length at or below ``length`` (at or below, so repeats of a length reuse
        their own first measurement). ``requests`` prompts sent at once (a concurrency level)
        share the server's prefill, and one past the server's room waits for another to
        finish: each may wait up to that many prefills, so the budget is that many times one
        request's. An explicit override is the user's per-request limit and stays as given.
        """
        if length <= 0:
            raise ValueError(f"length={length}: expected a positive token count")
        if requests < 1:
            raise ValueError(f"requests={requests}: expected at least one request")
        if self.override_s is not None:
            return self.override_s, f"explicit override of {self.override_s:g} s"
        seconds, why = self._one_request(length, measured)
        if requests == 1:
            return seconds, why
        return seconds * requests, (
            f"{why}; x {requests} prompts sent at once, each of which may wait for the others"
        )

    def _one_request(self, length: int, measured: Mapping[int, float]) -> tuple[float, str]:
        usable = {
            base: ttft
            for base, ttft in measured.items()
            if 0 < base <= length and math.isfinite(ttft) and ttft > 0
        }
        if not usable:
            return self.default_s, (
                f"default of {self.default_s:g} s: no TTFT measured at or below "
                f"{format_size(length)} yet"
            )
        base = max(usable)
        ttft = usable[base]
        extrapolated = ttft * (length / base) ** self.exponent * self.safety_factor
        formula = (
            f"{format_size(base)} took {ttft:.3g} s; x ({format_size(length)}/"
            f"{format_size(base)})^{self.exponent:g} x {self.safety_factor:g} = "
            f"{extrapolated:.3g} s"
        )
        if extrapolated < self.floor_s:
            return self.floor_s, f"floor of {self.floor_s:g} s ({formula})"
        return extrapolated, f"extrapolated: {formula}"
