"""vLLM's own limit on one engine step, per supported release, as its source says.

An engine step that outlasts the limit kills the engine, whatever the client waits for: the
multiprocessing executor waits ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s unless set) for
its workers' answer to ``execute_model`` and raises ``TimeoutError("RPC call to execute_model
timed out.")``, which the engine core logs as "EngineCore encountered a fatal error." before it
tells the API server it is dead. Ray's executor is that one too (``RayExecutorV2`` is a
``MultiprocExecutor``), except in 0.25.1..0.32.0 with ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``,
where the compiled-graph executor waits ``RAY_CGRAPH_get_timeout`` (vLLM sets 300 s where it is
unset). The one-process executor (``uni``, vLLM's choice for a single rank) sets no limit. One
prefill chunk over the longest context is the longest step a sweep asks for: at 64Mi a chunk of
256Ki tokens takes about 317 s at the reference study's speed.

Which release reads which variable, and its default, is the release table's
(:mod:`pytest_longctx.profiles.vllm_releases`), checked against each release's source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_longctx.profiles import vllm_releases

#: The multiprocessing executor's wait for one step's answer, in whole seconds.
EXECUTE_MODEL_TIMEOUT = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
#: Ray compiled graphs' wait for one execution's result, in whole seconds.
RAY_GET_TIMEOUT = "RAY_CGRAPH_get_timeout"
#: 0.25.1..0.32.0: "0" runs Ray's compiled-graph executor instead of ``RayExecutorV2``.
RAY_V2_SWITCH = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"


@dataclass(frozen=True)
class StepLimit:
    """One variable that bounds an engine step, its value when unset, and where it applies."""

    variable: str
    default_s: int
    where: str


def default_executor(ranks: int) -> str:
    """vLLM's choice where ``--distributed-executor-backend`` is not given: ``mp`` past one
    rank (tensor x pipeline x prefill-context x data parallel; ``ray`` only inside a Ray
    placement group), ``uni`` for one."""
    return "mp" if ranks > 1 else "uni"


#: Where each executor waits for a step, in vLLM's source (paths under ``vllm/``).
MULTIPROC_AT = "v1/executor/multiproc_executor.py, envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
RAY_V2_AT = "v1/executor/ray_executor_v2.py: RayExecutorV2 is a MultiprocExecutor"
RAY_CGRAPH_AT = "v1/executor/ray_executor.py: RAY_CGRAPH_get_timeout set where unset"


def step_limits(
    version: str | None, executor: str, env: Mapping[str, str]
) -> tuple[StepLimit, ...]:
    """The variables that bound one engine step of ``executor`` under vLLM ``version``
    (``env``: the server's environment, which may switch Ray's executor). With the version
    unknown (or outside the supported range), every variable that may apply."""
    row = vllm_releases.row_for(version) if version else None
    if executor not in ("mp", "ray"):
        return ()  # uni, external_launcher (a uni executor) or a class of the user's own
    if row is None:
        where = "vLLM's multiprocessing executor (version unknown)"
        limits = [StepLimit(EXECUTE_MODEL_TIMEOUT, 300, where)]
        if executor == "ray":
            ray = "Ray's compiled-graph executor (version unknown)"
            limits.append(StepLimit(RAY_GET_TIMEOUT, 300, ray))
        return tuple(limits)
    name = row.version
    default_s = int(row.env_defaults[EXECUTE_MODEL_TIMEOUT] or 300)
    multiproc = StepLimit(
        EXECUTE_MODEL_TIMEOUT, default_s, f"vLLM {name}'s multiprocessing executor ({MULTIPROC_AT})"
    )
    if executor == "mp":
        return (multiproc,)
    switch = row.env_defaults.get(RAY_V2_SWITCH)
    if switch is None or row.ray_cgraph_get_timeout_s is None:  # 0.33.0 on: always V2
        return (
            StepLimit(
                multiproc.variable,
                multiproc.default_s,
                f"vLLM {name}'s Ray executor, a multiprocessing one ({RAY_V2_AT}; {MULTIPROC_AT})",
            ),
        )
    if _switched_on(env.get(RAY_V2_SWITCH), _switched_on(switch, True)):
        return (
            StepLimit(
                multiproc.variable,
                multiproc.default_s,
                f"vLLM {name}'s RayExecutorV2, a multiprocessing executor ({RAY_V2_AT}; "
                f"{MULTIPROC_AT})",
            ),
        )
    return (
        StepLimit(
            RAY_GET_TIMEOUT,
            row.ray_cgraph_get_timeout_s,
            f"vLLM {name}'s Ray compiled-graph executor ({RAY_V2_SWITCH}=0; {RAY_CGRAPH_AT})",
        ),
    )


def _switched_on(value: str | None, default: bool) -> bool:
    """A switch as vLLM reads it (``bool(int(value))``); unset or unreadable: ``default``."""
    if value is None:
        return default
    try:
        return bool(int(value))
    except ValueError:
        return default


@dataclass(frozen=True)
class StepLimitDecision:
    """What the launch adds to the server's environment, and what the plan says of it."""

    env: Mapping[str, str]
    said: tuple[str, ...]
    #: An explicit limit below the longest planned step: kept, and warned of.
    warnings: tuple[str, ...] = ()


def decide(
    limits: tuple[StepLimit, ...],
    step_s: float,
    margin: float,
    given: Mapping[str, tuple[str, str]],
) -> StepLimitDecision:
    """Each limit against the longest planned step ``step_s``: raised to ``margin`` times it
    (whole seconds, as vLLM and Ray read them) where the step would exceed the default; an
    explicit value (``given``: variable -> (value, where it was set)) is kept, and warned of
    where the step exceeds it."""
    env: dict[str, str] = {}
    said: list[str] = []
    warnings: list[str] = []
    for limit in limits:
        if limit.variable in given:
            value, where = given[limit.variable]
            try:
                seconds: float | None = float(value)
            except ValueError:
                seconds = None
            if seconds is not None and step_s <= seconds:
                said.append(
                    f"{limit.variable}={value} ({where}) holds the longest planned step "
                    f"({step_s:,.1f} s)"
                )
                continue
            warnings.append(
                f"{limit.variable}={value} ({where}) is below the longest planned step "
                f"({step_s:,.1f} s): {limit.where} kills its engine when a step outlasts it; "
                f"the value is kept as set (raise it to {math.ceil(margin * step_s)} or unset it)"
            )
            continue
        if step_s <= limit.default_s:
            said.append(
                f"{limit.variable} ({limit.default_s} s unless set) holds the longest planned "
                f"step ({step_s:,.1f} s): left as it is"
            )
            continue
        raised = math.ceil(margin * step_s)
        env[limit.variable] = str(raised)
        said.append(
            f"{limit.variable} raised to {raised} s in the server's environment: the longest "
            f"planned step ({step_s:,.1f} s) outlasts its {limit.default_s} s, after which "
            f"{limit.where} kills its engine"
        )
    return StepLimitDecision(env, tuple(said), tuple(warnings))
