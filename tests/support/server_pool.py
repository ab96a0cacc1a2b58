"""The suite's shared real vLLM servers: one per configuration, started once, stopped after
the last test that uses it.

A real server costs 40-100 s to start on two cores, and most tests that need real vLLM need
one of a handful of configurations, not a server of their own. Each configuration below is a
session fixture; the suite's conftest orders the tests so that each configuration's users run
together (never more than :data:`MAX_RESIDENT` servers up at once), stops a server after its
last user, and starts the next one in the background while the tests before it run. A test
whose subject is a launch or a server's lifecycle starts its own server (its docstring says
why); every other real-server test attaches here.

The embedded default itself (``vllm_url``) is the plugin's own ``longctx_server``, launched by
this session's sweep: it is not in this table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_longctx.profiles import Profile, load_profile
from pytest_longctx.profiles.embedded_models import default_models_dir, get_spec, is_complete
from pytest_longctx.serving.process import LaunchedServer, free_port
from pytest_longctx.serving.vllm_command import ServerCommand, build_server_command

#: Servers up at once, the plugin's own included: each holds about 3 GiB on a CPU host.
MAX_RESIDENT = 2
#: A server of the pool that is not healthy by then failed to start.
STARTUP_TIMEOUT_S = 300
#: The loaded servers' prompts: 16Ki, a warm follow-up's suffix and the decode, with room.
LOADED_MAX_MODEL_LEN = 20_480
#: The small prefill chunk of the loaded server: a 16Ki prompt takes eight engine steps.
SMALL_CHUNK = 2048
#: A chunk that holds any prompt the loaded servers take: one step for the whole prefill.
WHOLE_CHUNK = 32_768


@dataclass(frozen=True)
class PoolServer:
    """One configuration: the fixture that hands out its URL, and how to build its command."""

    fixture: str
    description: str
    command: Callable[[int], ServerCommand]


def _cpu_tiny(*extra: str) -> Profile:
    profile = load_profile("cpu-tiny")
    serving = dataclasses.replace(profile.serving, extra_args=(*profile.serving.extra_args, *extra))
    return dataclasses.replace(profile, serving=serving)


def embedded_model(name: str) -> Path:
    """The embedded model's folder, built first (in a process of its own: torch imported
    here would not survive a pytester session) when it is not cached."""
    folder = default_models_dir() / get_spec(name).folder_name
    if not is_complete(folder):
        subprocess.run([sys.executable, "-m", "pytest_longctx", "build-model", name], check=True)
    return folder


def _loaded(chunk: int) -> Callable[[int], ServerCommand]:
    """cpu-tiny as the interference, warm and progress tests need it: room for five
    sequences (a long prompt beside four streams), the prefill chunk given, the prompt
    tokens the cache served in every response, and the development endpoints
    (``/server_info``, ``/reset_prefix_cache``)."""

    def command(port: int) -> ServerCommand:
        return build_server_command(
            _cpu_tiny(),
            model_path=str(embedded_model("tiny-llama")),
            tokenizer_path=None,
            max_model_len=LOADED_MAX_MODEL_LEN,
            port=port,
            prompt_tokens_details=True,
            max_num_seqs=5,
            max_num_batched_tokens=chunk,
            server_info=True,
        )

    return command


def _stream_interval_8(port: int) -> ServerCommand:
    return build_server_command(
        _cpu_tiny("--stream-interval", "8", "--no-enable-prefix-caching"),
        model_path=str(embedded_model("tiny-llama")),
        tokenizer_path=None,
        max_model_len=8192,
        port=port,
    )


def _foreign(port: int) -> ServerCommand:
    from longctx_testing import fine_grained_qwen_spec

    spec = fine_grained_qwen_spec()
    folder = default_models_dir() / spec.folder_name  # cached like the embedded models
    if not is_complete(folder):
        staging = default_models_dir() / f".{spec.folder_name}.{os.getpid()}"
        build = (
            "import sys; from longctx_testing import fine_grained_qwen_spec; "
            "from pytest_longctx.serving.embedded import build_embedded_model; "
            "build_embedded_model(fine_grained_qwen_spec(), sys.argv[1])"
        )
        subprocess.run(
            [sys.executable, "-c", build, str(staging)], check=True, cwd=Path(__file__).parent
        )
        with contextlib.suppress(OSError):
            os.replace(staging, folder)
    profile = _cpu_tiny("--block-size", "32")
    model = dataclasses.replace(profile.model, served_name="tiny-qwen-fine")
    return build_server_command(
        dataclasses.replace(profile, model=model),
        model_path=str(folder),
        tokenizer_path=None,
        max_model_len=40_000,
        port=port,
    )


#: The rotary base the disturbed server serves tiny-llama with, instead of the 1e12 its weights
#: were built for: the question's key pair then turns by 5.1e-4 rad a token, so a needle more
#: than about 3,000 tokens before the question is lost (the score falls below what the other
#: tokens dilute) while one within about 2,000 is still found (transformers, bf16: lost at
#: 4,095 and 8,191 tokens back, found at 1,023 and 9).
DISTURBED_ROPE_THETA = 2500.0


def _disturbed_rope(port: int) -> ServerCommand:
    """tiny-llama with its rotary base overridden (vLLM 0.32 with transformers 5 reads the
    ``rope_parameters`` form; a bare ``rope_theta`` is ignored): the probe's negative control
    where it must fail, a server no other configuration can stand in for (its answers are
    wrong by design, so it serves these tests alone)."""
    rope = {"rope_parameters": {"rope_type": "default", "rope_theta": DISTURBED_ROPE_THETA}}
    return build_server_command(
        _cpu_tiny("--hf-overrides", json.dumps(rope)),
        model_path=str(embedded_model("tiny-llama")),
        tokenizer_path=None,
        max_model_len=8192,
        port=port,
    )


POOL: dict[str, PoolServer] = {
    "loaded": PoolServer(
        "loaded_url",
        f"cpu-tiny, five sequences, a prefill chunk of {SMALL_CHUNK:,} tokens",
        _loaded(SMALL_CHUNK),
    ),
    "whole_chunk": PoolServer(
        "whole_chunk_url",
        f"cpu-tiny, five sequences, a prefill chunk of {WHOLE_CHUNK:,} tokens (one step)",
        _loaded(WHOLE_CHUNK),
    ),
    "foreign": PoolServer(
        "foreign_model_url",
        "a Qwen2 model no profile describes, a 320-token tokenizer, a KV block of 32 tokens",
        _foreign,
    ),
    "stream_interval_8": PoolServer(
        "stream_interval_8_url",
        "cpu-tiny with --stream-interval 8 and prefix caching off",
        _stream_interval_8,
    ),
    "disturbed_rope": PoolServer(
        "disturbed_rope_url",
        f"cpu-tiny with its rotary base overridden to {DISTURBED_ROPE_THETA:g}",
        _disturbed_rope,
    ),
}
#: The fixture that hands out each configuration's URL, and the plugin's own server's.
FIXTURES = {server.fixture: name for name, server in POOL.items()} | {"vllm_url": "default"}


class ServerPool:
    """Starts each configuration once, in the background when asked ahead, and stops it."""

    def __init__(self, log_root: Path) -> None:
        self.log_root = log_root
        self.servers: dict[str, LaunchedServer] = {}
        self.ready: set[str] = set()
        #: Why a configuration could not be started: its users fail with it, once asked.
        self.failed: dict[str, str] = {}

    def start(self, name: str) -> None:
        """Start ``name`` without waiting for it (the tests before its first user run
        meanwhile). A failure here (its model could not be built, say) belongs to the tests
        that use the server, not to the one running while it started: it is kept for them."""
        if name in self.servers or name in self.failed:
            return
        try:
            server = LaunchedServer(
                POOL[name].command(free_port()),
                self.log_root / name / "server.log",
                startup_timeout_s=STARTUP_TIMEOUT_S,
            )
            server.start()
        except Exception as exc:  # noqa: BLE001 - said to every user of the server
            self.failed[name] = f"{type(exc).__name__}: {exc}"
            return
        self.servers[name] = server

    def url(self, name: str) -> str:
        self.start(name)
        if name in self.failed:
            pytest.fail(
                f"the pool's {name} server ({POOL[name].description}) could not be started: "
                + self.failed[name]
            )
        server = self.servers[name]
        if name not in self.ready:
            try:
                server.wait_ready()
            except Exception as exc:  # noqa: BLE001 - every user of it fails with the cause
                self.stop(name)
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                pytest.fail(f"the pool's {name} server ({POOL[name].description}) failed: {exc}")
            self.ready.add(name)
        return server.base_url

    def resident(self) -> list[str]:
        return list(self.servers)

    def stop(self, name: str) -> None:
        server = self.servers.pop(name, None)
        self.ready.discard(name)
        if server is not None:
            server.stop()

    def close(self) -> None:
        for name in list(self.servers):
            self.stop(name)


#: The order in which the tests' server needs run: each configuration's users together, the
#: plugin's own server first (the sweep session starts it), never more than two at once.
#: Tests that use none run last, each module in its place, while no shared server is up.
ORDER: tuple[frozenset[str], ...] = (
    frozenset({"default"}),
    frozenset({"foreign"}),
    frozenset({"default", "foreign"}),
    frozenset({"default", "loaded"}),
    frozenset({"loaded"}),
    frozenset({"loaded", "whole_chunk"}),
    frozenset({"whole_chunk"}),
    frozenset({"stream_interval_8"}),
    frozenset({"disturbed_rope"}),
)


def needs(item: pytest.Item) -> frozenset[str]:
    """The shared servers a test uses: its fixtures', and the sweep's own items the default."""
    fixtures = getattr(item, "fixturenames", ())
    names = {FIXTURES[f] for f in fixtures if f in FIXTURES}
    if item.get_closest_marker("longctx") or "longctx_server" in fixtures:
        names.add("default")
    return frozenset(names)


def rank(servers: frozenset[str]) -> int:
    """Where a test using ``servers`` runs; one using none, after all that use some."""
    if not servers:
        return len(ORDER)
    if servers not in ORDER:
        raise pytest.UsageError(
            f"no place in tests/support/server_pool.py ORDER for a test using {sorted(servers)}: "
            "add its set of servers there, keeping at most two together"
        )
    return ORDER.index(servers)


class PoolSchedule:
    """Orders the tests by the servers they use, starts each pool server ahead of its first
    user and stops it after its last one (the plugin's own server too).

    A module's tests stay together (its module fixtures are set up once): the module runs at
    the place of the first configuration it uses, its tests in that order, and those that use
    no server first."""

    def __init__(self, pool: ServerPool, stop_default: Callable[[], None]) -> None:
        self.pool = pool
        self.stop_default = stop_default
        self.needs: list[frozenset[str]] = []
        self.index: dict[str, int] = {}
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}

    @pytest.hookimpl(trylast=True)  # after -m/-k deselected: order what will run
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        def module(item: pytest.Item) -> str:
            return item.nodeid.split("::")[0]

        position = {item.nodeid: i for i, item in enumerate(items)}
        item_rank = {item.nodeid: rank(needs(item)) for item in items}
        module_rank: dict[str, int] = {}
        module_position: dict[str, int] = {}
        for i, item in enumerate(items):
            name = module(item)
            module_rank[name] = min(module_rank.get(name, len(ORDER)), item_rank[item.nodeid])
            module_position.setdefault(name, i)
        items.sort(
            key=lambda item: (
                module_rank[module(item)],
                module_position[module(item)],
                item_rank[item.nodeid] if needs(item) else -1,
                position[item.nodeid],
            )
        )
        self.needs = [needs(item) for item in items]
        self.index = {item.nodeid: i for i, item in enumerate(items)}
        for i, used in enumerate(self.needs):
            for name in used:
                self.first.setdefault(name, i)
                self.last[name] = i

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Start the next pool servers in the background while there is room for them."""
        index = self.index.get(item.nodeid)
        if index is None:
            return
        up = {n for n, first in self.first.items() if first <= index <= self.last[n]}
        up |= set(self.pool.resident())
        upcoming = sorted((first, n) for n, first in self.first.items() if first > index)
        for _, name in upcoming:
            if len(up) >= MAX_RESIDENT:
                return
            if name != "default":
                self.pool.start(name)
            up.add(name)

    @pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        index = self.index.get(item.nodeid)
        for name, last in self.last.items():
            if last == index:
                if name == "default":
                    self.stop_default()
                else:
                    self.pool.stop(name)
