"""The sweep in any repository and any CI: ini lists and off switches, the report header and
JUnit XML properties. (A real sweep's JUnit XML: tests/e2e/test_e2e_any_ci.py; ``calibrate``
from an empty folder: tests/e2e/test_e2e_packaging.py.)"""

from __future__ import annotations

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import fault_session, junit_cases, launch_fake_conftest, records_of

from pytest_longctx.profiles import load_profile
from pytest_longctx.session.option_parsing import OPTIONS, read_settings

FLAGS = [spec for spec in OPTIONS if spec.negation]
#: Flags that turn a setting on; ``--longctx-allow-bursts`` is now the default, kept for older
#: command lines and ini files (its ``--no-`` form is ``--longctx-strict-stream``).
SWITCHES = [spec for spec in FLAGS if spec.name != "longctx-allow-bursts"]


# -- ini lists and off switches ------------------------------------------------------------


@pytest.mark.parametrize(
    "ini",
    [
        "[pytest]\nlongctx_url =\n    http://a:1\n    http://b:2\n",
        "[pytest]\nlongctx_url = http://a:1, http://b:2\n",
        "[pytest]\nlongctx_url = http://a:1 http://b:2\n",
    ],
    ids=["lines", "commas", "spaces"],
)
def test_the_ini_url_takes_a_list(pytester: pytest.Pytester, ini: str) -> None:
    pytester.makeini(ini)
    config = pytester.parseconfigure()
    assert read_settings(config).urls == ("http://a:1", "http://b:2")


def test_the_url_list_in_pyproject(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nlongctx_url = ["http://a:1", "http://b:2,http://c:3"]\n'
    )
    config = pytester.parseconfigure()
    assert read_settings(config).urls == ("http://a:1", "http://b:2", "http://c:3")


def test_a_bad_ini_url_names_the_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nlongctx_url =\n    http://a:1\n    a:2\n")
    with pytest.raises(pytest.UsageError, match=r"--longctx-url=a:2: expected http:// or https://"):
        read_settings(pytester.parseconfigure())


@pytest.mark.parametrize("spec", SWITCHES, ids=[spec.name for spec in SWITCHES])
def test_every_ini_flag_turns_off_on_the_command_line(pytester: pytest.Pytester, spec) -> None:  # noqa: ANN001
    field = {
        "longctx-allow-mixed-servers": "allow_mixed_servers",
        "longctx-baseline-force": "baseline_force",
        "longctx-allow-unverified": "allow_unverified",
        "longctx-strict-stream": "strict_stream",
        "longctx-allow-unconfirmed": "allow_unconfirmed",
    }[spec.name]
    assert getattr(read_settings(pytester.parseconfigure()), field) is False
    pytester.makeini(f"[pytest]\n{spec.dest} = true\n")
    assert getattr(read_settings(pytester.parseconfigure()), field) is True
    assert getattr(read_settings(pytester.parseconfigure(f"--no-{spec.name}")), field) is False
    # and the other way round: off in the ini file, on for one session
    pytester.makeini(f"[pytest]\n{spec.dest} = false\n")
    assert getattr(read_settings(pytester.parseconfigure()), field) is False
    assert getattr(read_settings(pytester.parseconfigure(f"--{spec.name}")), field) is True


def test_allow_bursts_is_the_default_and_its_off_switch_is_strict_stream(
    pytester: pytest.Pytester,
) -> None:
    def strict(*args: str) -> bool:
        return read_settings(pytester.parseconfigure(*args)).strict_stream

    assert strict() is False
    assert strict("--longctx-allow-bursts") is False
    assert strict("--no-longctx-allow-bursts") is True
    pytester.makeini("[pytest]\nlongctx_allow_bursts = false\n")
    assert strict() is True
    assert strict("--longctx-allow-bursts") is False
    assert strict("--no-longctx-strict-stream") is False  # the command line wins
    pytester.makeini("[pytest]\nlongctx_allow_bursts = true\nlongctx_strict_stream = false\n")
    assert strict() is False
    assert strict("--longctx-strict-stream") is True


def test_strict_stream_decides_where_both_are_said_in_one_place(
    pytester: pytest.Pytester,
) -> None:
    def strict(*args: str) -> bool:
        return read_settings(pytester.parseconfigure(*args)).strict_stream

    assert strict("--longctx-strict-stream", "--longctx-allow-bursts") is True
    assert strict("--no-longctx-strict-stream", "--no-longctx-allow-bursts") is False
    pytester.makeini("[pytest]\nlongctx_strict_stream = true\nlongctx_allow_bursts = true\n")
    assert strict() is True


@pytest.mark.parametrize("spec", FLAGS, ids=[spec.name for spec in FLAGS])
def test_a_bad_ini_flag_names_the_key_the_option_and_the_accepted_form(
    pytester: pytest.Pytester,
    spec,  # noqa: ANN001
) -> None:
    pytester.makeini(f"[pytest]\n{spec.dest} = maybe\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    result.stderr.fnmatch_lines(
        [
            f"ERROR: {spec.dest} in {pytester.path / 'tox.ini'} (--{spec.name}): "
            "invalid truth value 'maybe'; expected true or false (in an ini file also 1/0, "
            "yes/no, on/off, y/n, t/f;*"
        ]
    )
    # pyproject.toml's [tool.pytest] table is TOML: a quoted string is not a boolean there
    (pytester.path / "tox.ini").unlink()
    pytester.makepyprojecttoml(f'[tool.pytest]\n{spec.dest} = "yes"\n')
    result = pytester.runpytest("-p", "no:cacheprovider", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: {spec.dest} in *pyproject.toml (--{spec.name}): *"])
    # the command line wins: the ini file's value is not read at all
    result = pytester.runpytest("-p", "no:cacheprovider", "--co", f"--no-{spec.name}")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


def test_every_flag_the_ini_file_can_set_has_an_off_switch() -> None:
    assert {spec.name for spec in OPTIONS if spec.flag and spec.ini} == {
        "longctx-allow-mixed-servers",
        "longctx-baseline-force",
        "longctx-allow-unverified",
        "longctx-strict-stream",
        "longctx-allow-unconfirmed",
        "longctx-allow-bursts",
    }
    assert all(spec.negation == f"no-{spec.name}" for spec in FLAGS)


# -- the report header ---------------------------------------------------------------------


def header_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("longctx ")]


