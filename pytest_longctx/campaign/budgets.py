"""What a point may wait for, and what vLLM lets one engine step take, from what the run knows
before this process measures a length.

A point's first-token budget grows from the points this process measured
(:mod:`pytest_longctx.measure.timeouts`). Three ordinary paths start a long point with nothing
measured before it: pytest-xdist (its scheduler sends the longest point first),
``--longctx-resume`` and ``--longctx-from``. Their budget comes from this run's records (resumed,
or written by the other workers), then the TTFT model fitted to them
(:mod:`pytest_longctx.progress.eta`), then the profile's expected TTFT (``[sweep]
expected_ttft``) and the model fitted to it; only without any of them from the profile's
default. The same model sizes the longest engine step, the last prefill chunk over the longest
context: vLLM kills its engine when one step outlasts its own limit
(:mod:`pytest_longctx.serving.step_limit`), so the launch raises that limit where a step would
exceed it, and a request abandoned mid-step is waited for at least as long as the step before
the engine counts as stuck.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from pytest_longctx.campaign.run import RunDescription, Sizing
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.measure.timeouts import FirstTokenBudget, KnownTtft
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import COLD, INTERFERENCE
from pytest_longctx.profiles import Profile
from pytest_longctx.profiles.extra_args import cache_flags
from pytest_longctx.profiles.vllm_releases import UnsupportedRelease
from pytest_longctx.progress.eta import TtftModel, fit_nonnegative, fit_ttft, format_duration
from pytest_longctx.serving import step_limit

#: Where this run's own records come from, in a budget's reason.
RECORDED = "recorded in this run"


def recorded_ttft(records: Iterable[Record]) -> dict[int, float]:
    """The slowest client TTFT per length among passed cold records (a warm follow-up's TTFT
    is its suffix's, an interference or concurrency point's is under load)."""
    slowest: dict[int, float] = {}
    for record in records:
        ttft = record.figures.get("ttft")
        if record.outcome == "passed" and record.cache_state == "cold" and ttft and ttft > 0:
            slowest[record.length] = max(ttft, slowest.get(record.length, 0.0))
    return slowest


def known_ttft(profile: Profile, records: Sequence[Record]) -> tuple[KnownTtft, ...]:
    """What the run knows of each length's TTFT before this process measures it: its
    ``records`` (with the TTFT model fitted to them from two lengths on), then the profile's
    expected TTFT (with its model)."""
    known = []
    recorded = recorded_ttft(records)
    if recorded:
        model = fit_ttft(list(records))
        known.append(
            KnownTtft(
                RECORDED,
                recorded,
                model,
                "the TTFT model of this run's records" if model else "",
                of_this_run=True,
            )
        )
    expected = profile.sweep.expected_ttft
    if expected:
        lengths = sorted(expected)
        fitted = fit_nonnegative(lengths, [expected[n] for n in lengths])
        model = TtftModel(fitted[0], fitted[1], fitted[2], tuple(lengths)) if fitted else None
        source = f"profile {profile.name}'s expected_ttft"
        known.append(KnownTtft(source, expected, model, f"the TTFT model of {source}"))
    return tuple(known)


def first_token_budget(
    run: RunDescription,
    records: Sequence[Record],
    measured_ttft: Mapping[int, float],
    length: int,
    requests: int = 1,
) -> tuple[float, str]:
    """A point's first-token budget and where it came from: ``--longctx-ttft-timeout``, else
    grown from what this process measured (``measured_ttft``, by length), else from what the
    run knows (:func:`known_ttft` of its ``records``)."""
    budget = FirstTokenBudget(
        default_s=run.plan.profile.sweep.first_token_timeout_s,
        override_s=run.settings.ttft_timeout_s,
    )
    known = known_ttft(run.plan.profile, records)
    seconds, source = budget.for_length(length, dict(measured_ttft), requests, known)
    if run.settings.ttft_timeout_s is not None:
        source += " (--longctx-ttft-timeout)"
    return seconds, source


def ttft_model(profile: Profile, records: Sequence[Record]) -> KnownTtft | None:
    """The TTFT model the run knows first: its records' from two lengths on, else the
    profile's expected TTFT's; None without either."""
    known = known_ttft(profile, records)
    return next((each for each in known if each.model is not None), None)


def prefill_chunk(run: RunDescription, serves: str = COLD) -> int:
    """Prompt tokens one step of ``serves``'s server computes: the interference server's
    ``--longctx-max-num-batched-tokens``, else the profile's flag or vLLM's default."""
    if serves == INTERFERENCE and run.settings.max_num_batched_tokens:
        return run.settings.max_num_batched_tokens
    profile = run.plan.profile
    memory = capacity_check.hardware_for(profile).memory_per_device_bytes
    return capacity_check.prefill_chunk_tokens(profile, memory)


def planned_step_s(
    run: RunDescription, records: Sequence[Record], length: int, serves: str = COLD
) -> float | None:
    """The model's time for the last prefill chunk of a ``length``-token prompt, the point's
    slowest step (each chunk attends to all before it), by the TTFT model of ``records``
    (else the profile's); None without a model, or without a profile (an attached server's
    chunk is not known here)."""
    if not run.plan.profile.chosen:
        return None
    known = ttft_model(run.plan.profile, records)
    if known is None or known.model is None:
        return None
    chunk = prefill_chunk(run, serves)
    model = known.model
    step = model(length) - model(length - chunk) if length > chunk else model(length)
    return step if step > 0 else None


def _ranks(profile: Profile) -> int:
    serving = profile.serving
    flags = cache_flags(serving, f"profile {profile.path}")
    return (
        serving.tensor_parallel_size
        * serving.pipeline_parallel_size
        * serving.data_parallel_size
        * flags.prefill_context_parallel_size
    )


def executor(profile: Profile) -> str:
    """The executor vLLM runs the profile's server with."""
    return profile.serving.executor or step_limit.default_executor(_ranks(profile))


