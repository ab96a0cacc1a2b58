"""Which profile a session measures with, and what an attached server gives one that chose none.

The profile the user names (``--longctx-profile`` or the ini file's ``longctx_profile``) is
used as given. Without one, a launched server is the embedded default's (cpu-tiny). An attached
server is measured with its own settings (the model it serves, the range its max_model_len
holds, its KV block) and the generic defaults (a profile's that sets nothing), named as such in
the plan and the records: never the embedded default's, whose 32 decode tokens, first-token
budget and gate tolerances are a CPU toy's.

The server is asked when the session is configured, before its points exist, so one that is
not up yet leaves the generic range (the plan says so) and its points fail as its absence makes
them. The HTTP client is imported only here, for such a session.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from pytest_longctx.core.sizes import format_size, powers_of_two_between
from pytest_longctx.plan.points import WARM, PlanError
from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles import (
    DEFAULT_PROFILE,
    FROM_SERVER,
    Profile,
    ServerSettings,
    SweepSpec,
    from_server,
    load_profile,
)

#: How long the plan waits for an attached server's ``/v1/models`` and ``/metrics``.
ASK_TIMEOUT_S = 10.0
#: The generic defaults: what a profile that sets nothing gets.
GENERIC = SweepSpec()
GENERIC_TOLERANCE = "the gate's built-in tolerances"


def session_profile(settings: Settings, asked: Mapping[str, Any] | None = None) -> Profile:
    """The chosen profile; else the embedded default, or an attached server's settings
    (``asked``: what the server already told the controller of this pytest-xdist run)."""
    if settings.profile is not None:
        return load_profile(settings.profile)
    if not settings.urls:
        return load_profile(DEFAULT_PROFILE)
    if asked is not None:
        return profile_of_server(settings, ServerSettings(**asked))
    key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
    return profile_of_server(settings, ask_server(settings.urls[0], key))


def ask_server(url: str, api_key: str | None) -> ServerSettings:
    """What the server says of itself: ``/v1/models`` and ``/metrics``'
    ``vllm:cache_config_info``; what it does not say stays unknown."""
    from pytest_longctx.client import MeasurementError
    from pytest_longctx.measure.server_metrics import (
        cache_config_labels,
        kv_capacity_tokens,
        kv_num_blocks,
    )
    from pytest_longctx.serving.process import control_client

    with control_client(url, api_key, ASK_TIMEOUT_S) as client:
        try:
            served = client.models()
        except MeasurementError as exc:
            return ServerSettings(url, unanswered=" ".join(str(exc).split()))
        try:
            labels = cache_config_labels(client.metrics_text()) or {}
        except (MeasurementError, ValueError):
            labels = {}
    block = labels.get("block_size", "")
    return ServerSettings(
        url,
        model=served.id,
        model_root=served.root,
        max_model_len=served.max_model_len,
        block_size=int(block) if block.isdigit() else None,
        cache_dtype=labels.get("cache_dtype") or None,
        kv_cache_tokens=kv_capacity_tokens(labels),
        kv_cache_blocks=kv_num_blocks(labels),
    )


def profile_of_server(settings: Settings, server: ServerSettings) -> Profile:
    """The server's settings, the generic defaults for what no option sets, and the range up
    to the largest length its max_model_len holds with the decode (and a warm suffix)."""
    decode = settings.decode_tokens or GENERIC.decode_tokens
    after_prefix = decode + (settings.warm_suffix if WARM in settings.workload else 0)
    low = settings.from_length or GENERIC.from_length
    top = None
    if settings.to_length is None and server.max_model_len is not None:
        room = server.max_model_len - after_prefix
        if not powers_of_two_between(low, max(room, 0)):
            raise PlanError(
                f"--longctx-url={server.url} (no profile): the server serves at most "
                f"{server.max_model_len:,} tokens (max_model_len), which holds no prompt of "
                f"{format_size(low)} or more with {after_prefix} tokens after it; serve it with "
                "a larger --max-model-len, or give --longctx-from/--longctx-to or a profile "
                "(--longctx-profile)"
            )
        top = 1 << (room.bit_length() - 1)
    # what no option sets, and the server does not say, is the generic default
    top_said = settings.to_length or top
    generic = {
        name: value
        for name, value, given in (
            ("from_length", GENERIC.from_length, settings.from_length),
            ("to_length", GENERIC.to_length, top_said),
            ("decode_tokens", GENERIC.decode_tokens, settings.decode_tokens),
            ("warmup_prompts", GENERIC.warmup_prompts, settings.warmup_prompts),
            ("first_token_timeout_s", GENERIC.first_token_timeout_s, settings.ttft_timeout_s),
            ("tolerance", GENERIC_TOLERANCE, settings.tolerance),
        )
        if given is None
    }
    server = dataclasses.replace(server, generic_defaults=generic)
    return from_server(server, describe(server, top), top)


def describe(server: ServerSettings, top: int | None) -> str:
    """The profile's description: where each setting came from, for the plan and the header."""
    if server.unanswered is not None:
        said = (
            f"attached, no profile: the server at {server.url} did not answer /v1/models when "
            f"the plan was made ({server.unanswered})"
        )
    else:
        facts = [
            f"model {server.model}",
            "max_model_len "
            + (f"{server.max_model_len:,}" if server.max_model_len is not None else "not said"),
        ]
        if server.block_size is not None:
            facts.append(f"block size {server.block_size}")
        said = f"{FROM_SERVER} at {server.url} ({', '.join(facts)})"
        if top is not None:
            said += f": lengths up to {format_size(top)}"
    words: dict[str, Callable[[Any], str]] = {
        "from_length": lambda v: f"lengths from {format_size(v)}",
        "to_length": lambda v: f"lengths up to {format_size(v)}",
        "decode_tokens": lambda v: f"{v} decode tokens",
        "warmup_prompts": lambda v: f"{v} warm-up prompts",
        "first_token_timeout_s": lambda v: (
            f"a first-token budget of {_duration(v)} until a length is measured"
        ),
        "tolerance": str,
    }
    generic = [words[name](value) for name, value in server.generic_defaults.items()]
    if generic:
        said += "; generic defaults, not a profile's: " + ", ".join(generic)
    return said


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
