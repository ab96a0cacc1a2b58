"""The sweep as a parametrized suite: items, ids, order, options, ini keys and -m/-k selection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_longctx.core.sizes import SizeError, format_size, parse_size, powers_of_two_between
from pytest_longctx.session.option_parsing import read_settings
from pytest_longctx.session.selection import Comparison, SelectionError, translate

REPO = Path(__file__).resolve().parents[3]
SWEEP = """
def test_prefill_decode(longctx_point):
    pass
"""
ALL_17 = [
    "1Ki",
    "2Ki",
    "4Ki",
    "8Ki",
    "16Ki",
    "32Ki",
    "64Ki",
    "128Ki",
    "256Ki",
    "512Ki",
    "1Mi",
    "2Mi",
    "4Mi",
    "8Mi",
    "16Mi",
    "32Mi",
    "64Mi",
]


@pytest.fixture
def sweep(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_sweep=SWEEP)
    return pytester


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def ids(lengths: list[str], rep: int = 0) -> list[str]:
    return [f"test_prefill_decode[len={n}-rep={rep}]" for n in lengths]


# -- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("1Ki", 1024), ("64Mi", 67108864), ("1Gi", 1 << 30), ("1048576", 1048576), (" 4ki ", 4096)],
)
def test_parse_size(text: str, tokens: int) -> None:
    assert parse_size(text) == tokens


@pytest.mark.parametrize("text", ["banana", "1Zi", "", "-4", "0", "1.5Mi", "64MB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(SizeError, match="1Ki, 64Mi, 1Gi"):
        parse_size(text)


def test_parse_size_takes_a_number_and_refuses_a_boolean() -> None:
    """A profile's TOML may give a count as a number; ``true`` is no length."""
    assert parse_size(4096) == 4096
    for flag in (True, False):
        with pytest.raises(SizeError, match="1Ki, 64Mi, 1Gi"):
            parse_size(flag)


def test_format_and_powers() -> None:
    assert [format_size(n) for n in powers_of_two_between(1024, 64 * 1024**2)] == ALL_17
    assert powers_of_two_between(1000, 5000) == [1024, 2048, 4096]  # FROM up, TO down
    assert powers_of_two_between(4096, 4096) == [4096]
    assert powers_of_two_between(5000, 6000) == []
    assert format_size(1536) == "1536"


def test_translate_keeps_the_rest_of_the_expression() -> None:
    translated = translate("not (len >= 16Mi) and rep==0 and smoke", "-m")
    assert translated.text == "not (longctx_len_ge_16777216_) and longctx_rep_eq_0_ and smoke"
    assert translated.comparisons == (Comparison("len", ">=", 16 << 20), Comparison("rep", "==", 0))


def test_translate_leaves_test_ids_alone() -> None:
    assert translate("test_prefill_decode[len=1Ki-rep=0]", "-k").comparisons == ()


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("len<=1Zi", "'1Zi' is not a length"),
        ("len<", "nothing after '<'"),
        ("len=4Ki", "write '=='"),
        ("rep>=x", "not a repeat index"),
    ],
)
def test_translate_errors(expression: str, needle: str) -> None:
    with pytest.raises(SelectionError, match="-m") as info:
        translate(expression, "-m")
    assert needle in str(info.value)
    assert "<=" in str(info.value)  # the accepted form is spelled out


# -- collection ----------------------------------------------------------------------------------


def test_full_range_ids_in_order(sweep: pytest.Pytester) -> None:
    assert collected(sweep, "--longctx-to=64Mi") == ids(ALL_17)


def test_default_range_comes_from_the_profile(sweep: pytest.Pytester) -> None:
    assert collected(sweep) == ids(["1Ki", "2Ki", "4Ki", "8Ki", "16Ki"])  # cpu-tiny
    assert collected(sweep, "--longctx-profile=kimi-linear-mi355x") == ids(ALL_17)


