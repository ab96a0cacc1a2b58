"""The measured server as the session plans and checks it: where its model is, its launch
command (and the plan's description of it), its fingerprint, and the check that every server
of a run measures the same thing. Starting and stopping it is :mod:`lifecycle`'s.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Collection, Sequence
from typing import Any

import httpx

from pytest_longctx.campaign import budgets
from pytest_longctx.campaign.api_key import API_KEY_ENV_FOR_VLLM, api_key, api_key_env_name
from pytest_longctx.campaign.hooks import CampaignHooks
from pytest_longctx.campaign.run import RecordLog, RunDescription, Sizing
from pytest_longctx.client import RequestRejectedError
from pytest_longctx.core.file_names import MEASURED_BY_FILE
from pytest_longctx.core.files import exclusive_lock, write_atomically
from pytest_longctx.gate import fingerprint_mismatch
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import Point, SweepPlan
from pytest_longctx.plan.servers import devices_note, visible_devices
from pytest_longctx.profiles import Profile, hardware
from pytest_longctx.profiles.vllm_releases import PlannedRelease, UnsupportedRelease
from pytest_longctx.progress import telemetry
from pytest_longctx.serving.model_description import ModelDescription
from pytest_longctx.serving.vllm_command import (
    FlagCheck,
    FlagError,
    ServerCommand,
    build_server_command,
    check_flags,
    cluster_commands,
    engine_ready_note,
    redact_env,
    serve_args,
)
from pytest_longctx.workloads import (
    REGISTERED,
    STUDY_SERVER,
    ServerNeeds,
    named,
    planned,
    served_by,
    server_for,
    sized_for,
)


def model_location(profile: Profile, build: bool) -> str:
    """A local folder for embedded models (built on first use), else the hub id."""
    name = profile.model.embedded_name
    if name is None:
        return profile.model.source
    if build:
        from pytest_longctx.serving.embedded import ensure_embedded_model

        return str(ensure_embedded_model(name))
    from pytest_longctx.profiles.embedded_models import default_models_dir, get_spec

    return str(default_models_dir() / get_spec(name).folder_name)


def tokenizer_location(profile: Profile, build: bool) -> str:
    return profile.model.tokenizer or model_location(profile, build)


def max_model_len(plan: SweepPlan, sizing: Sizing) -> int:
    """``--max-model-len`` for the lengths ``sizing`` holds: room for a follow-up's suffix only
    where a warm point is selected."""
    return sized_for(plan, sizing.points).max_model_len(sizing.lengths or None)


def server_command(
    hooks: CampaignHooks,
    run: RunDescription,
    sizing: Sizing,
    port: int,
    build: bool,
    serves: str = STUDY_SERVER,
) -> ServerCommand:
    """:func:`checked_command`; a :class:`FlagError` when the installed vLLM does not accept
    a flag the profile, an option or a hook asked for."""
    command, check = checked_command(hooks, run, sizing, port, build, serves)
    problem = check.problem() if check else None
    if problem:
        raise FlagError(f"profile {run.plan.profile.name}: {problem}")
    return command


def checked_command(
    hooks: CampaignHooks,
    run: RunDescription,
    sizing: Sizing,
    port: int,
    build: bool,
    serves: str = STUDY_SERVER,
) -> tuple[ServerCommand, FlagCheck | None]:
    """The launch command as the planned vLLM release accepts it, and what was said (by the
    installed parser, or the release's published options; None: not checked, see
    :func:`check_flags`). The one command both the plan prints and a launch runs."""
    command = planned_command(hooks, run, sizing, port, build, serves)
    return check_flags(command, planned=planned_release(run))


def planned_release(run: RunDescription) -> PlannedRelease | None:
    """The release a launch of ``run`` is planned for; None for an attached server (its own
    version is read when it answers) or one outside the supported range (refused before)."""
    if run.settings.url:
        return None
    try:
        return capacity_check.planned_release(run.plan.profile)
    except UnsupportedRelease:
        return None


def planned_command(
    hooks: CampaignHooks,
    run: RunDescription,
    sizing: Sizing,
    port: int,
    build: bool,
    serves: str = STUDY_SERVER,
) -> ServerCommand:
    """The launch command for the server of ``serves`` (the study's, or a workload's own):
    what the workloads it serves need (:meth:`Workload.server_needs`: room for their requests
    at once, usage that says what the cache served, a chunk, ``/server_info``). vLLM's step
    limit is raised in its environment where the longest planned step would exceed it
    (:mod:`budgets`)."""
    profile = run.plan.profile
    needs = server_needs(run, sizing, serves)
    seqs = profile.serving.max_num_seqs
    command = build_server_command(
        profile,
        model_path=model_location(profile, build),
        tokenizer_path=profile.model.tokenizer,
        max_model_len=max_model_len(run.plan, sizing),
        port=port,
        python=sys.executable,
        prompt_tokens_details=needs.usage_details,
        sse_keep_alive_s=run.settings.sse_keep_alive_s,
        max_num_seqs=max(seqs, needs.room) if needs.room and seqs is not None else None,
        max_num_batched_tokens=needs.max_num_batched_tokens,
        server_info=needs.server_info,
    )
    limit = budgets.launch_env(run, sizing, serves)  # vLLM's step limit, where a step exceeds it
    if limit:
        command = ServerCommand(command.argv, {**limit, **command.env})
    key = api_key(run)
    if key:
        command = ServerCommand(command.argv, {**command.env, API_KEY_ENV_FOR_VLLM: key})
    slot = run.placement.slot
    if slot.env:  # this worker's own devices or cores
        command = ServerCommand(command.argv, {**command.env, **slot.env})
    return hooks.server_command(run.plan, command) or command


def describe_server(hooks: CampaignHooks, run: RunDescription, sizing: Sizing) -> str:
    """What ``--longctx-plan`` says of the servers: each launch command and its flags' check,
    or the URLs attached to."""
    servers = run.placement.servers
    if len(servers) > 1:
        lines = [f"{len(servers)} servers, one per pytest-xdist worker, each measured alone:"]
        lines += [f"  {slot.describe()}" for slot in servers]
        if not run.settings.url:
            lines.append(
                "  each launched server gets the profile's own KV budget and the capacity "
                "plan below (which is per server)"
            )
    else:
        lines = []
    note = None if run.settings.url else devices_note(run.plan.profile, servers, os.environ)
    if note:
        lines.append(note)
    if run.settings.url:
        endpoints = ", ".join(run.settings.urls)
        lines.append(f"server: attach to {endpoints} (model and max_model_len from /v1/models)")
        return "\n".join(lines)
    serves = first_workload(run.plan, sizing.points, ())
    command, check = checked_command(hooks, run, sizing, port=0, build=False, serves=serves)
    pinned = run.plan.profile.serving.expected_versions.get("vllm")
    if check is not None:
        flags = check.describe(pinned)
    elif serve_args(command.argv) is None:
        flags = "flags not checked: the server command does not start vLLM"
    else:
        flags = "flags not checked: no supported vLLM release is planned"
    cluster = cluster_commands(run.plan.profile, command)
    if cluster:
        hardware, serving = run.plan.profile.hardware, run.plan.profile.serving
        lines.append(
            f"one server over {hardware.nodes} nodes x {hardware.devices} devices (Ray "
            f"executor; tensor parallel {serving.tensor_parallel_size} x pipeline parallel "
            f"{serving.pipeline_parallel_size}):"
        )
        lines += [f"  {where}:\n    {line}" for where, line in cluster]
        lines.append(flags)
        return "\n".join(lines)
    lines.append("server command (port chosen at start):\n  " + command.shell_line())
    lines.append(flags)
    ready = engine_ready_note(run.plan.profile)
    if ready:
        lines.append(ready)
    first = named(serves).schedule_rank
    for workload in REGISTERED:  # the servers started after the first, for their workloads
        if workload.server != workload.name or workload.schedule_rank <= first:
            continue
        if not workload.planned(run.plan):
            continue
        own, own_check = checked_command(
            hooks, run, sizing, port=0, build=False, serves=workload.server
        )
        lines.append(
            f"then, for the {workload.name} points, a server with "
            f"{workload.server_words(run)} (port chosen at start):\n  " + own.shell_line()
        )
        if own_check is not None:
            lines.append(own_check.describe())
    return "\n".join(lines)


def server_needs(run: RunDescription, sizing: Sizing, serves: str) -> ServerNeeds:
    """What the workloads ``serves``'s server runs ask of it, together (the study's server:
    the cold points' and, where a follow-up is selected, the warm ones')."""
    sized = sized_for(run.plan, sizing.points)
    each = [workload.server_needs(run, sized) for workload in served_by(serves, run.plan)]
    rooms = [needs.room for needs in each if needs.room]
    chunks = [needs.max_num_batched_tokens for needs in each if needs.max_num_batched_tokens]
    return ServerNeeds(
        room=max(rooms, default=None),
        usage_details=any(needs.usage_details for needs in each),
        max_num_batched_tokens=chunks[0] if chunks else None,
        server_info=any(needs.server_info for needs in each),
    )


def first_workload(plan: SweepPlan, selected: Sequence[Point], resumed: Collection[Point]) -> str:
    """The server the session starts first: the study's while any cold or warm point of those
    ``selected`` is left to measure (not ``resumed``), else the one server the points left
    run on."""
    left = [p for p in selected if p not in resumed] or list(selected)
    return server_for(left)


def refused(run: RunDescription, base_url: str, exc: RequestRejectedError) -> ServerError:
    """401/403: one error that names where the key comes from."""
    name = api_key_env_name(run)
    if name is None:
        return ServerError(
            f"the server at {base_url} refused the request (HTTP {exc.status_code}): it wants an "
            "API key; name the environment variable holding it with --longctx-api-key-env=VAR"
        )
    return ServerError(
        f"the server at {base_url} refused the API key from ${name} (HTTP {exc.status_code}): "
        f"check the key in {name}"
    )


def device_scope(run: RunDescription) -> telemetry.DeviceScope:
    """The devices this session's server runs on, for its telemetry: what its environment
    gives it (this process's, the profile's, its slot's on top), read as its platform reads
    it (``HIP_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES`` within an inherited
    ``ROCR_VISIBLE_DEVICES`` on ROCm; none: every device; an attached server's are not
    known), and the nodes the profile spans."""
    profile = run.plan.profile
    slot_env = run.placement.slot.env
    environ = {} if run.settings.url else {**os.environ, **profile.serving.env, **slot_env}
    seen = visible_devices(profile.serving.device, environ)
    spans = profile.hardware
    return telemetry.DeviceScope(
        seen.ids or (),
        seen.variable or seen.rule.variables[0],
        spans.nodes,
        spans.devices,
        beneath=seen.beneath or (),
        beneath_variable=seen.rule.beneath or "ROCR_VISIBLE_DEVICES",
    )


def fingerprint(
    hooks: CampaignHooks,
    run: RunDescription,
    model: ModelDescription,
    info: ServerInfo,
    launched: bool,
) -> dict[str, Any]:
    """What was measured (``model``: as the lifecycle described it); the gate refuses to
    compare runs whose fingerprints differ. ``launched``: this session launched the server
    (it was not attached)."""
    profile = run.plan.profile
    plan: SweepPlan = run.plan
    result: dict[str, Any] = {
        "profile": profile.name if profile.chosen else None,
        **model.fingerprint(),
        "served_model_name": info.model_name,
        "model_root": info.model_root,
        "vllm_version": info.engine_version,
        "torch_version": hardware.package_version("torch") if info.mode == "launched" else None,
        "expected_versions": dict(profile.serving.expected_versions),
        # what the launched server ran with, read on this node (vLLM, AITER, torch, ROCm)
        "node_versions": hardware.node_versions() if info.mode == "launched" else {},
        "server_mode": info.mode,
        "server_url": info.base_url,
        "server_command": list(info.command.argv) if info.command else None,
        "server_env": redact_env(info.command.env) if info.command else None,
        "max_model_len": info.max_model_len,
        "decode_tokens": plan.decode_tokens,
        "prompt_format": run.settings.prompt_format,
        "unverified_points_allowed": run.settings.allow_unverified,
        "seed": run.settings.seed,
        "command_line": list(hooks.command_line),
        "hardware": (
            _server_hardware(run, launched)
            if info.mode == "launched" or _is_local(info.base_url)
            else {}
        ),
        "server": _server_identity(run, info),
    }
    if profile.from_server is not None:  # attached without a profile: the server's and generic
        result["settings"] = profile.from_server.record()
    words = {key: value for w in planned(plan) for key, value in w.fingerprint(run).items()}
    if words:  # what the workloads beyond the cold points measure; a cold-only run has none
        result["workload"] = {"cache_states": list(plan.workloads), **words}
    hooks.fingerprint(result)
    return result


def _server_hardware(run: RunDescription, launched: bool) -> dict[str, Any]:
    """The host, narrowed to the cores or devices this worker's server was given."""
    host = hardware.describe_host()
    slot = run.placement.slot
    if slot.cores:
        host["server_cores"] = len(slot.cores)
    if slot.devices:
        host["server_devices"] = list(slot.devices)
        host["gpu_count"] = len(slot.devices)
    elif host.get("gpu_count") and launched and run.plan.profile.serving.device != "cpu":
        # The devices the server uses, as a worker's slot would say: its parallel ranks.
        serving = run.plan.profile.serving
        ranks = serving.tensor_parallel_size * serving.pipeline_parallel_size
        host["gpu_count"] = min(host["gpu_count"], ranks * serving.data_parallel_size)
    return host


def _server_identity(run: RunDescription, info: ServerInfo) -> dict[str, Any]:
    """Which server measured a point: the worker, the endpoint and what it was given."""
    slot = run.placement.slot
    identity: dict[str, Any] = {"slot": slot.index, "endpoint": info.base_url}
    if run.placement.worker:
        identity["worker"] = run.placement.worker
    if slot.cores:
        identity["cores"] = list(slot.cores)
    if slot.devices:
        identity["devices"] = list(slot.devices)
    return identity


def check_same_servers(
    run: RunDescription, results: RecordLog, fingerprint: dict[str, Any]
) -> None:
    """Refuse a server unlike those that already measured points of this run.

    The first server to come up (or the run's earlier records, when resumed) sets what the
    run measures; a server with another model, vLLM version or hardware would mix setups in
    one table. ``--longctx-allow-mixed-servers`` keeps them, and the reports say so.
    """
    results.open()
    path = run.run_dir / MEASURED_BY_FILE
    with exclusive_lock(run.run_dir / ".measured-by.lock"):
        try:
            known = json.loads(path.read_text()) if path.exists() else []
        except ValueError:
            known = []
        others = [(entry.get("server", {}), entry) for entry in known]
        others += [
            (record.fingerprint.get("server", {}), record.fingerprint)
            for record in results.all_records()
            if record.outcome == "passed" and record.fingerprint
        ]
        if not run.settings.allow_mixed_servers:
            for server, other in others:
                differences = fingerprint_mismatch(other, fingerprint)
                if differences:
                    where = server.get("endpoint") or "an earlier server of this run"
                    endpoint = fingerprint["server"]["endpoint"]
                    raise ServerError(
                        f"this server ({endpoint}) differs from "
                        f"{where}, which measured this run:\n  "
                        + "\n  ".join(differences)
                        + "\nrun each setup as its own run, or pass "
                        "--longctx-allow-mixed-servers to keep both in one"
                    )
        known.append(fingerprint)
        write_atomically(path, json.dumps(known, indent=2, default=str) + "\n")


def _is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("localhost", "::1") or host.startswith("127.")
