"""The regression gate as CI sees it: whole pytest sessions, their items, exit codes and reports.

Most sessions here resume a run folder written by hand, so every sweep item is reported from
its record and no server is needed (a guard fails any attempt to start one). The gate on
real vLLM: tests/e2e/test_e2e_gate_session.py.
"""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fabricated_runs import FINGERPRINT, NOW, Figures, make_records
from longctx_testing import (
    NO_PLOTS,
    SWEEP_TEST,
    cli,
    outcomes,
    regression_outcomes,
    sweep_outcomes,
)

from pytest_longctx.campaign import lifecycle
from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.core.sizes import format_size
from pytest_longctx.gate import parse_tolerances
from pytest_longctx.profiles import PROFILE_DIR, load_profile

KI = 1024
RUN_ID = "20260101T000000Z-c0ffee"
REPEATS = 3


def write_records(path: Path, records: list[Record]) -> Path:
    for record in records:
        append_record(path, record)
    return path


def scaled(figures: Figures, lengths: set[int], ttft: float, decode: float) -> dict:
    """``figures`` with TTFT and decode throughput multiplied at ``lengths``."""
    return {
        length: (
            [t * ttft for t in ttfts] if length in lengths else list(ttfts),
            [d * decode for d in decodes] if length in lengths else list(decodes),
        )
        for length, (ttfts, decodes) in figures.items()
    }


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process sessions fail at once, instead of launching vLLM, if they ask for a server."""

    def refuse(self: lifecycle.ServerLifecycle) -> None:
        raise AssertionError("a session that needs no measurement started a server")

    monkeypatch.setattr(lifecycle.ServerLifecycle, "start", refuse)


@pytest.fixture
def gate_dir(pytester: pytest.Pytester, no_server: None) -> pytest.Pytester:
    """A project with the sweep test and a finished run of NOW to resume; no server allowed."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    write_records(pytester.path / "reports" / RUN_ID / "results.jsonl", make_records(RUN_ID, NOW))
    return pytester


def baseline_file(pytester: pytest.Pytester, figures: Figures, **fingerprint: object) -> Path:
    records = make_records("20251201T000000Z-ba5e11", figures, {**FINGERPRINT, **fingerprint})
    return write_records(pytester.path / "baseline.jsonl", records)


#: The built-in tolerances, pinned: the profile's calibrated ones change with each calibration.
BUILT_IN = "--longctx-tolerance=ttft=10%,decode=5%,itl=10%"


def run_gate(
    pytester: pytest.Pytester, baseline: Path | str, *args: str, tolerance: str | None = BUILT_IN
) -> pytest.RunResult:
    """The gate on the resumed run. No plots: drawing them takes seconds a session and is
    test_reports.py's subject, not the gate's (the reports' words and tables are the same)."""
    return pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-v",
        NO_PLOTS,
        f"--longctx-output={pytester.path / 'reports'}",
        f"--longctx-resume={RUN_ID}",
        f"--longctx-baseline={baseline}",
        "--longctx-to=8Ki",
        f"--longctx-repeats={REPEATS}",
        *([tolerance] if tolerance else []),
        *args,
    )


SIZES = [format_size(n) for n in sorted(NOW)]
#: The baseline 30% faster at 2Ki and 8Ki: TTFT 30% lower, decode 30% higher.
FASTER_BASELINE = scaled(NOW, {2 * KI, 8 * KI}, ttft=0.7, decode=1.3)


# -- verdicts ----------------------------------------------------------------------------------


def test_equal_baseline_passes_every_item(gate_dir: pytest.Pytester) -> None:
    result = run_gate(gate_dir, baseline_file(gate_dir, NOW))

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert regression_outcomes(result) == dict.fromkeys(SIZES, "PASSED")
    assert sweep_outcomes(result) == {"PASSED"}
    result.assert_outcomes(passed=len(SIZES) * (REPEATS + 1))


