"""Helpers shared by the plugin's own tests."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_longctx.core.records import Record, read_records
from pytest_longctx.measure.agreement import MIN_BURST_TOKENS


class _DeferredModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # collection asks every name in a test file for private ones
            raise AttributeError(f"{self._name} is imported at its first public name, not {attr}")
        return getattr(importlib.import_module(self._name), attr)


def deferred_import(name: str) -> Any:
    """``name``, imported at its first use rather than now. Each session of ``make test``
    collects every test file, and a file that imported vLLM, torch or transformers at the top
    made every session pay for it (about 20 CPU-s in a session that runs none of its tests).
    Like ``pytest.importorskip``, a package that is not installed skips the file. Only public
    names are looked up through it (import a private one where it is used)."""
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        pytest.skip(f"could not import {name!r}", allow_module_level=True)
    return _DeferredModule(name)


REPO = Path(__file__).resolve().parents[2]
#: The Kimi Linear config.json copy the reference profiles ship: the figures tested are the
#: ones the plan uses.
KIMI_CONFIG = REPO / "pytest_longctx" / "profiles" / "data" / "kimi-linear-48b-a3b-config.json"
SWEEP_TEST = (REPO / "tests" / "test_sweep.py").read_text(encoding="utf-8")
#: ``python`` arguments that run the sweep shipped in the package, as any project runs it.
SHIPPED_SWEEP = ("-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "pytest_longctx.suite")
#: The stand-in server's program (tests/support/fake_vllm.py behind a command line), for sessions
#: that launch a server when what they test is the session's own handling of it.
FAKE_MAIN = REPO / "tests" / "support" / "fake_server_main.py"
_LAUNCH_FAKE = """
import sys
from pytest_longctx.serving.vllm_command import ServerCommand

def pytest_longctx_server_command(config, plan, command):
    argv = list(command.argv)
    port = argv[argv.index("--port") + 1]
    extra = {extra!r}
    return ServerCommand(
        (sys.executable, {main!r}, "--host", "127.0.0.1", "--port", port,
         "--served-model-name", "tiny-llama", *extra),
        dict(command.env) if {keep_env!r} else {{}},
    )
"""


def launch_fake_conftest(*extra: str, keep_env: bool = False) -> str:
    """conftest text that has the session launch the stand-in (with ``extra`` arguments)
    instead of vLLM: it starts in a second, so a test about relaunches, signals or limits
    pays no vLLM start-up per server it launches. ``keep_env``: the stand-in gets the
    environment the launch gives vLLM (the profile's and what the session adds)."""
    return _LAUNCH_FAKE.format(extra=list(extra), main=str(FAKE_MAIN), keep_env=keep_env)


#: Fails a point whose stream arrived in bursts, which a session otherwise keeps with the
#: server's decode figure: on a 2-core host running this suite beside its servers, an API
#: server is starved now and then and flushes a whole 32-token stream at once (seen: 31 tokens
#: within 1.5 ms of a 186 ms decode). Only the stream tests pass it.
STRICT_STREAM = "--longctx-strict-stream"


@dataclass(frozen=True)
class Session:
    """A finished process (a pytest session, the CLI): exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"exit {self.returncode}\n{self.stdout[-4000:]}\n{self.stderr[-2000:]}"


#: How long a session attached to a running server may take: its points are a few seconds
#: each, so one past this is stuck, and fails with what it printed instead of a longer wait.
ATTACHED_TIMEOUT_S = 300
#: A session that launches its servers (and relaunches them) gets more.
LAUNCHING_TIMEOUT_S = 600


def run_process(  # noqa: ANN201
    directory: Path, *args: str, python: Path | None = None, timeout: float = ATTACHED_TIMEOUT_S
):
    """``python ARGS`` in ``directory`` as a user runs it (no PYTEST_ADDOPTS of this session);
    one that outlives ``timeout`` fails the test with the end of what it printed."""
    try:
        completed = subprocess.run(
            [str(python or sys.executable), *args],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"},
        )
    except subprocess.TimeoutExpired as exc:
        printed = [_text(exc.stdout)[-4000:], _text(exc.stderr)[-2000:]]
        pytest.fail(f"{' '.join(args)} did not finish in {timeout:g} s:\n" + "\n".join(printed))
    return Session(completed.returncode, completed.stdout, completed.stderr)


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def pytest_benchmark_compare(directory: Path, *args: str) -> Session:
    """``pytest-benchmark compare ARGS``; it builds a pytest Config, so other installed
    plugins are kept out of it."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", *args],
        cwd=directory,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Session(completed.returncode, completed.stdout, completed.stderr)