def test_len_up_to_1mi(sweep: pytest.Pytester) -> None:
    assert collected(sweep, "-m", "len<=1Mi", "--longctx-to=64Mi") == ids(ALL_17[:11])


def test_window_with_repeats_is_pass_major(sweep: pytest.Pytester) -> None:
    window = ["128Ki", "256Ki", "512Ki", "1Mi", "2Mi", "4Mi", "8Mi"]
    got = collected(
        sweep, "-m", "len>64Ki and len<=8Mi", "--longctx-repeats=2", "--longctx-to=64Mi"
    )
    assert got == ids(window, 0) + ids(window, 1)


def test_length_major_order(sweep: pytest.Pytester) -> None:
    got = collected(sweep, "--longctx-to=2Ki", "--longctx-repeats=2", "--longctx-order=length")
    assert got == [
        "test_prefill_decode[len=1Ki-rep=0]",
        "test_prefill_decode[len=1Ki-rep=1]",
        "test_prefill_decode[len=2Ki-rep=0]",
        "test_prefill_decode[len=2Ki-rep=1]",
    ]


def test_not_and_rep(sweep: pytest.Pytester) -> None:
    got = collected(
        sweep, "-m", "not len>=16Mi and rep==0", "--longctx-repeats=3", "--longctx-to=64Mi"
    )
    assert got == ids(ALL_17[:14])


def test_equality_mixed_units(sweep: pytest.Pytester) -> None:
    got = collected(sweep, "-m", "len == 4Ki or len==1048576", "--longctx-to=64Mi")
    assert got == ids(["4Ki", "1Mi"])


def test_not_equal_and_parentheses(sweep: pytest.Pytester) -> None:
    got = collected(sweep, "-m", "(len != 2Ki) and (len < 8Ki or len > 32Mi)", "--longctx-to=64Mi")
    assert got == ids(["1Ki", "4Ki", "64Mi"])


def test_keyword_comparisons(sweep: pytest.Pytester) -> None:
    got = collected(
        sweep, "-k", "len>=16Mi and rep == 1", "--longctx-repeats=2", "--longctx-to=64Mi"
    )
    assert got == ids(["16Mi", "32Mi", "64Mi"], 1)
    # substring matching of -k must not confuse 1Mi (1048576) with 10Mi-ish numbers
    assert collected(sweep, "-k", "len<=1048576", "--longctx-to=16Mi") == ids(ALL_17[:11])


def test_combined_with_other_marks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_sweep="""
        import pytest
        def test_prefill_decode(longctx_point):
            pass
        @pytest.mark.smoke
        def test_other():
            pass
    """
    )
    pytester.makeini("[pytest]\nmarkers =\n    smoke: a smoke test\n")
    got = collected(pytester, "-m", "smoke or len<=2Ki", "--longctx-to=8Ki")
    assert got == ids(["1Ki", "2Ki"]) + ["test_other"]


def test_strict_mode(sweep: pytest.Pytester) -> None:
    sweep.makeini("[pytest]\nstrict = true\n")
    assert collected(sweep, "-m", "len<=2Ki and not longctx_slow") == ids(["1Ki", "2Ki"])
    result = sweep.runpytest("--collect-only", "-q", "-m", "len<=2Ki and nosuchmark")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # pytest still rejects unknown names


def test_band_marks(sweep: pytest.Pytester) -> None:
    profile = "--longctx-profile=kimi-linear-mi355x"
    assert collected(sweep, profile, "-m", "not longctx_very_slow") == ids(ALL_17[:15])
    assert collected(sweep, profile, "-m", "not longctx_slow") == ids(ALL_17[:12])
    assert collected(sweep, profile, "-m", "longctx_very_slow") == ids(["32Mi", "64Mi"])