def test_thirty_percent_slower_fails_exactly_the_affected_lengths(
    gate_dir: pytest.Pytester,
) -> None:
    result = run_gate(gate_dir, baseline_file(gate_dir, FASTER_BASELINE))

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert regression_outcomes(result) == {
        "1Ki": "PASSED",
        "2Ki": "FAILED",
        "4Ki": "PASSED",
        "8Ki": "FAILED",
    }
    assert sweep_outcomes(result) == {"PASSED"}
    output = result.stdout.str()
    # Worked by hand. 2Ki now: TTFT 0.100, 0.102, 0.098 s -> mean 0.100, sample std 0.002;
    # the baseline is 0.7x that -> 0.0700 ± 0.0014. Change 0.100 / 0.070 - 1 = +42.9%.
    # Welch: SE = sqrt(0.0014^2/3 + 0.002^2/3) = 0.00141 s, t = 0.030 / 0.00141 = 21.28, and
    # df = (1.987e-6)^2 / ((6.53e-7)^2/2 + (1.333e-6)^2/2) = 3.58.
    within = "; one-session baseline: within-session noise only)"
    assert (
        "TTFT at 2Ki regressed: baseline 0.0700 ± 0.0014 s (n=3), now 0.100 ± 0.002 s (n=3), "
        "+42.9% (tolerance +10%, p="
    ) in output
    assert " < 0.01, Welch t=21.28, df=3.6" + within in output
    # Decode now 500, 510, 490 -> 500 ± 10; baseline 1.3x -> 650 ± 13; 500 / 650 - 1 = -23.1%.
    assert (
        "decode throughput at 2Ki fell: baseline 650 ± 13 tok/s (n=3), now 500 ± 10 tok/s (n=3), "
        "-23.1% (tolerance -5%, p="
    ) in output
    # 8Ki: TTFT now 0.400 ± 0.008 vs 0.280 ± 0.0056 (three digits of the mean, one of the std);
    # decode now 450 ± 9 vs 585 ± 11.7.
    assert "TTFT at 8Ki regressed: baseline 0.280 ± 0.006 s (n=3), now 0.400 ± 0.008 s" in output
    assert (
        "decode throughput at 8Ki fell: baseline 585 ± 12 tok/s (n=3), now 450 ± 9 tok/s" in output
    )
    # Every inter-token gap is 1/decode, so the median ITL is exactly 1.3x the baseline's.
    assert re.search(
        r"median inter-token latency at 8Ki rose: .* \+30\.0% \(tolerance \+10%", output
    )
    assert "at 1Ki" not in _failures_section(output)
    assert "at 4Ki" not in _failures_section(output)


def _failures_section(output: str) -> str:
    start = output.index("= FAILURES =") if "= FAILURES =" in output else len(output)
    return output[start:]


def test_noise_within_the_run_to_run_spread_passes(gate_dir: pytest.Pytester) -> None:
    # Every length a little off (within tolerance), and at 4Ki one wild baseline repeat: the
    # baseline mean 0.2300 is 13% above now's 0.200 (beyond the 10% tolerance), but its sample
    # std of 0.0608 gives Welch SE = sqrt(0.0608^2/3 + 0.004^2/3) = 0.0352 s: t = 0.85 on about
    # 2 df, p = 0.24, far from the 0.01 level.
    noisy = {
        1 * KI: ([0.052, 0.050, 0.051], [515.0, 525.0, 512.0]),
        2 * KI: ([0.097, 0.104, 0.101], [505.0, 495.0, 500.0]),
        4 * KI: ([0.300, 0.200, 0.190], [470.0, 490.0, 480.0]),
        8 * KI: ([0.410, 0.395, 0.401], [447.0, 455.0, 452.0]),
    }
    result = run_gate(gate_dir, baseline_file(gate_dir, noisy))

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert regression_outcomes(result) == dict.fromkeys(SIZES, "PASSED")


def test_only_points_without_a_record_ask_for_the_server(gate_dir: pytest.Pytester) -> None:
    """The guard behind every session here: 16Ki has no record, so it alone needs a server."""
    result = run_gate(gate_dir, baseline_file(gate_dir, NOW), "--longctx-to=16Ki")

    found = outcomes(result)
    assert {name for name, outcome in found.items() if outcome == "ERROR"} == {
        f"test_prefill_decode[len=16Ki-rep={repeat}]" for repeat in range(REPEATS)
    }
    assert found["test_regression[len=16Ki]"] == "SKIPPED"  # the baseline has no 16Ki
    assert regression_outcomes(result) == {**dict.fromkeys(SIZES, "PASSED"), "16Ki": "SKIPPED"}
    assert "needs no measurement started a server" in result.stdout.str()


# -- fingerprints ------------------------------------------------------------------------------


