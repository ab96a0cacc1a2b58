"""The points: which points a session measures, in which order, under which profile."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size, powers_of_two_between
from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles import Profile

SLOW_MARK = "longctx_slow"
VERY_SLOW_MARK = "longctx_very_slow"


class PlanError(ValueError):
    """Options that select nothing to measure."""


#: The workloads a sweep can measure (``--longctx-workload``): every point's cold prefill,
#: follow-up questions on its prefix while the server still caches it, and the same cold
#: prefill on a server that also carries K short background streams (what it costs them).
COLD, WARM, INTERFERENCE = "cold", "warm", "interference"
#: c distinct cold prompts of one length sent at once: how many fit, and what each decodes.
CONCURRENCY = "concurrency"
WORKLOADS = (COLD, WARM, INTERFERENCE, CONCURRENCY)
WARM_MARK = "longctx_warm"
INTERFERENCE_MARK = "longctx_interference"
CONCURRENCY_MARK = "longctx_concurrency"
#: The highest concurrency level measured (--longctx-max-concurrency).
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_WARM_QUESTIONS = 3
DEFAULT_WARM_SUFFIX = 256
#: Background streams beside an interference point's long prompt (--longctx-background-streams).
DEFAULT_BACKGROUND_STREAMS = 4
#: Each background request: a short prompt of its own (its own nonce first), then a bounded
#: decode; re-issued as it ends, so no stream grows its own context through a long prefill.
#: The decode outlasts the wait before the long prompt's first step: a request re-issued while
#: the long prompt is admitted waits behind its prefill (vLLM schedules the running prefill's
#: chunk before a waiting request), so streams that all end then stream nothing beside it. With
#: 64 tokens, four streams of a busy CPU server once all ended in that wait (each ran 1.5 s).
BACKGROUND_PROMPT_TOKENS = 128
BACKGROUND_DECODE_TOKENS = 256
#: Seconds of background streaming recorded before the long prompt is sent: the reference.
IDLE_REFERENCE_S = 3.0


def concurrency_levels(max_concurrency: int, fit: int | None) -> tuple[int, ...]:
    """Levels 1, 2, 4, ... up to ``max_concurrency``, and the planned ``fit`` and ``fit + 1``
    (the last level that should run at once and the first that should not: the two that
    measure the fit exactly) where they are within the limit."""
    levels = set()
    level = 1
    while level <= max_concurrency:
        levels.add(level)
        level *= 2
    if fit is not None:
        levels |= {c for c in (fit, fit + 1) if 1 <= c <= max_concurrency}
    return tuple(sorted(levels))


def max_model_len_for(largest_prompt: int, decode_tokens: int) -> int:
    """vLLM silently clamps prompt + max_tokens beyond the limit, so make room for both."""
    return largest_prompt + decode_tokens


@dataclass(frozen=True, order=True)
class Point:
    """One sweep item: a prompt length and which pass over the sweep it belongs to.

    A warm point (``question`` 1..Q) is a follow-up to the cold point of the same length and
    repeat: its prompt is that point's ``length`` tokens exactly, then ``suffix`` new ones. An
    interference point (``background`` K > 0) is a cold prompt of ``length`` sent while K
    background streams run on its server.
    """

    length: int  # prompt tokens (a warm point's: its cold prefix)
    repeat: int  # which pass over the sweep, from 0
    question: int = 0  # a warm follow-up's number, 1..Q (0: not warm)
    suffix: int = 0  # a warm follow-up's new tokens after the prefix
    background: int = 0  # an interference point's background streams K (0: none)
    #: A concurrency point's level: this many prompts of ``length`` sent at once (0: none).
    concurrency: int = 0
    #: The workload the point belongs to, said by the workload that made it (its ``name``):
    #: never inferred from which of the fields above is set.
    workload: str = COLD

    @property
    def warm(self) -> bool:
        return self.workload == WARM

    @property
    def concurrent(self) -> bool:
        return self.workload == CONCURRENCY

    @property
    def interference(self) -> bool:
        return self.workload == INTERFERENCE

    @property
    def cache_state(self) -> str:
        """The workload the point belongs to (the record's ``cache_state``)."""
        return self.workload

    @property
    def cold(self) -> Point:
        """The cold point whose prefix a warm point reuses (itself for a cold or an
        interference point: neither reuses another's prefix)."""
        return Point(self.length, self.repeat) if self.warm else self

    @property
    def prompt_tokens(self) -> int:
        return self.length + self.suffix

    @property
    def id(self) -> str:
        base = f"len={format_size(self.length)}-rep={self.repeat}"
        if self.interference:
            return f"{base}-{INTERFERENCE}"
        if self.concurrent:
            return f"{base}-conc={self.concurrency}"
        return f"{base}-warm={self.question}" if self.warm else base

    @classmethod
    def of_record(cls, record: Record) -> Point:
        """The point a record is of."""
        return cls(
            record.length,
            record.repeat,
            record.question,
            record.suffix_tokens,
            record.background_streams,
            record.concurrency_level,
            record.cache_state,
        )


@dataclass(frozen=True)
class SweepPlan:
    lengths: tuple[int, ...]
    repeats: int
    order: str
    profile: Profile
    decode_tokens: int
    #: Follow-up questions after each cold point (0: the cold workload alone).
    warm_questions: int = 0
    #: New tokens each follow-up appends to its cold point's prompt.
    suffix_tokens: int = 0
    #: Background streams of the interference points (0: no interference workload).
    background_streams: int = 0
    #: The highest concurrency level (0: no concurrency workload).
    max_concurrency: int = 0
    #: The plan's fit per length, (length, requests that fit at once): each length's levels
    #: include its fit plus one. Set from the capacity plan once the plan is built.
    planned_fits: tuple[tuple[int, int], ...] = ()
    #: Unmeasured requests before the first point (--longctx-warmup-prompts or the profile's).
    warmup_prompts: int = 3
    #: The workloads measured (--longctx-workload), in the registry's order; each one's
    #: settings above are 0 where it is not.
    workloads: tuple[str, ...] = (COLD,)

    def levels(self, length: int) -> tuple[int, ...]:
        """The concurrency levels measured at ``length`` (none without the workload)."""
        fit = dict(self.planned_fits).get(length)
        return concurrency_levels(self.max_concurrency, fit) if self.max_concurrency else ()

    @property
    def passes(self) -> tuple[Point, ...]:
        """Each (length, repeat) once, in the run's order (``--longctx-order``): the cold
        points, and what each workload measures its own points of (their order:
        ``pytest_longctx.workloads.points_of``)."""
        if self.order == "length":
            return tuple(Point(n, r) for n in self.lengths for r in range(self.repeats))
        return tuple(Point(n, r) for r in range(self.repeats) for n in self.lengths)

    @property
    def background_load(self) -> tuple[int, int]:
        """What an interference point's background holds in the cache: (requests, tokens
        each), their short prompt and its decode."""
        return (self.background_streams, BACKGROUND_PROMPT_TOKENS + BACKGROUND_DECODE_TOKENS)

    @property
    def tokens_after_prefix(self) -> int:
        """What a request adds to its length-L prefix: a follow-up's suffix (0 without the
        warm workload), then the decode."""
        return self.suffix_tokens + self.decode_tokens

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
        return max_model_len_for(largest, self.tokens_after_prefix)


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
        warm_questions=settings.warm_questions if WARM in settings.workload else 0,
        suffix_tokens=settings.warm_suffix if WARM in settings.workload else 0,
        background_streams=(
            settings.background_streams if INTERFERENCE in settings.workload else 0
        ),
        max_concurrency=settings.max_concurrency if CONCURRENCY in settings.workload else 0,
        workloads=tuple(settings.workload),
        warmup_prompts=(
            profile.sweep.warmup_prompts
            if settings.warmup_prompts is None
            else settings.warmup_prompts
        ),
    )
