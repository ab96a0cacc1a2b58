"""What the options describe, read at configure time, and the one switch that starts a sweep.

pytest-longctx is a ``pytest11`` plugin, so it loads in every session of its environment.
Until a session collects a sweep item (a test using ``longctx_point`` or the gate's
``longctx_regression_length``), or asks for ``--longctx-plan``, the plugin only adds its
options, markers and fixtures: it installs no signal handler, creates no folder, changes no
option of another plugin and rewrites no ``-m``/``-k``. :func:`activate` is the one switch,
the way pytest-xdist registers its ``DSession`` only when distribution is asked for.

What the options say is still read and checked when the session is configured
(:func:`prepare`), so a bad option stops the session before collection, with or without a
sweep; reading them changes nothing. This module and what it imports stay light (no HTTP
client, no numpy, no report writers): the sweep's session object, which needs them all, is
imported by :func:`activate` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_longctx.campaign.api_key import ApiKeyError, check_api_key_env
from pytest_longctx.campaign.attached_settings import session_profile
from pytest_longctx.campaign.run import ResumeError, Run
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import PlanError, build_plan
from pytest_longctx.profiles import ProfileError
from pytest_longctx.profiles.vllm_releases import NewerRelease, UnsupportedRelease
from pytest_longctx.session import gate_items, selection, workers
from pytest_longctx.session.option_parsing import read_settings
from pytest_longctx.session.stash import (
    COMPARISONS_KEY,
    POINT_FIXTURE,
    REGRESSION_FIXTURE,
)
from pytest_longctx.workloads import fitted, launch_refusal

if TYPE_CHECKING:
    from pytest_longctx.session.sweep_session import SweepSession


@dataclass(frozen=True)
class PreparedSweep:
    """What the options describe, read and checked at configure time; nothing started."""

    run: Run
    selection: selection.Selection


PREPARED_KEY = pytest.StashKey[PreparedSweep]()
SESSION_KEY = pytest.StashKey["SweepSession"]()


def uses_the_sweep(fixturenames: list[str] | tuple[str, ...]) -> bool:
    """Whether a test function is a sweep item (a point or a gate item)."""
    return POINT_FIXTURE in fixturenames or REGRESSION_FIXTURE in fixturenames


def prepare(config: pytest.Config) -> PreparedSweep:
    """Read the options into a run; a usage error naming the option for anything bad."""
    try:
        chosen = selection.read_selection(config)
        settings = read_settings(config)
        plan = fitted(build_plan(
                settings,
                session_profile(settings, workers.server_settings_from_controller(config)),
            ))
        run = Run.create(
            settings,
            plan,
            config.rootpath,
            workers.run_from_controller(config),
            workers.place(config, settings, plan),
        )
        check_api_key_env(run.description)
        if not settings.url:  # a launch runs the vLLM installed here (or the pinned one)
            warning = capacity_check.planned_release(plan.profile).warning()
            if warning and not workers.is_worker(config):  # said once, by the controller
                config.issue_config_time_warning(NewerRelease(warning), stacklevel=2)
            refusal = launch_refusal(plan)
            if refusal:
                raise PlanError(refusal)
        gate_items.configure(run)
    except (
        UnsupportedRelease,
        selection.SelectionError,
        ProfileError,
        PlanError,
        ResumeError,
        ApiKeyError,
    ) as exc:
        raise pytest.UsageError(str(exc)) from None
    selection.register_markers(config, chosen)
    prepared = PreparedSweep(run, chosen)
    config.stash[PREPARED_KEY] = prepared
    return prepared


def prepared(config: pytest.Config) -> PreparedSweep:
    return config.stash[PREPARED_KEY]


def active(config: pytest.Config) -> SweepSession | None:
    return config.stash.get(SESSION_KEY, None)


def activate(config: pytest.Config, session: pytest.Session | None = None) -> SweepSession:
    """Register the sweep's session object (once); from here the plugin acts."""
    current = active(config)
    if current is not None:
        return current
    # Only a session with a sweep pays for what measuring and reporting import.
    from pytest_longctx.session.sweep_session import SweepSession

    ready = prepared(config)
    sweep = SweepSession(config, ready.run, ready.selection)
    config.stash[SESSION_KEY] = sweep
    config.stash[COMPARISONS_KEY] = ready.selection.comparisons
    config.pluginmanager.register(sweep, "longctx-sweep")
    sweep.start(session)
    return sweep