def test_a_baseline_of_another_setup_is_refused_with_the_differences(
    gate_dir: pytest.Pytester,
) -> None:
    baseline = baseline_file(gate_dir, NOW, vllm_version="0.31.0", tensor_parallel_size=2)

    refused = run_gate(gate_dir, baseline)

    assert refused.ret == pytest.ExitCode.TESTS_FAILED
    assert regression_outcomes(refused) == dict.fromkeys(SIZES, "FAILED")
    refused.stdout.fnmatch_lines(
        [
            "*refusing to compare unlike with unlike (use --longctx-baseline-force*",
            "*tensor_parallel_size: baseline 2, now 1",
            "*vllm_version: baseline 0.31.0, now 0.32.0",
        ]
    )
    assert "revision:" not in refused.stdout.str()  # only what differs is listed

    forced = run_gate(gate_dir, baseline, "--longctx-baseline-force")

    assert forced.ret == pytest.ExitCode.OK, forced.stdout.str()
    assert regression_outcomes(forced) == dict.fromkeys(SIZES, "PASSED")


# -- reports -----------------------------------------------------------------------------------


def test_junit_xml_carries_the_regression_failures(gate_dir: pytest.Pytester) -> None:
    junit = gate_dir.path / "junit.xml"
    run_gate(gate_dir, baseline_file(gate_dir, FASTER_BASELINE), f"--junitxml={junit}")

    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    failing = {name for name, case in cases.items() if case.find("failure") is not None}
    assert failing == {"test_regression[len=2Ki]", "test_regression[len=8Ki]"}
    assert {f"test_regression[len={size}]" for size in SIZES} <= set(cases)
    message = cases["test_regression[len=2Ki]"].find("failure").get("message")
    assert "TTFT at 2Ki regressed: baseline 0.0700 ± 0.0014 s (n=3)" in message
    assert "decode throughput at 2Ki fell: baseline 650 ± 13 tok/s (n=3)" in message
    assert "8Ki" not in message


def html_tests(page: Path) -> dict[str, list[dict]]:
    """pytest-html 4's results: nodeid -> reports, from the JSON it embeds in the page."""
    match = re.search(
        r'<div id="data-container" data-jsonblob="([^"]*)"', page.read_text(encoding="utf-8")
    )
    assert match, f"no data container in {page}"
    return json.loads(html.unescape(match.group(1)))["tests"]


def test_html_report_shows_the_regression_failures(gate_dir: pytest.Pytester) -> None:
    run_gate(gate_dir, baseline_file(gate_dir, FASTER_BASELINE))

    tests = html_tests(gate_dir.path / "reports" / RUN_ID / "report.html")
    results = {
        nodeid.split("::", 1)[1]: [report["result"] for report in reports]
        for nodeid, reports in tests.items()
        if "test_regression" in nodeid
    }
    assert results == {
        "test_regression[len=1Ki]": ["Passed"],
        "test_regression[len=2Ki]": ["Failed"],
        "test_regression[len=4Ki]": ["Passed"],
        "test_regression[len=8Ki]": ["Failed"],
    }
    log = tests["test_sweep.py::test_regression[len=8Ki]"][0]["log"]
    assert "TTFT at 8Ki regressed: baseline 0.280 ± 0.006 s (n=3)" in html.unescape(log)


# -- usage errors ------------------------------------------------------------------------------


def usage_error_line(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    return errors[0]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("", "the file is empty"),
        ("{not json\n", "every line is corrupt"),
    ],
)
def test_a_missing_or_malformed_baseline_is_a_usage_error(
    gate_dir: pytest.Pytester, content: str | None, problem: str
) -> None:
    baseline = gate_dir.path / "baseline.jsonl"
    if content is not None:
        baseline.write_text(content, encoding="utf-8")

    line = usage_error_line(run_gate(gate_dir, baseline))

    assert "--longctx-baseline" in line
    assert str(baseline) in line
    assert problem in line


def test_a_baseline_without_passed_points_is_a_usage_error(gate_dir: pytest.Pytester) -> None:
    failed = [
        Record(**{**record.__dict__, "outcome": "failed", "figures": {}})
        for record in make_records("20251201T000000Z-ba5e11", NOW)
    ]
    baseline = write_records(gate_dir.path / "baseline.jsonl", failed)

    line = usage_error_line(run_gate(gate_dir, baseline))

    assert str(baseline) in line
    assert "none of its 12 records passed (12 failed)" in line


