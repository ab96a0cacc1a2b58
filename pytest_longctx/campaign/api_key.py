"""The server's API key: the name of the variable that holds it, never the key itself.

Checked when the session is configured, before anything starts, so it stays apart from the
server's lifecycle (``server.py``) and what that imports.
"""

from __future__ import annotations

import os

from pytest_longctx.plan.run_description import RunDescription

API_KEY_ENV_FOR_VLLM = "VLLM_API_KEY"


def api_key_env_name(run: RunDescription) -> str | None:
    return run.settings.api_key_env or run.plan.profile.serving.api_key_env


class ApiKeyError(ValueError):
    """The variable named to hold the API key is not set."""


def check_api_key_env(run: RunDescription) -> None:
    """A named key variable must be set before anything starts (a plan needs no key)."""
    name = api_key_env_name(run)
    if name is None or run.settings.plan_only or name in os.environ:
        return
    where = (
        f"--longctx-api-key-env={name}"
        if run.settings.api_key_env
        else f"profile {run.plan.profile.name}'s [serving] api_key_env = {name!r}"
    )
    raise ApiKeyError(
        f"{where}: ${name} is not set; expected the name of an environment variable that "
        "holds the server's API key"
    )


def api_key(run: RunDescription) -> str | None:
    name = api_key_env_name(run)
    return os.environ.get(name) if name else None