def run_folder(output: Path) -> Path:
    latest = output / "latest"
    assert latest.is_symlink(), f"no run folder under {output}"
    return latest.resolve()


def records_of(output: Path) -> list[Record]:
    result = read_records(run_folder(output) / "results.jsonl")
    assert not result.problems, result.problems
    return list(result.records)


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def junit_cases(path: Path) -> dict[str, dict[str, str]]:
    """name -> properties of every testcase in a JUnit XML file."""
    root = ElementTree.parse(path).getroot()
    return {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }


# -- a session's items, from its ``-v`` lines, and the command line ---------------------


_OUTCOME_LINE = re.compile(r"^test_sweep\.py::(\S+) (PASSED|FAILED|SKIPPED|ERROR)\b")


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Item name -> outcome, from the ``-v`` lines."""
    found = {}
    for line in result.outlines:
        match = _OUTCOME_LINE.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def regression_outcomes(result: pytest.RunResult) -> dict[str, str]:
    return {
        name.removeprefix("test_regression[len=").removesuffix("]"): outcome
        for name, outcome in outcomes(result).items()
        if name.startswith("test_regression")
    }


def sweep_outcomes(result: pytest.RunResult) -> set[str]:
    return {o for name, o in outcomes(result).items() if name.startswith("test_prefill_decode")}


def cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest_longctx", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


#: Sessions of the suite draw no plots unless a test asks (``PLOTS``): matplotlib's rendering
#: is most of a short session's reports, and only the tests of the reports look at them.
NO_PLOTS = "--longctx-plots=off"
PLOTS = "--longctx-plots=on"


def fake_session_args(url: str, output: Path, *, plots: bool = False) -> list[str]:
    """A sub-session attached to a fake server, writing under ``output``, with a short decode
    and, unless ``plots``, no plots."""
    return [
        "-p",
        "no:cacheprovider",
        f"--longctx-url={url}",
        f"--longctx-output={output}",
        "--longctx-decode-tokens=8",
        PLOTS if plots else NO_PLOTS,
    ]


#: A shared server is warm after its first session: later sessions send it one warm-up prompt.
WARMUP_OPTION = "--longctx-warmup-prompts"
#: The suite's shared servers are cpu-tiny's (the foreign model's is measured with it too, as
#: a profile for another model): a session attached to one names it, as a user measuring them
#: would. Attached with no profile, a session takes the server's own settings instead
#: (tests/unit/campaign/test_attach_without_profile.py).
SHARED_SERVERS_PROFILE = "--longctx-profile=cpu-tiny"


def run_session(  # noqa: ANN201
    pytester,  # noqa: ANN001
    *args: str,
    url: str | None = None,
    timeout: float | None = None,
    strict_stream: bool = False,
    shared_profile: bool = True,
):
    """A pytest session in its own process, as a user runs one, writing under ``reports/``.

    Returns the run result and the output root. With ``url`` it attaches to that server, which
    the suite keeps warm: one warm-up prompt (it shows how the server streams) instead of the
    profile's three, unless ``--longctx-warmup-prompts`` is given; and with cpu-tiny's profile
    (:data:`SHARED_SERVERS_PROFILE`) unless ``args`` name one or not ``shared_profile``. No
    plots unless ``PLOTS`` is among ``args``. Bursts are kept, as by default, unless
    ``strict_stream`` (:data:`STRICT_STREAM`). A session that outlives ``timeout`` (default:
    :data:`ATTACHED_TIMEOUT_S` attached, else :data:`LAUNCHING_TIMEOUT_S`) fails the test
    with the end of what it printed.
    """
    output = pytester.path / "reports"
    attach = [f"--longctx-url={url}"] if url else []
    if url and not any(arg.startswith(WARMUP_OPTION) for arg in args):
        attach.append(f"{WARMUP_OPTION}=1")
    if url and shared_profile and not any(arg.startswith("--longctx-profile") for arg in args):
        attach.append(SHARED_SERVERS_PROFILE)
    if not any(arg.startswith("--longctx-plots") for arg in args):
        attach.append(NO_PLOTS)
    keep = [STRICT_STREAM] if strict_stream and STRICT_STREAM not in args else []
    if timeout is None:
        timeout = ATTACHED_TIMEOUT_S if url else LAUNCHING_TIMEOUT_S
    try:
        result = pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            f"--longctx-output={output}",
            *attach,
            *keep,
            *args,
            timeout=timeout,
        )
    except pytester.TimeoutExpired:
        printed = [
            (pytester.path / name).read_text(errors="replace")[-3000:]
            for name in ("stdout", "stderr")
            if (pytester.path / name).exists()
        ]
        pytest.fail(f"the session did not finish in {timeout:g} s:\n" + "\n".join(printed))
    return result, output


@dataclass
class FaultAfterWarmUp:
    """Switches a fake server's fault on as the first item runs, after the warm-up prompts
    (the first three completions); or stops the server there."""

    fake: Any
    changes: dict[str, Any]
    stop_server: bool = False

    def pytest_runtest_call(self, item: Any) -> None:
        if self.stop_server:
            self.fake.stop()
        else:
            self.fake.configure(**self.changes)


def fault_session(pytester, fake):  # noqa: ANN001, ANN201
    """Runs the sweep in-process attached to the fake server; ``run(*args, **changes)``
    returns the result and the records, the changes made after the warm-up."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def run(*args: str, stop_server: bool = False, plugins: tuple = (), **changes: Any):  # noqa: ANN202
        result = pytester.runpytest(
            *fake_session_args(fake.url, output),
            *args,
            plugins=[FaultAfterWarmUp(fake, changes, stop_server), *plugins],
        )
        return result, records_of(output)

    return run


