"""The plan: which points a session measures, in which order, under which profile."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_longctx.core.sizes import format_size, powers_of_two_between
from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles import Profile

SLOW_MARK = "longctx_slow"
VERY_SLOW_MARK = "longctx_very_slow"


class PlanError(ValueError):
    """Options that select nothing to measure."""


def max_model_len_for(largest_prompt: int, decode_tokens: int) -> int:
    """vLLM silently clamps prompt + max_tokens beyond the limit, so make room for both."""
    return largest_prompt + decode_tokens


@dataclass(frozen=True, order=True)
class Point:
    """One sweep item: a prompt length and which pass over the sweep it belongs to."""

    length: int
    repeat: int

    @property
    def id(self) -> str:
        return f"len={format_size(self.length)}-rep={self.repeat}"


@dataclass(frozen=True)
class SweepPlan:
    lengths: tuple[int, ...]
    repeats: int
    order: str
    profile: Profile
    decode_tokens: int

    @property
    def points(self) -> tuple[Point, ...]:
        if self.order == "length":
            return tuple(Point(n, r) for n in self.lengths for r in range(self.repeats))
        return tuple(Point(n, r) for r in range(self.repeats) for n in self.lengths)

    def band_marks(self, length: int) -> tuple[str, ...]:
        sweep = self.profile.sweep
        if sweep.very_slow_from is not None and length >= sweep.very_slow_from:
            return (VERY_SLOW_MARK,)
        if sweep.slow_from is not None and length >= sweep.slow_from:
            return (SLOW_MARK,)
        return ()

    def max_model_len(self, lengths: tuple[int, ...] | None = None) -> int:
        """Sized for the largest point actually selected, not the whole range."""
        largest = max(lengths or self.lengths or (1024,))
        return max_model_len_for(largest, self.decode_tokens)


def build_plan(settings: Settings, profile: Profile) -> SweepPlan:
    low = settings.from_length or profile.sweep.from_length
    high = settings.to_length or profile.sweep.to_length
    lengths = tuple(powers_of_two_between(low, high))
    if not lengths:
        raise PlanError(
            f"--longctx-from/--longctx-to select no power of two between {low} and {high} tokens "
            f"(FROM {'given' if settings.from_length else f'from profile {profile.name}'}, "
            f"TO {'given' if settings.to_length else f'from profile {profile.name}'}): "
            "expected FROM <= TO with a power of two between them"
        )
    return SweepPlan(
        lengths=lengths,
        repeats=settings.repeats,
        order=settings.order,
        profile=profile,
        decode_tokens=settings.decode_tokens or profile.sweep.decode_tokens,
    )
