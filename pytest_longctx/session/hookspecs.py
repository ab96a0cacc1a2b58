"""Extension points for other plugins and conftest files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_longctx.campaign.hooks import CampaignHooks

if TYPE_CHECKING:
    from pytest_longctx.core.records import Record
    from pytest_longctx.plan.points import SweepPlan
    from pytest_longctx.serving.process import LaunchedServer
    from pytest_longctx.serving.vllm_command import ServerCommand


@pytest.hookspec(firstresult=True)
def pytest_longctx_server_command(
    config: pytest.Config, plan: SweepPlan, command: ServerCommand
) -> ServerCommand | None:
    """Return a changed command to launch instead (extra flags, a wrapper such as numactl).

    Called for every server the session launches, the interference points' own included
    (its environment has ``VLLM_SERVER_DEV_MODE=1``)."""


def pytest_longctx_server_ready(
    config: pytest.Config, base_url: str, mode: str, launched: LaunchedServer | None
) -> None:
    """The server answers ``/health``; ``mode`` is ``launched`` or ``attached``.

    Called for every server the session starts: the first, each relaunch and each switch to
    another workload's server. ``launched`` is the server process this session started (its
    ``pgid``, ``process``, ``command`` and ``log_path``), None for an attached server."""


def pytest_longctx_fingerprint(config: pytest.Config, fingerprint: dict[str, Any]) -> None:
    """Add keys to what identifies a measurement (a driver version, a cluster name)."""


def pytest_longctx_record(config: pytest.Config, record: Record) -> None:
    """A record was appended to ``results.jsonl`` and flushed: stream it elsewhere."""


def campaign_hooks(config: pytest.Config) -> CampaignHooks:
    """These hooks as the campaign calls them (:class:`~pytest_longctx.campaign.hooks.
    CampaignHooks`), with the command line that started the session."""
    return CampaignHooks(
        server_command=lambda plan, command: config.hook.pytest_longctx_server_command(
            config=config, plan=plan, command=command
        ),
        fingerprint=lambda fingerprint: config.hook.pytest_longctx_fingerprint(
            config=config, fingerprint=fingerprint
        ),
        server_ready=lambda base_url, mode, launched: config.hook.pytest_longctx_server_ready(
            config=config, base_url=base_url, mode=mode, launched=launched
        ),
        command_line=("pytest", *config.invocation_params.args),
    )
