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

:data:`VLLM_STEP_LIMITS` holds these facts per release, each with the file and line of vLLM's
source (paths under ``vllm/``) that says it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

#: The multiprocessing executor's wait for one step's answer, in whole seconds.
EXECUTE_MODEL_TIMEOUT = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
#: Ray compiled graphs' wait for one execution's result, in whole seconds.
RAY_GET_TIMEOUT = "RAY_CGRAPH_get_timeout"
#: 0.25.1..0.32.0: "0" runs Ray's compiled-graph executor instead of ``RayExecutorV2``.
RAY_V2_SWITCH = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"


@dataclass(frozen=True)
class ReleaseStepLimit:
    """What one vLLM release does with a long step, and where its source says so."""

    #: ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` when unset, and the lines that read and apply it.
    execute_model_timeout_s: int
    execute_model_timeout_at: str
    #: The executor vLLM picks when none is given: ``mp`` past one rank, ``uni`` for one.
    default_executor_at: str
    #: ``uni`` takes a timeout argument and never uses it.
    uni_unbounded_at: str
    #: Whether ``--distributed-executor-backend ray`` runs ``RayExecutorV2`` (the
    #: multiprocessing executor's wait) when ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND`` is unset; None:
    #: it always does (the switch is gone).
    ray_v2_by_default: bool | None
    ray_executor_at: str
    #: ``RAY_CGRAPH_get_timeout`` as vLLM sets it for the compiled-graph executor (None: that
    #: executor is gone).
    ray_get_timeout_s: int | None = None
    ray_get_timeout_at: str | None = None


#: The step limit of each supported vLLM release, read from its published source.
VLLM_STEP_LIMITS: Mapping[str, ReleaseStepLimit] = {
    "0.25.1": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:214, envs.py:1630-1631; v1/executor/multiproc_executor.py:315 "
            "(execute_model), :327 (sample_tokens), :389 (TimeoutError); "
            "v1/engine/core.py:1233 (fatal error)"
        ),
        default_executor_at="config/parallel.py:871-877 (mp), :915-916 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:79-82",
        ray_v2_by_default=True,
        ray_executor_at=(
            "v1/executor/abstract.py:60-68; envs.py:868-869 (default 1); "
            "v1/executor/ray_executor_v2.py:219"
        ),
        ray_get_timeout_s=300,
        ray_get_timeout_at="v1/executor/ray_executor.py:537",
    ),
    "0.28.0": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:239, envs.py:1771-1772; v1/executor/multiproc_executor.py:345 "
            "(execute_model), :358 (sample_tokens), :432 (TimeoutError); "
            "v1/engine/core.py:1348 (fatal error)"
        ),
        default_executor_at="config/parallel.py:911-917 (mp), :955-956 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:90-93",
        ray_v2_by_default=True,
        ray_executor_at=(
            "v1/executor/abstract.py:61-69; envs.py:918-919 (default 1); "
            "v1/executor/ray_executor_v2.py:219"
        ),
        ray_get_timeout_s=300,
        ray_get_timeout_at="v1/executor/ray_executor.py:550",
    ),
    "0.29.0": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:241, envs.py:1766-1767; v1/executor/multiproc_executor.py:348 "
            "(execute_model), :361 (sample_tokens), :435 (TimeoutError); "
            "v1/engine/core.py:1376 (fatal error)"
        ),
        default_executor_at="config/parallel.py:943-949 (mp), :987-988 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:90-93",
        ray_v2_by_default=True,
        ray_executor_at=(
            "v1/executor/abstract.py:61-69; envs.py:916-917 (default 1); "
            "v1/executor/ray_executor_v2.py:237"
        ),
        ray_get_timeout_s=300,
        ray_get_timeout_at="v1/executor/ray_executor.py:554",
    ),
    "0.32.0": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:252, envs.py:1872-1873; v1/executor/multiproc_executor.py:349 "
            "(execute_model), :362 (sample_tokens), :442 (TimeoutError); "
            "v1/engine/core.py:1512 (fatal error)"
        ),
        default_executor_at="config/parallel.py:1035-1041 (mp), :1079-1080 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:90-93",
        ray_v2_by_default=True,
        ray_executor_at=(
            "v1/executor/abstract.py:77-85; envs.py:944-945 (default 1); "
            "v1/executor/ray_executor_v2.py:239"
        ),
        ray_get_timeout_s=300,
        ray_get_timeout_at="v1/executor/ray_executor.py:553",
    ),
    "0.33.0": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:252, envs.py:1863-1864; v1/executor/multiproc_executor.py:414 "
            "(execute_model), :427 (sample_tokens), :509 (TimeoutError); "
            "v1/engine/core.py:1586 (fatal error)"
        ),
        default_executor_at="config/parallel.py:1054-1060 (mp), :1098-1099 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:90-93",
        ray_v2_by_default=None,
        ray_executor_at="v1/executor/abstract.py:76-79; v1/executor/ray_executor_v2.py:239",
    ),
    "0.34.0": ReleaseStepLimit(
        execute_model_timeout_s=300,
        execute_model_timeout_at=(
            "envs.py:263, envs.py:1972-1973; v1/executor/multiproc_executor.py:438 "
            "(execute_model), :451 (sample_tokens), :533 (TimeoutError); "
            "v1/engine/core.py:1759 (fatal error)"
        ),
        default_executor_at="config/parallel.py:1147-1153 (mp), :1191-1192 (uni)",
        uni_unbounded_at="v1/executor/uniproc_executor.py:90-93",
        ray_v2_by_default=None,
        ray_executor_at="v1/executor/abstract.py:77-80; v1/executor/ray_executor_v2.py:239",
    ),
}


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


