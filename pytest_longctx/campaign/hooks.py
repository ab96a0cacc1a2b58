"""What other plugins may do to the servers a campaign starts, as plain callbacks.

The campaign calls no pytest hook itself: the pytest layer hands it its hooks
(``pytest_longctx_server_command``, ``pytest_longctx_fingerprint``,
``pytest_longctx_server_ready``, see ``session/hookspecs.py``) through a :class:`CampaignHooks`,
and a test hands it what it wants to see called. Light on purpose: the plugin imports it
in every session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_longctx.plan.points import SweepPlan
    from pytest_longctx.serving.process import LaunchedServer
    from pytest_longctx.serving.vllm_command import ServerCommand


def _keep(plan: SweepPlan, command: ServerCommand) -> ServerCommand | None:
    return None


def _add_nothing(fingerprint: dict[str, Any]) -> None:
    return None


def _tell_nobody(base_url: str, mode: str, launched: LaunchedServer | None) -> None:
    return None


@dataclass(frozen=True)
class CampaignHooks:
    """The callbacks a campaign calls at its servers' starts; by default they change nothing."""

    #: A changed launch command for every server launched, or None to keep it.
    server_command: Callable[[SweepPlan, ServerCommand], ServerCommand | None] = _keep
    #: Adds keys, in place, to what identifies a measurement.
    fingerprint: Callable[[dict[str, Any]], None] = _add_nothing
    #: A server answers ``/health``: its URL, ``launched`` or ``attached``, and the process
    #: the campaign launched (None when attached); at every start.
    server_ready: Callable[[str, str, LaunchedServer | None], None] = _tell_nobody
    #: The command line that started the campaign, as the fingerprint records it.
    command_line: tuple[str, ...] = ()
