"""Shared pieces of the plugin's own tests.

End-to-end tests run pytest sessions (through ``pytester``) against real vLLM. They share
this session's server: the plugin's own ``longctx_server`` fixture launches it once from the
repository's profile (cpu-tiny), and sub-sessions attach to it with ``--longctx-url``. Tests
that are about launching start their own server in a subprocess session.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import sys

import pytest
from fake_vllm import fake_vllm  # noqa: F401 - the fixture, for every test module
from longctx_testing import SWEEP_TEST

from pytest_longctx.embedded import CACHE_ENV, cache_root


def _import_all(*packages: str) -> None:
    """In-process pytester sessions drop the modules they imported when they end; a later
    session re-imports them as new classes, and httpx no longer recognises httpcore's
    exceptions. Importing the HTTP stack fully here keeps one copy for every session."""
    for name in packages:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            with contextlib.suppress(ImportError):
                importlib.import_module(module.name)


_import_all("h11", "httpcore", "httpx")

# pytester points HOME at a temporary folder: keep sub-sessions on the real cache of embedded
# models and built prompts, as a user's repeated sessions would be.
os.environ.setdefault(CACHE_ENV, str(cache_root()))

#: Reuse a cpu-tiny server that is already running (while developing), instead of launching.
EXISTING_SERVER_ENV = "LONGCTX_TEST_SERVER_URL"


@pytest.fixture(scope="session")
def vllm_url(request: pytest.FixtureRequest) -> str:
    """URL of a real vLLM server serving cpu-tiny, for sub-sessions to attach to."""
    existing = os.environ.get(EXISTING_SERVER_ENV)
    if existing:
        return existing.rstrip("/")
    return request.getfixturevalue("longctx_server").base_url


@pytest.fixture
def sweep_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder holding the repository's own sweep test, as a user's project would."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester


@pytest.fixture(autouse=True)
def _own_test_sweep_module(request: pytest.FixtureRequest):
    """In-process sessions import their own ``test_sweep.py``: hide the repository's module
    of that name meanwhile (pytester restores ``sys.modules`` after each run)."""
    if "pytester" not in request.fixturenames:
        yield
        return
    saved = sys.modules.pop("test_sweep", None)
    yield
    if saved is not None:
        sys.modules["test_sweep"] = saved


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The sweep's own items measure real vLLM too: ``-m "not vllm"`` leaves them out."""
    for item in items:
        if item.get_closest_marker("longctx") or item.get_closest_marker("longctx_regression"):
            item.add_marker(pytest.mark.vllm)