def test_the_header_names_profile_server_and_lengths_when_asked(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--longctx-url=http://127.0.0.1:9", "--longctx-to=4Ki"
    )
    result.assert_outcomes(passed=1)
    lines = header_lines(result)
    # attached without a profile: the server's settings (none, as it does not answer) and the
    # generic defaults, not the embedded default's
    assert lines[0].startswith(
        "longctx profile: none: attached, no profile: the server at http://127.0.0.1:9 did not "
        "answer /v1/models when the plan was made"
    ), lines
    assert lines[1:4] == [
        "longctx model: as http://127.0.0.1:9 serves it (see the sweep summary)",
        "longctx server: http://127.0.0.1:9",
        "longctx points: 1Ki..4Ki, 1 repeat(s), 64 decode tokens",
    ]
    assert lines[4].startswith("longctx run: ")
    # asked for, but no sweep collected: still nothing made
    assert not (pytester.path / "reports").exists()


def test_the_header_follows_the_projects_ini_keys(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    pytester.makeini("[pytest]\nlongctx_to = 2Ki\nlongctx_repeats = 3\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "longctx points: 1Ki..2Ki, 3 repeat(s), 32 decode tokens" in header_lines(result)
    assert "longctx server: launched from the profile" in header_lines(result)


def test_the_header_when_the_shipped_sweep_is_named(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", "pytest_longctx.suite", "--co"
    )
    assert "longctx points: 1Ki..16Ki, 1 repeat(s), 32 decode tokens" in header_lines(result)


HEADER_KEYS = ("profile", "model", "server", "points", "run")


def sweep_header(result: pytest.RunResult) -> list[str]:
    """The header's own lines (not the progress display's ``longctx next:``)."""
    return [line for line in header_lines(result) if line.split(":")[0][8:] in HEADER_KEYS]


def test_the_header_when_only_collection_finds_the_sweep(sweep_dir: pytest.Pytester) -> None:
    """``pytest --co`` in a project whose sweep no option or ini key names: the header's lines
    follow the collection, once; ``-q`` prints no header, so none of them either."""
    sweep_dir.makeini("[pytest]\n")
    result = sweep_dir.runpytest_subprocess("-p", "no:cacheprovider", "--co")
    said = result.stdout.str()
    lines = header_lines(result)
    assert [line.split(":")[0] for line in lines] == [f"longctx {k}" for k in HEADER_KEYS], said
    assert lines[0] == f"longctx profile: cpu-tiny: {load_profile('cpu-tiny').description}"
    assert "longctx server: launched from the profile" in lines
    assert "longctx points: 1Ki..16Ki, 1 repeat(s), 32 decode tokens" in lines
    collected = next(i for i, line in enumerate(result.outlines) if line.startswith("collected"))
    assert result.outlines.index(lines[0]) > collected, said
    assert not (sweep_dir.path / "reports").exists()
    quiet = sweep_dir.runpytest_subprocess("-p", "no:cacheprovider", "--co", "-q")
    assert header_lines(quiet) == [], quiet.stdout.str()


def test_the_header_of_a_sweep_run_without_any_option(sweep_dir: pytest.Pytester) -> None:
    """Plain ``pytest`` (here launching the stand-in server): the header once, after the
    collection, naming the server it launches."""
    sweep_dir.makeini("[pytest]\n")
    sweep_dir.makeconftest(launch_fake_conftest())
    result = sweep_dir.runpytest_subprocess("-p", "no:cacheprovider", "-m", "len==1Ki")
    said = result.stdout.str() + result.stderr.str()
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), said
    lines = sweep_header(result)
    assert [line.split(":")[0] for line in lines] == [f"longctx {k}" for k in HEADER_KEYS], said
    assert "longctx server: launched from the profile" in lines, said
    assert records_of(sweep_dir.path / "reports")[0].run_id in lines[-1], said


def test_no_header_in_a_session_that_does_not_ask(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert header_lines(result) == []


# -- JUnit XML -----------------------------------------------------------------------------


def test_junit_xml_names_the_class_of_a_point_that_did_not_pass(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """CI reads why a point failed from its testcase, not only that it failed."""
    junit = pytester.path / "junit.xml"
    result, records = fault_session(pytester, fake_vllm)(
        "--longctx-to=2Ki",
        "--longctx-ttft-timeout=0.5",
        f"--junitxml={junit}",
        long_prompt_from=2048,
        first_token_delay_s=2.0,
        token_delay_s=0.01,  # a decode the stream check can judge on a busy host
    )
    result.assert_outcomes(passed=1, failed=1)
    cases = junit_cases(junit)
    passed, failed = (cases[r.nodeid.rsplit("::", 1)[-1]] for r in records)
    assert passed["longctx_outcome"] == "passed", passed
    assert "longctx_failure_class" not in passed and "longctx_reason" not in passed, passed
    assert failed["longctx_outcome"] == "failed", failed
    assert failed["longctx_failure_class"] == "timeout", failed
    assert "--longctx-ttft-timeout" in failed["longctx_reason"], failed
    assert failed["longctx_reason"] == records[1].reason