@pytest.fixture
def attached(pytester, fake_vllm):  # noqa: ANN001, ANN201
    """:func:`fault_session` on the ``fake_vllm`` fixture's server; import it into a test
    module to use it."""
    return fault_session(pytester, fake_vllm)


def failure_classes(records: list[Record]) -> list[str | None]:
    return [r.failure_class for r in records]


def fine_grained_qwen_spec():  # noqa: ANN201 - an EmbeddedModelSpec
    """A model no profile describes: Qwen2 architecture, and a byte-level tokenizer of only
    320 tokens, which splits text (digits above all) into many small tokens."""
    from pytest_longctx.profiles.embedded_models import (
        MAX_POSITION_EMBEDDINGS,
        ROPE_THETA,
        EmbeddedModelSpec,
    )
    from pytest_longctx.prompts.needle import RESERVED_TOKENS

    return EmbeddedModelSpec(
        name="tiny-qwen-fine",
        architecture="Qwen2ForCausalLM",
        config={
            "model_type": "qwen2",
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "initializer_range": 0.02,
        },
        # a byte-level BPE of 320 tokens, and the needle vocabulary every embedded model ends with
        vocab_size=320 + len(RESERVED_TOKENS),
        corpus_chars=300_000,
        description="Qwen2-style, 2 layers, GQA, a 320-token byte-level BPE and the needles",
    )


@contextlib.contextmanager
def serving(profile, model_path: str, max_model_len: int, log_dir: Path) -> Iterator[str]:  # noqa: ANN001
    """A real vLLM server of ``profile`` for the ``with`` block: its base URL, then stopped."""
    from pytest_longctx.serving.process import LaunchedServer, free_port
    from pytest_longctx.serving.vllm_command import build_server_command

    command = build_server_command(
        profile,
        model_path=model_path,
        tokenizer_path=None,
        max_model_len=max_model_len,
        port=free_port(),
    )
    server = LaunchedServer(command, log_dir / "server.log", startup_timeout_s=600)
    server.start()
    try:
        server.wait_ready()
        yield server.base_url
    finally:
        server.stop()


@contextlib.contextmanager
def cpu_tiny_streaming(stream_interval: int, log_dir: Path) -> Iterator[str]:
    """A real vLLM server of cpu-tiny started with ``--stream-interval N`` (8,192 tokens):
    the first token alone, then chunks of N. Its model is built first if it is not cached,
    in a process of its own (torch imported here would not survive a pytester session)."""
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.profiles.embedded_models import default_models_dir, get_spec, is_complete

    profile = load_profile("cpu-tiny")
    extra = (*profile.serving.extra_args, "--stream-interval", str(stream_interval))
    profile = dataclasses.replace(
        profile, serving=dataclasses.replace(profile.serving, extra_args=extra)
    )
    name = profile.model.embedded_name
    model = default_models_dir() / get_spec(name).folder_name
    if not is_complete(model):
        subprocess.run([sys.executable, "-m", "pytest_longctx", "build-model", name], check=True)
    with serving(profile, str(model), 8_192, log_dir) as url:
        yield url


