"""How long to wait for the first token at a length nobody has measured yet.

Prefill time spans seven orders of magnitude over a sweep (the reference: 0.08 s at 1Ki,
about 11 hours at 64Mi), so one fixed limit is either useless at the short end or kills the
long end. The budget grows from what the sweep has already measured: with prefill cost
``c + a*L + b*L**2`` (constant, linear and attention terms, none negative),
``ttft(L) <= ttft(L0) * (L / L0)**2`` for any ``L >= L0``, so exponent 2 gives an upper bound
and the safety factor only has to absorb noise.

Nothing measured at or below a length in this process (pytest-xdist sends the longest point
first, ``--longctx-resume`` and ``--longctx-from`` start at a long one), the budget comes from
what is known before (:class:`KnownTtft`): this run's records, which bound it as this process's
own measurements do, then a TTFT model fitted to them, then the model of the figures the
profile expects (``[sweep] expected_ttft``), then the shortest length known above it (a shorter
prompt takes no longer), and only without any of them the profile's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_longctx.core.sizes import format_size


@dataclass(frozen=True)
class KnownTtft:
    """TTFT known of a sweep's lengths before this process measures them, and whence.

    ``figures``: seconds by length, the slowest of this run's records or the profile's
    expected ones; ``model``: a TTFT model fitted to them (None before two lengths), described
    by ``model_text``. ``of_this_run``: this run's own records, measured on its server, which
    bound a longer length as this process's measurements do."""

    source: str
    figures: Mapping[int, float] = field(default_factory=dict)
    model: Callable[[float], float] | None = None
    model_text: str = ""
    of_this_run: bool = False

    def usable(self) -> dict[int, float]:
        return {n: t for n, t in self.figures.items() if n > 0 and math.isfinite(t) and t > 0}


@dataclass(frozen=True)
class FirstTokenBudget:
    """First-token limits: an override, else an extrapolation from what was measured or is
    known, else a generous default."""

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
        self,
        length: int,
        measured: Mapping[int, float],
        requests: int = 1,
        known: Sequence[KnownTtft] = (),
    ) -> tuple[float, str]:
        """Seconds to wait for the first token of a ``length``-token prompt, and why.

        ``measured`` maps lengths to the slowest TTFT seen there. The base is the largest
        measured length at or below ``length`` (at or below, so repeats of a length reuse
        their own first measurement), this run's records (``known``, ``of_this_run``)
        counting as measured. With no base: each of ``known`` in turn, its model's
        prediction times the safety factor, or without a model its own figure at or below
        ``length`` extrapolated the same way (not this run's: those counted already); then the
        shortest length ``known`` above ``length`` (a shorter prompt takes no longer); then
        the default.
        ``requests`` prompts sent at once (a concurrency level) share the server's prefill,
        and one past the server's room waits for another to finish: each may wait up to that
        many prefills, so the budget is that many times one request's. An explicit override
        is the user's per-request limit and stays as given.
        """
        if length <= 0:
            raise ValueError(f"length={length}: expected a positive token count")
        if requests < 1:
            raise ValueError(f"requests={requests}: expected at least one request")
        if self.override_s is not None:
            return self.override_s, f"explicit override of {self.override_s:g} s"
        seconds, why = self._one_request(length, measured, known)
        if requests == 1:
            return seconds, why
        return seconds * requests, (
            f"{why}; x {requests} prompts sent at once, each of which may wait for the others"
        )

    def _one_request(
        self, length: int, measured: Mapping[int, float], known: Sequence[KnownTtft]
    ) -> tuple[float, str]:
        seen = {base: (ttft, "") for base, ttft in KnownTtft("", measured).usable().items()}
        for source in known:
            if source.of_this_run:
                for base, ttft in source.usable().items():
                    if ttft > seen.get(base, (0.0, ""))[0]:
                        seen[base] = (ttft, f" ({source.source})")
        below = {base: value for base, value in seen.items() if base <= length}
        if below:
            base = max(below)
            ttft, whence = below[base]
            return self._extrapolated(length, base, f"took {ttft:.3g} s{whence}", ttft)
        for source in known:
            predicted = source.model(length) if source.model is not None else None
            if predicted is not None and math.isfinite(predicted) and predicted > 0:
                seconds = predicted * self.safety_factor
                formula = (
                    f"{source.model_text} predicts {predicted:.4g} s at {format_size(length)}; "
                    f"x {self.safety_factor:g} = {seconds:.4g} s"
                )
                return self._at_least_floor(seconds, f"predicted: {formula}")
            figures = source.usable()
            bases = [base for base in figures if base <= length]
            if bases and not source.of_this_run:
                base = max(bases)
                said = f"is expected to take {figures[base]:.4g} s ({source.source})"
                return self._extrapolated(length, base, said, figures[base])
        above: dict[int, tuple[float, str]] = {}
        for source in known:
            for base, ttft in source.usable().items():
                if base > length and ttft > above.get(base, (0.0, ""))[0]:
                    above[base] = (ttft, source.source)
        if above:
            base = min(above)
            ttft, whence = above[base]
            seconds = ttft * self.safety_factor
            return self._at_least_floor(
                seconds,
                f"bounded by {format_size(base)}'s {ttft:.4g} s ({whence}): a shorter prompt "
                f"takes no longer; x {self.safety_factor:g} = {seconds:.4g} s",
            )
        return self.default_s, (
            f"default of {self.default_s:g} s: no TTFT measured at or below "
            f"{format_size(length)} yet, nor known (no record of this run, no expected TTFT "
            "in the profile)"
        )

    def _extrapolated(self, length: int, base: int, said: str, ttft: float) -> tuple[float, str]:
        extrapolated = ttft * (length / base) ** self.exponent * self.safety_factor
        formula = (
            f"{format_size(base)} {said}; x ({format_size(length)}/"
            f"{format_size(base)})^{self.exponent:g} x {self.safety_factor:g} = "
            f"{extrapolated:.3g} s"
        )
        return self._at_least_floor(extrapolated, f"extrapolated: {formula}")

    def _at_least_floor(self, seconds: float, why: str) -> tuple[float, str]:
        if seconds < self.floor_s:
            return self.floor_s, f"floor of {self.floor_s:g} s ({why})"
        return seconds, why