def test_usage_errors_come_before_any_server(pytester: pytest.Pytester, no_server: None) -> None:
    """Without resume, a session that got past configuration would launch vLLM."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--longctx-output={output}", "--longctx-baseline=nowhere.jsonl"
    )
    assert "nowhere.jsonl: no such file" in usage_error_line(result)
    assert not output.exists()


@pytest.mark.parametrize("with_baseline", [True, False], ids=["with-baseline", "alone"])
def test_a_bad_tolerance_names_the_option(gate_dir: pytest.Pytester, with_baseline: bool) -> None:
    args = [f"--longctx-baseline={baseline_file(gate_dir, NOW)}"] if with_baseline else []
    result = gate_dir.runpytest(
        "-p", "no:cacheprovider", "--longctx-tolerance=ttft=fast", "--longctx-to=8Ki", *args
    )

    line = usage_error_line(result)
    assert "--longctx-tolerance" in line
    assert "'ttft=fast' has a bad percentage 'fast'" in line
    assert "METRIC=PERCENT" in line  # the accepted form


# -- improvements and one-sided lengths --------------------------------------------------------


def test_improvements_pass_with_a_note_and_one_sided_lengths_are_reported(
    gate_dir: pytest.Pytester,
) -> None:
    # The baseline: 4Ki 30% slower than now, no 1Ki, and a 16Ki this session does not measure.
    baseline = dict(scaled(NOW, {4 * KI}, ttft=1.3, decode=0.7))
    del baseline[1 * KI]
    baseline[16 * KI] = ([0.800, 0.816, 0.784], [420.0, 428.4, 411.6])

    result = run_gate(gate_dir, baseline_file(gate_dir, baseline), "-rs")

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert regression_outcomes(result) == {
        "1Ki": "SKIPPED",
        "2Ki": "PASSED",
        "4Ki": "PASSED",
        "8Ki": "PASSED",
    }
    output = result.stdout.str()
    # 4Ki now 0.200 ± 0.004 s against 0.260 ± 0.0052: 0.200 / 0.260 - 1 = -23.1%;
    # decode now 480 ± 9.6 against 336 ± 6.72: 480 / 336 - 1 = +42.9%.
    refresh = "; refresh the baseline so later changes are measured from here"
    result.stdout.fnmatch_lines(
        [
            "pytest-longctx gate: TTFT at 4Ki improved: baseline 0.260 ± 0.005 s (n=3), "
            "now 0.200 ± 0.004 s (n=3), -23.1% (beyond tolerance 10%, *)" + refresh,
            "pytest-longctx gate: decode throughput at 4Ki rose: baseline 336 ± 7 tok/s (n=3), "
            "now 480 ± 10 tok/s (n=3), +42.9% (beyond tolerance 5%, *)" + refresh,
            "pytest-longctx gate: median inter-token latency at 4Ki fell: *, -30.0% *" + refresh,
        ]
    )
    assert output.count(refresh) == 3  # nothing about the lengths that stayed put
    assert "pytest-longctx gate: baseline lengths not measured in this session: 16Ki" in output
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_sweep.py:*: "
            "1Ki: absent from the baseline (measured now); refresh the baseline to gate it"
        ]
    )


# -- order -------------------------------------------------------------------------------------


def collected(pytester: pytest.Pytester, baseline: Path, *args: str) -> list[str]:
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--collect-only",
        "-q",
        f"--longctx-baseline={baseline}",
        "--longctx-to=8Ki",
        f"--longctx-repeats={REPEATS}",
        *args,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return [line.split("::", 1)[1] for line in result.outlines if line.startswith("test_sweep")]


def point(size: str, repeat: int) -> str:
    return f"test_prefill_decode[len={size}-rep={repeat}]"


def gate(size: str) -> str:
    return f"test_regression[len={size}]"


def test_regression_items_follow_the_last_repeat_of_their_length(
    gate_dir: pytest.Pytester,
) -> None:
    baseline = baseline_file(gate_dir, NOW)

    by_length = collected(gate_dir, baseline, "--longctx-order=length")
    assert by_length == [
        name
        for size in SIZES
        for name in [point(size, 0), point(size, 1), point(size, 2), gate(size)]
    ]

    pass_major = collected(gate_dir, baseline)
    expected = [point(size, repeat) for repeat in (0, 1) for size in SIZES]
    expected += [name for size in SIZES for name in (point(size, 2), gate(size))]
    assert pass_major == expected

    selected = collected(gate_dir, baseline, "-m", "len>=4Ki", "--longctx-order=length")
    assert selected == [
        name
        for size in ("4Ki", "8Ki")
        for name in [*(point(size, r) for r in range(3)), gate(size)]
    ]


# -- baseline histories, calibration and the gate's level -------------------------------------


def session_run(folder: Path, run_id: str, figures: Figures, hour: int, **fingerprint) -> Path:
    """A finished run folder of ``figures``, its records stamped ``hour`` hours into the day."""
    records = [
        Record(**{**record.__dict__, "finished_at": record.finished_at + 3600 * hour})
        for record in make_records(run_id, figures, {**FINGERPRINT, **fingerprint})
    ]
    write_records(folder / run_id / "results.jsonl", records)
    return folder / run_id


def stored_sessions(path: Path) -> list[str]:
    return sorted({r.run_id for r in read_records(path).records})


def test_baseline_command_keeps_a_capped_history_of_sessions(tmp_path: Path) -> None:
    runs = {name: session_run(tmp_path, name, NOW, hour) for hour, name in enumerate("abcd")}
    history = tmp_path / "longctx-baseline.jsonl"

    two = cli("baseline", runs["a"], runs["b"], "--output", history)
    assert two.returncode == 0, two.stderr
    assert f"{history}: 24 passed record(s) of 2 session(s); commit it" in two.stdout
    assert stored_sessions(history) == ["a", "b"]

    capped = cli("baseline", runs["c"], "--output", history, "--append", "--max-sessions", "2")
    assert capped.returncode == 0, capped.stderr
    assert "of 2 session(s) (2 kept from the file), the 1 oldest dropped (cap 2)" in capped.stdout
    assert stored_sessions(history) == ["b", "c"]

    # The cap is stored in the file's header: later appends keep it without repeating it.
    assert cli("baseline", runs["d"], "--output", history, "--append").returncode == 0
    assert stored_sessions(history) == ["c", "d"]
    assert json.loads(history.read_text().splitlines()[0]) == {
        "longctx_baseline": 1,
        "max_sessions": 2,
    }

    # Appending the same run again replaces its session instead of counting it twice.
    assert cli("baseline", runs["d"], "--output", history, "--append").returncode == 0
    assert len(read_records(history).records) == 24

    # A run of another setup does not join the history unless forced.
    other = session_run(tmp_path, "e", NOW, 5, vllm_version="0.33.0")
    refused = cli("baseline", other, "--output", history, "--append")
    assert refused.returncode == 2
    assert "--append: the new run(s) measured another setup than" in refused.stderr
    assert "vllm_version: baseline 0.32.0, now 0.33.0" in refused.stderr
    assert stored_sessions(history) == ["c", "d"]

    # Without --append the file starts over, and a one-session baseline is labelled.
    fresh = cli("baseline", runs["a"], "--output", history)
    assert fresh.returncode == 0
    assert stored_sessions(history) == ["a"]
    assert "one session, so the gate's noise estimate is within-session only" in fresh.stdout


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            ["--max-sessions", "0"],
            "argument --max-sessions: --max-sessions=0: expected a whole number >= 1",
        ),
        (["--max-sessions", "few"], "--max-sessions=few: expected a whole number >= 1"),
    ],
)
def test_baseline_command_usage_errors_name_the_option(
    tmp_path: Path, args: list[str], problem: str
) -> None:
    run = session_run(tmp_path, "a", NOW, 0)
    done = cli("baseline", run, "--output", tmp_path / "b.jsonl", *args)
    assert done.returncode == 2
    assert problem in done.stderr


#: Four sessions of the same build: TTFT at 2Ki moves between server starts (x0.85, 0.95, 0.80,
#: 0.90 of now's), everything else stays put.
HISTORY_SCALES = (0.85, 0.95, 0.80, 0.90)


def history_baseline(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "history.jsonl"
    for hour, scale in enumerate(HISTORY_SCALES):
        run_id = f"20251201T0{hour}0000Z-5e5510"
        write_records(path, make_records(run_id, scaled(NOW, {2 * KI}, ttft=scale, decode=1.0)))
    return path


def test_a_history_judges_between_sessions_where_one_session_cries_wolf(
    gate_dir: pytest.Pytester,
) -> None:
    one = baseline_file(gate_dir, scaled(NOW, {2 * KI}, ttft=HISTORY_SCALES[0], decode=1.0))
    single = run_gate(gate_dir, one)
    # Against the first session alone, now's 0.100 s is +17.6% and 9.9 Welch SEs above 0.085 s.
    assert regression_outcomes(single)["2Ki"] == "FAILED"
    single.stdout.fnmatch_lines(
        [
            "*TTFT at 2Ki regressed: baseline 0.0850 ± 0.0017 s (n=3), now 0.100 ± 0.002 s (n=3), "
            "+17.6% (tolerance +10%, p=0.00033 < 0.01, Welch t=9.90, df=3.9; "
            "one-session baseline: within-session noise only)",
            "pytest-longctx gate: tolerances ttft=10%,decode=5%,itl=10% (from "
            "--longctx-tolerance), level 0.01, one-session baseline: within-session noise only",
            "pytest-longctx gate: the baseline holds one session, so the noise estimate is "
            "within-session only; add sessions with*--append*",
        ]
    )

    history = run_gate(gate_dir, history_baseline(gate_dir), "-rA")
    # Session means 0.085, 0.095, 0.080, 0.090: 0.0875 ± 0.00645 s. Now +14.3%, beyond the
    # tolerance, but t = 0.0125 / (0.00645 * sqrt(1 + 1/4)) = 1.73 on 3 df: p = 0.091.
    assert history.ret == pytest.ExitCode.OK, history.stdout.str()
    assert regression_outcomes(history) == dict.fromkeys(SIZES, "PASSED")
    output = history.stdout.str()
    assert (
        "pytest-longctx gate: tolerances ttft=10%,decode=5%,itl=10% (from --longctx-tolerance), "
        "level 0.01, 4 baseline sessions: between-session noise"
    ) in output
    assert "holds one session" not in output

    # The same change at a looser level, 0.1 > 0.091, is a regression.
    loose = run_gate(gate_dir, history_baseline(gate_dir), "--longctx-gate-level=0.1")
    assert regression_outcomes(loose) == {**dict.fromkeys(SIZES, "PASSED"), "2Ki": "FAILED"}
    loose.stdout.fnmatch_lines(
        [
            "*TTFT at 2Ki regressed: baseline 0.0875 ± 0.0065 s between 4 sessions (n=12), "
            "now 0.100 ± 0.002 s (n=3), +14.3% (tolerance +10%, p=0.091 < 0.1, t=1.73, df=3.0; "
            "against 4 baseline sessions)"
        ]
    )


@pytest.mark.parametrize("value", ["0", "0.5", "often", "60%"])
def test_a_bad_gate_level_names_the_option(gate_dir: pytest.Pytester, value: str) -> None:
    line = usage_error_line(
        run_gate(gate_dir, baseline_file(gate_dir, NOW), f"--longctx-gate-level={value}")
    )
    assert f"--longctx-gate-level={value}: expected a probability between 0 and 0.5" in line


def test_the_gate_level_has_an_ini_key(gate_dir: pytest.Pytester) -> None:
    gate_dir.makeini("[pytest]\nlongctx_gate_level = 0.1\n")
    result = run_gate(gate_dir, history_baseline(gate_dir))
    assert regression_outcomes(result)["2Ki"] == "FAILED"
    assert "level 0.1, 4 baseline sessions" in result.stdout.str()


def test_calibrate_stores_tolerances_that_the_gate_then_uses(gate_dir: pytest.Pytester) -> None:
    runs = [
        session_run(gate_dir.path / "calib", f"2025120{k}T000000Z-ca11b0", figures, k)
        for k, figures in enumerate(
            # TTFT session means x1.0, x1.1, x0.9 at every length: between-session CV 10%.
            scaled(NOW, set(NOW), ttft=scale, decode=1.0)
            for scale in (1.0, 1.1, 0.9)
        )
    ]
    stored = gate_dir.path / "calibrated.jsonl"

    done = cli("calibrate", "--runs", *runs, "--level", "0.01", "--output", stored)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("calibration over 3 sessions, level 0.01")
    # Log session means spread by 0.10038; t_{0.01, 2} = 6.965: b = 6.965 * 0.10038 *
    # sqrt(1 + 1/3) = 0.8072 and e^b - 1 = 124.2% -> 125%. Decode and ITL have a 2% spread
    # within a session but none between sessions: 1%, the floor.
    table = [line.split() for line in lines]
    assert ["length", "metric", "mean", "between", "CV", "within", "CV", "tolerance"] in table
    assert ["1Ki", "ttft", "0.0500", "s", "10.0%", "2.0%", "125%"] in table
    assert ["8Ki", "decode", "450", "tok/s", "0.0%", "2.0%", "1%"] in table
    assert "proposed tolerances: ttft=125%,decode=1%,itl=1%" in lines
    header = json.loads(stored.read_text().splitlines()[0])
    assert header["tolerance"] == "ttft=125%,decode=1%,itl=1%"
    assert header["calibration"]["sessions"] == 3

    # Gated against the three stored sessions (whose mean is now's) with their tolerances.
    result = run_gate(gate_dir, stored, "-rA", tolerance=None)
    output = result.stdout.str()
    assert (
        f"tolerances ttft=125%,decode=1%,itl=1% (from the baseline's calibration ({stored}))"
        in output
    )
    assert "3 baseline sessions: between-session noise" in output
    assert regression_outcomes(result) == dict.fromkeys(SIZES, "PASSED")
    # --longctx-tolerance still wins over the stored tolerances.
    pinned = run_gate(gate_dir, stored)
    assert "(from --longctx-tolerance)" in pinned.stdout.str()


def test_calibrate_runs_k_separate_sessions(pytester: pytest.Pytester, fake_vllm) -> None:  # noqa: ANN001
    """Each session is its own pytest process; here they attach to a fake server."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    reports, stored = pytester.path / "calib", pytester.path / "calibrated.jsonl"
    done = cli(
        "calibrate",
        "--sessions=2",
        "--test=test_sweep.py",
        f"--reports={reports}",
        f"--output={stored}",
        "--",
        f"--longctx-url={fake_vllm.url}",
        "--longctx-to=2Ki",
        "--longctx-repeats=2",
        "--longctx-decode-tokens=8",
        NO_PLOTS,
        cwd=pytester.path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(path.name for path in reports.iterdir() if path.name != "latest")
    assert "index.html" in runs  # each session lists the runs of its output root
    runs.remove("index.html")
    assert len(runs) == 2
    assert "session 1/2: " in done.stdout and "session 2/2: " in done.stdout
    assert "calibration over 2 sessions, level 0.01" in done.stdout
    assert "the server is not restarted between sessions" in done.stderr  # attached by URL
    assert stored_sessions(stored) == runs
    assert sorted((r.length, r.repeat) for r in read_records(stored).records) == sorted(
        [(1024, 0), (1024, 1), (2048, 0), (2048, 1)] * 2
    )
    header = json.loads(stored.read_text().splitlines()[0])
    assert header["calibration"]["run_ids"] == runs
    assert {row["length"] for row in header["calibration"]["rows"]} == {1024, 2048}


def test_calibrate_refuses_a_single_session(tmp_path: Path) -> None:
    done = cli("calibrate", "--runs", session_run(tmp_path, "a", NOW, 0))
    assert done.returncode == 2
    assert "calibration needs two or more sessions with passed points, got 1" in done.stderr


def test_the_profile_gate_table_supplies_default_tolerances(gate_dir: pytest.Pytester) -> None:
    spec = load_profile("cpu-tiny").gate.tolerance
    assert spec, "the embedded profile ships calibrated tolerances in its [gate] table"
    result = run_gate(gate_dir, baseline_file(gate_dir, NOW), tolerance=None)
    expected = parse_tolerances(spec).describe()
    assert f"tolerances {expected} (from profile cpu-tiny [gate])" in result.stdout.str()


def test_a_bad_profile_gate_tolerance_is_a_usage_error(pytester: pytest.Pytester) -> None:
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text(encoding="utf-8")
    profile = pytester.path / "mine.toml"
    profile.write_text(text + '\n[gate]\ntolerance = "ttft=fast"\n', encoding="utf-8")
    if text.count("[gate]"):  # the shipped table and ours: keep only ours
        profile.write_text(
            text.split("[gate]")[0] + '[gate]\ntolerance = "ttft=fast"\n', encoding="utf-8"
        )
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--longctx-profile={profile}", "--longctx-plan"
    )
    line = usage_error_line(result)
    assert f"profile {profile}: [gate] tolerance: 'ttft=fast'" in line
    assert "--longctx-tolerance" not in line  # the profile's key, not the option, is wrong