def chunk_counts(stream: dict) -> list[int]:
    """Each chunk's tokens, in order, from a record's run-length ``tokens_per_chunk``."""
    return [tokens for tokens, times in stream["tokens_per_chunk"] for _ in range(times)]


def assert_bursts_kept_with_the_servers_figure(records, report: str) -> None:  # noqa: ANN001
    """Every point is the stream's figure where it agreed with the server's, else the
    server's, with the stream's own beside it (where it had two chunks to time), and the
    report says which. A point kept on the server's figure proves why in its own record: a
    burst beyond the tolerance's share of its decode, or the stream's rate beyond the
    tolerance from the server's own (a busy host held the stream back; how many points a
    host bursts is its load's to decide). That a stream the server did not hold back agrees
    is held where the server's clock is its own: the stand-in (test_plugin_faults.py)."""
    kept = [r for r in records if r.stream["decode_source"] == "server"]
    for record in records:
        assert record.fingerprint["stream"]["bursts_allowed"] is True
        if record in kept:
            figures = record.figures
            assert figures["decode_throughput"] == figures["server_decode_throughput"]
            # the stream's own rate is kept beside it, where it had one: a stream the server
            # merged into a single chunk has no two chunks to time a decode between
            has_rate = record.stream["chunks"] >= 2
            assert ("stream_decode_throughput" in figures) == has_rate, record.stream
            assert record.stream["agreement"].startswith("the stream")
            _assert_disagreement_shown(record)
        else:
            assert record.stream["agreement"] == "agrees"
    said = f"Decode figures: {len(kept)} point{'s' if len(kept) != 1 else ''} kept the server's"
    assert (said in report) == bool(kept), report


def _assert_disagreement_shown(record) -> None:  # noqa: ANN001
    """The record's own figures show the disagreement its point was kept for."""
    tolerance = record.fingerprint["stream"]["tolerance"]
    decoded = record.completion_tokens - 1
    burst = (record.stream.get("largest_burst") or {}).get("tokens", 0)
    server = record.stream["server_decode_throughput"]
    own = record.figures.get("stream_decode_throughput")
    bursts = burst > max(tolerance * decoded, MIN_BURST_TOKENS)
    strays = own is not None and abs(own / server - 1) > tolerance
    assert bursts or strays, (record.stream, record.figures)


def profile_copy(directory: Path, name: str, **changes: str) -> Path:
    """A user's profile file: a shipped one with some lines replaced."""
    from pytest_longctx.profiles import PROFILE_DIR

    text = (PROFILE_DIR / f"{name}.toml").read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = directory / f"{name}-custom.toml"
    path.write_text(text)
    return path


def wait_until_group_is_gone(pgid: int, timeout_s: float = 60.0) -> bool:
    """A bounded poll: the kernel reaps a killed group a moment after the kill returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


# -- the sweep's pytest-xdist scheduler, without workers ------------------------------------


class FakeNode:
    """What the scheduler sees of an xdist worker: the items sent and the shutdown."""

    def __init__(self, name: str, log: list[int]) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.log = log
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)
        self.log.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def schedule_on_two(config, run, collection: list[str]):  # noqa: ANN001, ANN201
    """The sweep's scheduler over two fake workers that collected ``collection``, scheduled:
    (scheduler, worker a, worker b, every index handed out in order)."""
    from pytest_longctx.session.scheduling import LongestFirstScheduling

    scheduler = LongestFirstScheduling(config, None, run)
    handed_out: list[int] = []
    a, b = FakeNode("gw0", handed_out), FakeNode("gw1", handed_out)
    for node in (a, b):
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, a, b, handed_out


def plan_settings(**changes: object) -> Any:
    """What the option reader gives a session that sets nothing but ``changes`` (cpu-tiny,
    launched), for tests of the plan's own functions."""
    from pytest_longctx.plan.settings import Settings

    base = Settings(
        from_length=None,
        to_length=None,
        repeats=1,
        order="pass",
        profile="cpu-tiny",
        urls=(),
        api_key_env=None,
        output=Path("reports"),
        decode_tokens=None,
        ttft_timeout_s=None,
        prompt_format="ids",
        seed=0,
        baseline=None,
        tolerance=None,
        baseline_force=False,
        plan_only=False,
        resume=None,
    )
    return dataclasses.replace(base, **changes)