def test_ini_keys_and_command_line_wins(sweep: pytest.Pytester) -> None:
    sweep.makeini("[pytest]\nlongctx_from = 2Ki\nlongctx_to = 8Ki\nlongctx_repeats = 2\n")
    assert collected(sweep) == ids(["2Ki", "4Ki", "8Ki"], 0) + ids(["2Ki", "4Ki", "8Ki"], 1)
    assert collected(sweep, "--longctx-to=4Ki", "--longctx-repeats=1") == ids(["2Ki", "4Ki"])


def test_raw_counts_round_to_powers_of_two(sweep: pytest.Pytester) -> None:
    assert collected(sweep, "--longctx-from=1000", "--longctx-to=5000") == ids(
        ["1Ki", "2Ki", "4Ki"]
    )


def test_mark_kwargs_are_available(sweep: pytest.Pytester) -> None:
    assert collected(sweep, "-m", "longctx(len=2048)") == ids(["2Ki"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--longctx-to=banana"], "--longctx-to=banana: expected a token count"),
        (["--longctx-repeats=0"], "--longctx-repeats=0: expected a whole number >= 1"),
        (["--longctx-from=8Ki", "--longctx-to=1Ki"], "expected FROM <= TO"),
        (["--longctx-from=32Ki"], "select no power of two"),
        (["-m", "len<=1Zi"], "-m 'len<=1Zi'"),
        (["-m", "len<"], "nothing after '<'"),
        (["-k", "rep>=two"], "not a repeat index"),
        (["--longctx-order=random"], "--longctx-order=random: expected 'pass' or 'length'"),
        (["--longctx-profile=nope"], "--longctx-profile='nope': no such profile"),
        (["--longctx-ttft-timeout=soon"], "--longctx-ttft-timeout=soon: expected a duration > 0"),
        (["--longctx-ttft-timeout=0"], "--longctx-ttft-timeout=0: expected a duration > 0"),
    ],
)
def test_bad_input_is_a_usage_error(sweep: pytest.Pytester, args: list[str], needle: str) -> None:
    result = sweep.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and needle in errors[0], result.errlines
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize(
    ("given", "seconds"), [("2m", 120.0), ("500ms", 0.5), ("90", 90.0), ("1.5h", 5400.0)]
)
def test_ttft_timeout_takes_a_duration_like_the_other_time_options(
    sweep: pytest.Pytester, given: str, seconds: float
) -> None:
    config = sweep.parseconfig(f"--longctx-ttft-timeout={given}")
    assert read_settings(config).ttft_timeout_s == seconds


def test_help_shows_the_option_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "long-context serving sweep*",
            "*--longctx-to=SIZE*",
            "*--longctx-repeats=N*",
            "*longctx_profile*",
        ]
    )


def test_repository_suite_collects_only_the_selected_sweep_items() -> None:
    """`pytest` at this repository's root runs the sweep alone: 11 lengths, none of the plugin's
    tests."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "len<=1Mi",
            "--longctx-to=64Mi",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    items = [line for line in done.stdout.splitlines() if "::" in line]
    assert items == [f"tests/test_sweep.py::{i}" for i in ids(ALL_17[:11])]


def test_a_selection_outside_the_profiles_range_says_so(sweep: pytest.Pytester) -> None:
    result = sweep.runpytest("--collect-only", "-q", "-m", "len>64Ki")  # cpu-tiny: 1Ki..16Ki
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(
        [
            "pytest-longctx: the length selection matched no point of 1Ki..16Ki (profile cpu-tiny);"
            " widen the range with --longctx-from/--longctx-to"
        ]
    )


def test_byte_sizes_are_written_in_their_largest_binary_unit() -> None:
    from pytest_longctx.core.sizes import format_bytes

    assert format_bytes(1023) == "1,023 B"
    assert format_bytes(1024) == "1.0 KiB"
    assert format_bytes(1024**2 - 1) == "1,024.0 KiB"
    assert format_bytes(1024**2) == "1.0 MiB"
    assert format_bytes(1.5 * 1024**3) == "1.5 GiB"
    assert format_bytes(3 * 1024**4) == "3,072.0 GiB"