def planned_vllm(profile: Profile) -> tuple[str | None, str]:
    """The vLLM the plan is made for (:func:`~pytest_longctx.plan.capacity_check.
    planned_release`: the installed one where it serves the profile's device, else the
    pinned one), and how the plan knows it."""
    try:
        planned = capacity_check.planned_release(profile)
    except UnsupportedRelease:
        return None, "outside the supported releases"
    how = {"installed": "installed here", "pinned": "pinned by the profile"}
    return planned.version, how.get(planned.source, "the embedded default's")


def _server_env(profile: Profile) -> dict[str, str]:
    """The launched server's environment: this session's, then the profile's."""
    return {**os.environ, **profile.serving.env}


def _given(profile: Profile) -> dict[str, tuple[str, str]]:
    """Step-limit variables the user set: the profile's ``[serving.env]`` (which the launch
    passes on) before this session's environment (which the server inherits)."""
    given: dict[str, tuple[str, str]] = {}
    names = (step_limit.EXECUTE_MODEL_TIMEOUT, step_limit.RAY_GET_TIMEOUT)
    for name in names:
        if name in profile.serving.env:
            given[name] = (profile.serving.env[name], f"profile {profile.name}'s [serving.env]")
        elif name in os.environ:
            given[name] = (os.environ[name], "this session's environment")
    return given


def step_limit_decision(
    run: RunDescription, sizing: Sizing, serves: str = COLD
) -> step_limit.StepLimitDecision | None:
    """The longest planned step of the lengths ``sizing`` holds against vLLM's step limit on
    ``serves``'s server; None without a TTFT model (or no length)."""
    length = max(sizing.lengths, default=None)
    step = planned_step_s(run, sizing.records, length, serves) if length else None
    if step is None:
        return None
    profile = run.plan.profile
    version, _ = planned_vllm(profile)
    limits = step_limit.step_limits(version, executor(profile), _server_env(profile))
    margin = FirstTokenBudget().safety_factor
    return step_limit.decide(limits, step, margin, _given(profile))