def release_facts(version: str | None) -> tuple[str, ReleaseStepLimit] | None:
    """The table's release for ``version`` (a local build such as ``0.32.0+cpu`` is its
    release; one between two tabulated releases behaves as the earlier); None when unknown or
    older than every release in the table."""
    if not version:
        return None
    try:
        wanted = Version(Version(version).public)
    except InvalidVersion:
        return None
    known = sorted(VLLM_STEP_LIMITS, key=Version)
    earlier = [name for name in known if Version(name) <= wanted]
    if not earlier:
        return None
    return earlier[-1], VLLM_STEP_LIMITS[earlier[-1]]


def step_limits(
    version: str | None, executor: str, env: Mapping[str, str]
) -> tuple[StepLimit, ...]:
    """The variables that bound one engine step of ``executor`` under vLLM ``version``
    (``env``: the server's environment, which may switch Ray's executor). With the version
    unknown, every variable that may apply."""
    found = release_facts(version)
    if executor not in ("mp", "ray"):
        return ()  # uni, external_launcher (a uni executor) or a class of the user's own
    if found is None:
        where = "vLLM's multiprocessing executor (version unknown)"
        limits = [StepLimit(EXECUTE_MODEL_TIMEOUT, 300, where)]
        if executor == "ray":
            ray = "Ray's compiled-graph executor (version unknown)"
            limits.append(StepLimit(RAY_GET_TIMEOUT, 300, ray))
        return tuple(limits)
    name, facts = found
    multiproc = StepLimit(
        EXECUTE_MODEL_TIMEOUT,
        facts.execute_model_timeout_s,
        f"vLLM {name}'s multiprocessing executor ({facts.execute_model_timeout_at})",
    )
    if executor == "mp":
        return (multiproc,)
    if facts.ray_v2_by_default is None:
        return (
            StepLimit(
                multiproc.variable,
                multiproc.default_s,
                f"vLLM {name}'s Ray executor, a multiprocessing one ({facts.ray_executor_at}; "
                f"{facts.execute_model_timeout_at})",
            ),
        )
    if _switched_on(env.get(RAY_V2_SWITCH), facts.ray_v2_by_default) or (
        facts.ray_get_timeout_s is None
    ):
        return (
            StepLimit(
                multiproc.variable,
                multiproc.default_s,
                f"vLLM {name}'s RayExecutorV2, a multiprocessing executor ({facts.ray_executor_at}"
                f"; {facts.execute_model_timeout_at})",
            ),
        )
    return (
        StepLimit(
            RAY_GET_TIMEOUT,
            facts.ray_get_timeout_s,
            f"vLLM {name}'s Ray compiled-graph executor ({RAY_V2_SWITCH}=0; "
            f"{facts.ray_get_timeout_at})",
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