def launch_env(run: RunDescription, sizing: Sizing, serves: str = COLD) -> dict[str, str]:
    """What the launch adds to the server's environment: vLLM's step limit, raised where
    the longest planned step would exceed it."""
    decision = step_limit_decision(run, sizing, serves)
    return dict(decision.env) if decision is not None else {}


def launch_warnings(run: RunDescription, sizing: Sizing, serves: str = COLD) -> list[str]:
    """An explicit step limit below the longest planned step: kept, and said."""
    decision = step_limit_decision(run, sizing, serves)
    return list(decision.warnings) if decision is not None else []


def plan_lines(run: RunDescription, sizing: Sizing) -> list[str]:
    """What ``--longctx-plan`` says of budgets: each selected length's first-token budget
    before this session measures anything (and where it comes from), and the longest planned
    engine step against vLLM's own step limit."""
    lengths = sorted({p.length for p in sizing.points})
    profile = run.plan.profile
    lines = [
        "first-token budget per length, before this session measures one at or below it "
        "(then grown from that measurement):"
    ]
    for each in known_ttft(profile, sizing.records):
        if isinstance(each.model, TtftModel):
            lines.append(f"  {each.model_text}: {each.model.describe()}")
    defaults = 0
    for length in lengths:
        seconds, why = first_token_budget(run, sizing.records, {}, length)
        took = f"{seconds:,.0f} s ({format_duration(seconds)})"
        lines.append(f"  {format_size(length)}: {took}: {why}")
        defaults += why.startswith("default of")
    if defaults and run.plan.profile.chosen:
        lines.append(
            f"  {defaults} length(s) wait the profile's first_token_timeout_s, whatever they "
            f"take: profile {run.plan.profile.name}'s [sweep] expected_ttft (seconds by length, "
            "e.g. a study's) or --longctx-ttft-timeout gives them a budget that fits"
        )
    if not profile.chosen:  # attached without a profile: its serving is the server's
        return lines
    longest = max(sizing.lengths, default=None)
    known = ttft_model(profile, sizing.records)
    step = planned_step_s(run, sizing.records, longest) if longest else None
    version, whence = planned_vllm(profile)
    where = f"vLLM {version} ({whence})" if version else f"vLLM of unknown version ({whence})"
    run_by = f"{where}, {executor(profile)} executor"
    limits = step_limit.step_limits(version, executor(profile), _server_env(profile))
    if not limits:
        lines.append(f"vLLM's step limit: none under {run_by} (one process sets no limit)")
        return lines
    if step is None or known is None or longest is None:
        names = ", ".join(f"{limit.variable} ({limit.default_s} s)" for limit in limits)
        lines.append(
            f"vLLM's step limit ({run_by}): {names}; the longest engine step is unknown (no "
            "record of this run and no [sweep] expected_ttft to model TTFT by): left as it is"
        )
        return lines
    chunk = prefill_chunk(run)
    lines.append(
        f"longest planned engine step: {step:,.1f} s, the last {chunk:,}-token prefill chunk "
        f"at {format_size(longest)} ({known.model_text}); under {run_by}:"
    )
    decision = step_limit_decision(run, sizing)
    assert decision is not None
    if run.settings.url:  # nothing is launched: the attached server keeps its own limit
        lines += [
            f"  attached, nothing is raised here: start the server with {variable}={value} or "
            f"more (its engine dies in a step longer than {variable}, 300 s unless set)"
            for variable, value in decision.env.items()
        ]
        lines += [f"  {said}" for said in decision.said if " raised to " not in said]
    else:
        lines += [f"  {said}" for said in decision.said]
    lines += [f"  WARNING: {warning}" for warning in decision.warnings]
    return lines
