"""The regression gate on hand-built records: no server, every expected number worked by hand."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.core.sizes import format_size
from pytest_longctx.gate import (
    FINGERPRINT_KEYS,
    BaselineError,
    BaselineInfo,
    LevelError,
    ToleranceError,
    Tolerances,
    calibrate,
    compare,
    compare_length,
    fingerprint_differences,
    keep_newest_sessions,
    load_baseline,
    load_baseline_file,
    parse_level,
    parse_tolerances,
    regularized_beta,
    session_count,
    session_test,
    student_t_isf,
    student_t_sf,
    welch_test,
    write_baseline,
)

KI = 1024

FINGERPRINT = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "revision": "7ae557604adf67be50417f59c2c2f167def9a775",
    "profile": "gpu",
    "kv_cache_dtype": "fp8_e4m3",
    "tensor_parallel_size": 8,
    "vllm_version": "0.32.0",
    "hardware": {
        "cpu_model": "AMD EPYC 9575F 64-Core Processor",
        "cpu_count": 256,
        "gpu_count": 8,
        "gpu_names": ["NVIDIA H200"],
    },
}

# Three repeats per length, shaped like the study's Table 1 (TTFT grows, decode barely moves).
BASELINE_FIGURES = {
    1 * KI: ([0.079, 0.080, 0.081], [275.6, 275.9, 276.2]),
    2 * KI: ([0.119, 0.120, 0.121], [274.8, 275.0, 275.2]),
    4 * KI: ([0.199, 0.200, 0.201], [273.7, 274.0, 274.3]),
    8 * KI: ([0.349, 0.350, 0.351], [271.8, 272.0, 272.2]),
}


def points(
    run_id: str,
    length: int,
    ttfts: list[float],
    decodes: list[float] | None = None,
    *,
    fingerprint: dict | None = None,
    outcome: str = "passed",
) -> list[Record]:
    if decodes is None:  # decode unchanged: the baseline's mean at this length
        usual = BASELINE_FIGURES.get(length, ([], [250.0]))[1]
        decodes = [round(sum(usual) / len(usual), 6)] * len(ttfts)
    return [
        Record(
            run_id=run_id,
            nodeid=f"test_sweep[len={format_size(length)}-rep={repeat}]",
            length=length,
            repeat=repeat,
            outcome=outcome,
            reason=None if outcome == "passed" else "server returned 500",
            figures={"ttft": ttft, "decode_throughput": decode, "itl_median": 1 / decode}
            if outcome == "passed"
            else {},
            prompt_tokens=length,
            completion_tokens=128,
            fingerprint=FINGERPRINT if fingerprint is None else fingerprint,
            started_at=1_780_000_000.0 + 10 * repeat,
            finished_at=1_780_000_001.0 + 10 * repeat,
        )
        for repeat, (ttft, decode) in enumerate(zip(ttfts, decodes, strict=True))
    ]


def sweep(run_id: str, figures: dict[int, tuple[list[float], list[float]]]) -> list[Record]:
    return [record for length, (t, d) in figures.items() for record in points(run_id, length, t, d)]


def baseline_sweep() -> list[Record]:
    return sweep("base", BASELINE_FIGURES)


def by_metric(verdict) -> dict:
    return {metric_verdict.metric: metric_verdict for metric_verdict in verdict.verdicts}


# --------------------------------------------------------------------------- comparison


def test_an_equal_run_passes_at_every_length():
    report = compare(baseline_sweep(), sweep("now", BASELINE_FIGURES), Tolerances())

    assert report.passed
    assert [v.length for v in report.lengths] == [1024, 2048, 4096, 8192]
    assert {v.status for v in report.lengths} == {"ok"}
    two_ki = by_metric(report.for_length(2 * KI))
    assert set(two_ki) == {"ttft", "decode", "itl"}
    assert two_ki["ttft"].change_pct == pytest.approx(0.0)
    assert two_ki["ttft"].message == (
        "TTFT at 2Ki ok: baseline 0.120 ± 0.001 s (n=3), now 0.120 ± 0.001 s (n=3), "
        "+0.0% (tolerance +10%; one-session baseline: within-session noise only)"
    )
    assert two_ki["ttft"].noise == "within-session"


def test_a_slower_run_fails_exactly_the_slower_lengths_with_readable_messages():
    current = dict(BASELINE_FIGURES)
    # 2Ki and 8Ki: TTFT x1.3 (0.120 -> 0.156, 0.350 -> 0.455), decode x0.7 (275.0 -> 192.5,
    # 272.0 -> 190.4); 1Ki and 4Ki unchanged.
    current[2 * KI] = ([0.155, 0.156, 0.157], [192.3, 192.5, 192.7])
    current[8 * KI] = ([0.454, 0.455, 0.456], [190.2, 190.4, 190.6])

    report = compare(baseline_sweep(), sweep("now", current), parse_tolerances("ttft=10%"))

    assert not report.passed
    assert [v.length for v in report.regressed] == [2 * KI, 8 * KI]
    assert report.for_length(1 * KI).status == "ok"
    assert report.for_length(4 * KI).status == "ok"

    two_ki = by_metric(report.for_length(2 * KI))
    assert two_ki["ttft"].status == "regressed"
    assert two_ki["ttft"].change_pct == pytest.approx(30.0)  # (0.156 - 0.120) / 0.120
    # Welch: SE = sqrt(0.001^2/3 + 0.001^2/3) = 0.000816 s, t = 0.036 / 0.000816 = 44.09 on
    # (2 * 0.001^2/3)^2 / (2 * (0.001^2/3)^2 / 2) = 4 degrees of freedom.
    assert two_ki["ttft"].test.t == pytest.approx(44.09, abs=0.01)
    assert two_ki["ttft"].test.df == pytest.approx(4.0)
    assert two_ki["ttft"].message.startswith(
        "TTFT at 2Ki regressed: baseline 0.120 ± 0.001 s (n=3), now 0.156 ± 0.001 s (n=3), "
        "+30.0% (tolerance +10%, p="
    )
    assert two_ki["ttft"].message.endswith(
        " < 0.01, Welch t=44.09, df=4.0; one-session baseline: within-session noise only)"
    )
    assert two_ki["decode"].change_pct == pytest.approx(-30.0)  # (192.5 - 275.0) / 275.0
    assert two_ki["decode"].message.startswith(
        "decode throughput at 2Ki fell: baseline 275.0 ± 0.2 tok/s (n=3), "
        "now 192.5 ± 0.2 tok/s (n=3), -30.0% (tolerance -5%, p="
    )
    # Inter-token gap is 1/throughput: 1/0.7 - 1 = +42.9%.
    assert two_ki["itl"].status == "regressed"
    assert two_ki["itl"].change_pct == pytest.approx(42.857, abs=0.01)

    eight_ki = report.for_length(8 * KI)
    assert "TTFT at 8Ki regressed: baseline 0.350 ± 0.001 s (n=3), now 0.455" in eight_ki.message
    assert "+30.0% (tolerance +10%" in eight_ki.message
    assert eight_ki.message.splitlines()[0].startswith("TTFT at 8Ki regressed")
    assert report.summary_lines()[0] == (
        "regression gate (ttft=10%,decode=5%,itl=10%, level 0.01, one-session baseline: "
        "within-session noise only): 2 of 4 lengths regressed (2Ki, 8Ki)"
    )


def test_a_slowdown_hidden_in_run_to_run_noise_passes():
    # Baseline 0.200 ± 0.001; now 0.150/0.224/0.298: mean 0.224 (+12.0%), std 0.074.
    # SE = sqrt(0.001^2/3 + 0.074^2/3) = 0.04273 s, t = 0.024 / 0.04273 = 0.562; the now side
    # dominates, so df = 2.0; P(T_2 > 0.562) = 0.315 (t_2 = 0.562 sits between the table's
    # 0.289 at p=0.40 and 0.617 at p=0.30).
    current = points("now", 4 * KI, [0.150, 0.224, 0.298])
    verdict = compare_length(baseline_sweep(), current, 4 * KI, Tolerances())

    ttft = by_metric(verdict)["ttft"]
    assert ttft.status == "ok"
    assert verdict.status == "ok"
    assert ttft.change_pct == pytest.approx(12.0)
    assert ttft.test.se == pytest.approx(0.04273, abs=1e-5)
    assert ttft.test.df == pytest.approx(2.0, abs=0.01)
    assert 0.30 < ttft.test.p_worse < 0.40
    assert ttft.message == (
        "TTFT at 4Ki ok within noise: baseline 0.200 ± 0.001 s (n=3), "
        "now 0.224 ± 0.074 s (n=3), +12.0% exceeds tolerance +10% but is not significant "
        "(p=0.32 >= 0.01, Welch t=0.56, df=2.0; one-session baseline: within-session noise only)"
    )


def test_one_wild_repeat_does_not_fail_but_a_consistent_slowdown_does():
    baseline = baseline_sweep()
    # One hiccup: 0.200, 0.201, 0.290 -> mean 0.2303 (+15.2%) but std 0.0517 widens the spread.
    wild = compare_length(baseline, points("now", 4 * KI, [0.200, 0.201, 0.290]), 4 * KI)
    assert by_metric(wild)["ttft"].change_pct == pytest.approx(15.17, abs=0.01)
    assert wild.status == "ok"

    # Every repeat 12% slower, spread 0.001: 0.224 vs 0.200 is 29 Welch standard errors apart.
    steady = compare_length(baseline, points("now", 4 * KI, [0.223, 0.224, 0.225]), 4 * KI)
    assert steady.status == "regressed"
    assert by_metric(steady)["ttft"].message.startswith(
        "TTFT at 4Ki regressed: baseline 0.200 ± 0.001 s (n=3), now 0.224 ± 0.001 s (n=3), "
        "+12.0% (tolerance +10%, p="
    )
    assert by_metric(steady)["ttft"].test.t == pytest.approx(29.39, abs=0.01)  # 0.024/0.000816


def test_single_samples_fall_back_to_the_tolerance_and_say_so():
    baseline = points("base", 4 * KI, [0.200])
    slower = compare_length(baseline, points("now", 4 * KI, [0.224]), 4 * KI)
    ttft = by_metric(slower)["ttft"]
    assert ttft.status == "regressed"
    assert ttft.test is None
    assert ttft.noise == "tolerance-only"
    assert ttft.message == (
        "TTFT at 4Ki regressed: baseline 0.200 s (n=1), now 0.224 s (n=1), +12.0% "
        "(tolerance +10%, n=1 on the baseline and this run, spread unknown: "
        "judged on tolerance alone)"
    )
    # +5% is inside the tolerance: one sample each is enough to pass, and it says how it judged.
    close = by_metric(compare_length(baseline, points("now", 4 * KI, [0.210]), 4 * KI))["ttft"]
    assert close.status == "ok"
    assert close.message.endswith(
        "+5.0% (tolerance +10%; n=1 on the baseline and this run, spread unknown: "
        "judged on tolerance alone)"
    )


def test_a_single_sample_on_one_side_is_judged_on_tolerance_alone():
    # n=1 now against a quiet baseline: no Welch test (its df needs n >= 2 a side).
    quiet = compare_length(baseline_sweep(), points("now", 4 * KI, [0.224]), 4 * KI)
    ttft = by_metric(quiet)["ttft"]
    assert ttft.status == "regressed"
    assert ttft.test is None
    assert ttft.message.endswith(
        "(tolerance +10%, n=1 on this run, spread unknown: judged on tolerance alone)"
    )

    # A noisy baseline does not rescue a single sample beyond the tolerance: +12.0% fails.
    noisy = points("base", 4 * KI, [0.170, 0.200, 0.230])
    verdict = compare_length(noisy, points("now", 4 * KI, [0.224]), 4 * KI)
    assert verdict.status == "regressed"
    # n=1 in the baseline, three repeats now.
    one_base = compare_length(points("base", 4 * KI, [0.200]), steady_now(), 4 * KI)
    assert "n=1 on the baseline, spread unknown" in by_metric(one_base)["ttft"].message


def steady_now() -> list[Record]:
    return points("now", 4 * KI, [0.223, 0.224, 0.225])


def test_a_change_of_exactly_the_tolerance_passes():
    # 1.0 s -> 1.1 s is +10% on paper, 10.000000000000009% in binary floating point.
    baseline = points("base", 4 * KI, [1.0, 1.0, 1.0])
    current = points("now", 4 * KI, [1.1, 1.1, 1.1])
    assert compare_length(baseline, current, 4 * KI).status == "ok"
    current = points("now", 4 * KI, [1.101, 1.101, 1.101])
    assert compare_length(baseline, current, 4 * KI).status == "regressed"


def test_improvements_are_reported_and_do_not_fail():
    # 0.200 -> 0.150 is -25.0%; decode 274.0 -> 301.4 is +10.0%.
    current = points("now", 4 * KI, [0.149, 0.150, 0.151], [301.1, 301.4, 301.7])
    report = compare(baseline_sweep(), current)

    assert report.passed
    four_ki = report.for_length(4 * KI)
    assert four_ki.status == "improved"
    assert report.improved == (four_ki,)
    ttft = by_metric(four_ki)["ttft"]
    assert ttft.change_pct == pytest.approx(-25.0)
    assert ttft.message.startswith(
        "TTFT at 4Ki improved: baseline 0.200 ± 0.001 s (n=3), now 0.150 ± 0.001 s (n=3), -25.0%"
    )
    assert "refresh the baseline" in ttft.message
    decode = by_metric(four_ki)["decode"]
    assert decode.status == "improved"
    assert decode.change_pct == pytest.approx(10.0)
    assert decode.message.startswith("decode throughput at 4Ki rose:")


def test_lengths_on_one_side_are_reported_not_dropped():
    current = (
        points("now", 1 * KI, *BASELINE_FIGURES[1 * KI])
        + points("now", 2 * KI, *BASELINE_FIGURES[2 * KI])
        + points("now", 4 * KI, [0.0] * 3, outcome="error")
        + points("now", 16 * KI, [0.61, 0.62, 0.63])
    )
    report = compare(baseline_sweep(), current)

    assert report.missing_in_current == (4 * KI, 8 * KI)
    assert report.missing_in_baseline == (16 * KI,)
    assert report.passed
    assert "3 attempts, none passed" in report.for_length(4 * KI).message
    assert "not measured" in report.for_length(8 * KI).message
    assert "16Ki: absent from the baseline" in report.for_length(16 * KI).message
    lines = report.summary_lines()
    assert any(line.startswith("8Ki:") for line in lines)
    assert any(line.startswith("16Ki:") for line in lines)


def test_a_figure_on_one_side_only_is_insufficient_not_a_pass():
    current = [
        Record(**{**vars(record), "figures": {"ttft": record.figures["ttft"]}})
        for record in points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])
    ]
    verdict = compare_length(baseline_sweep(), current, 4 * KI)

    assert verdict.status == "insufficient"
    decode = by_metric(verdict)["decode"]
    assert decode.status == "insufficient"
    assert decode.message == (
        "decode throughput at 4Ki: not compared, "
        "this run has no decode_throughput figure (baseline n=3)"
    )
    assert by_metric(verdict)["ttft"].status == "ok"


def test_gaps_between_chunks_are_never_gated_as_inter_token_latency():
    """A run against a server streaming chunks of 8 tokens records gaps between chunks, and
    the gate says why it cannot compare them with the baseline's inter-token latencies."""
    chunked = {"stream_interval": 8, "per_token_gaps": False, "token_count_source": "usage"}
    current = [
        Record(
            **{
                **vars(record),
                "figures": {
                    "ttft": record.figures["ttft"],
                    "decode_throughput": record.figures["decode_throughput"],
                    "chunk_gap_median": 8 * record.figures["itl_median"],
                    "derived_itl_median": record.figures["itl_median"],
                },
                "stream": chunked,
            }
        )
        for record in points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])
    ]
    verdict = compare_length(baseline_sweep(), current, 4 * KI)
    itl = by_metric(verdict)["itl"]
    assert itl.status == "insufficient" and itl.current is None
    hint = (
        "gaps are between chunks, not tokens, and are never gated as inter-token latency; "
        "gate with itl=off (TTFT and decode throughput compare at any stream interval), or "
        "measure both sides on a server that streams every token (stream interval 1) or that "
        "sends per-request metrics (the server's mean inter-token latency compares at any "
        "stream interval; vLLM's --enable-per-request-metrics, which a launched server gets)"
    )
    assert itl.message == (
        "median inter-token latency at 4Ki: not compared, this run streamed chunks of several "
        f"tokens (stream interval 8): its {hint}"
    )
    assert verdict.status == "insufficient"  # a gated figure not compared fails the length
    assert by_metric(verdict)["decode"].status == "ok"  # exact with chunks of any size
    # both sides chunked: no ITL on either, and the gate says why rather than drop it
    both_chunked = compare_length(current, current, 4 * KI)
    both = by_metric(both_chunked)["itl"]
    assert both.status == "insufficient" and both.baseline is None and both.current is None
    assert both.message == (
        "median inter-token latency at 4Ki: not compared, the baseline and this run streamed "
        f"chunks of several tokens (stream interval 8): their {hint}"
    )
    assert both_chunked.status == "insufficient"
    assert {by_metric(both_chunked)[name].status for name in ("ttft", "decode")} == {"ok"}
    # itl=off: what works, with chunks of any size on either side
    off = compare_length(current, current, 4 * KI, parse_tolerances("itl=off"))
    assert off.status == "ok" and set(by_metric(off)) == {"ttft", "decode"}
    mixed = compare_length(baseline_sweep(), current, 4 * KI, parse_tolerances("itl=off"))
    assert mixed.status == "ok"
    # the server's own mean ITL per request on both sides: compared at any stream interval
    timed = with_server_itl(current)
    judged = by_metric(compare_length(timed, timed, 4 * KI))["itl"]
    assert judged.status == "ok" and judged.current.mean == pytest.approx(1 / 274.0)
    assert "(stream interval 8)" in judged.sources


def test_a_stream_without_any_itl_on_either_side_and_no_chunking_is_not_gated_on_it():
    """Neither side records an ITL for another reason (one decode token): nothing to judge."""
    current = [
        Record(**{**vars(record), "figures": {"ttft": record.figures["ttft"]}})
        for record in points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])
    ]
    verdict = compare_length(current, current, 4 * KI)
    assert set(by_metric(verdict)) == {"ttft"} and verdict.status == "ok"


def test_per_length_tolerance_overrides_apply_to_their_length_only():
    current = dict(BASELINE_FIGURES)
    current[2 * KI] = ([0.1334, 0.1344, 0.1354], BASELINE_FIGURES[2 * KI][1])  # +12.0%
    current[8 * KI] = ([0.391, 0.392, 0.393], BASELINE_FIGURES[8 * KI][1])  # +12.0%
    tolerances = parse_tolerances("ttft=10%,8Ki:ttft=15%")

    report = compare(baseline_sweep(), sweep("now", current), tolerances)

    assert [v.length for v in report.regressed] == [2 * KI]
    eight_ki = by_metric(report.for_length(8 * KI))["ttft"]
    assert eight_ki.tolerance_pct == 15.0
    assert eight_ki.message.endswith(
        "+12.0% (tolerance +15%; one-session baseline: within-session noise only)"
    )


def test_a_metric_switched_off_is_not_judged():
    current = points("now", 4 * KI, [0.223, 0.224, 0.225], BASELINE_FIGURES[4 * KI][1])
    verdict = compare_length(baseline_sweep(), current, 4 * KI, parse_tolerances("ttft=off"))
    assert verdict.status == "ok"
    assert set(by_metric(verdict)) == {"decode", "itl"}


def test_a_resumed_point_counts_once_with_its_latest_record():
    failed_first = points("now", 4 * KI, [0.0, 0.0, 0.0], outcome="failed")
    retried = points("now", 4 * KI, [0.223, 0.224, 0.225])
    verdict = compare_length(baseline_sweep(), failed_first + retried, 4 * KI)
    assert by_metric(verdict)["ttft"].current.n == 3
    assert verdict.status == "regressed"


# --------------------------------------------------------------------------- fingerprints


def with_fingerprint(**changes) -> dict:
    return {**FINGERPRINT, **changes}


def test_matching_fingerprints_have_no_differences():
    assert fingerprint_differences(baseline_sweep(), sweep("now", BASELINE_FIGURES)) == []
    # 8 as an int in one run and "8" as text in the other is the same setting.
    assert (
        fingerprint_differences(baseline_sweep(), with_fingerprint(tensor_parallel_size="8")) == []
    )


def test_each_differing_key_is_listed_in_reading_order():
    now = with_fingerprint(
        vllm_version="0.33.0",
        kv_cache_dtype="auto",
        hardware={**FINGERPRINT["hardware"], "gpu_count": 4},
    )
    assert fingerprint_differences(baseline_sweep(), now) == [
        "kv_cache_dtype: baseline fp8_e4m3, now auto",
        "vllm_version: baseline 0.32.0, now 0.33.0",
        "hardware: baseline 8x NVIDIA H200, now 4x NVIDIA H200",
    ]


def test_hardware_identity_is_the_gpus_on_gpu_hosts_and_the_cpu_otherwise():
    other_host_cpu = with_fingerprint(
        hardware={**FINGERPRINT["hardware"], "cpu_model": "Intel Xeon Platinum 8480+"}
    )
    assert fingerprint_differences(baseline_sweep(), other_host_cpu) == []

    cpu = {"cpu_model": "AMD EPYC 7763 64-Core Processor", "cpu_count": 2, "gpu_count": 0}
    cpu_baseline = points("base", KI, [2.1], fingerprint=with_fingerprint(hardware=cpu))
    other_cpu = with_fingerprint(hardware={**cpu, "cpu_model": "Intel Xeon Platinum 8480+"})
    assert fingerprint_differences(cpu_baseline, other_cpu) == [
        "hardware: baseline CPU AMD EPYC 7763 64-Core Processor (2 cores), "
        "now CPU Intel Xeon Platinum 8480+ (2 cores)"
    ]


def test_a_key_missing_on_one_side_is_a_difference():
    now = {key: value for key, value in FINGERPRINT.items() if key != "revision"}
    assert fingerprint_differences(baseline_sweep(), now) == [
        f"revision: baseline {FINGERPRINT['revision']}, now (not recorded)"
    ]
    assert set(FINGERPRINT) == set(FINGERPRINT_KEYS)


# --------------------------------------------------------------------------- tolerances


def test_defaults_and_partial_specs():
    assert parse_tolerances("") == Tolerances()
    defaults = parse_tolerances(None)
    assert [defaults.for_metric(m, 64 * KI) for m in ("ttft", "decode", "itl")] == [10, 5, 10]
    partial = parse_tolerances("decode=3%")
    assert [partial.for_metric(m, 64 * KI) for m in ("ttft", "decode", "itl")] == [10, 3, 10]


def test_per_length_overrides():
    spec = parse_tolerances("ttft=10%,decode=5%,64Ki:ttft=20%,1Mi:decode=8%")
    assert spec.for_metric("ttft", 65536) == 20.0
    assert spec.for_metric("decode", 65536) == 5.0
    assert spec.for_metric("decode", 1048576) == 8.0
    assert spec.for_metric("ttft", 1048576) == 10.0
    assert spec.for_metric("itl", 65536) == 10.0


@pytest.mark.parametrize(
    ("text", "metric", "length", "expected"),
    [
        ("ttft=15", "ttft", 1024, 15.0),
        ("ttft = 2.5 % ", "ttft", 1024, 2.5),
        ("TTFT=0", "ttft", 1024, 0.0),
        ("ttft=0.5%", "ttft", 1024, 0.5),
        ("itl=off", "itl", 1024, None),
        ("65536:itl=OFF", "itl", 65536, None),
        ("ttft=10%,", "ttft", 1024, 10.0),
    ],
)
def test_accepted_percent_forms(text, metric, length, expected):
    assert parse_tolerances(text).for_metric(metric, length) == expected


def test_describe_round_trips():
    spec = parse_tolerances("decode=3%,64Ki:ttft=20%,1Mi:itl=off")
    assert spec.describe() == "ttft=10%,decode=3%,itl=10%,64Ki:ttft=20%,1Mi:itl=off"
    assert parse_tolerances(spec.describe()) == spec


@pytest.mark.parametrize(
    ("text", "bad_part", "problem"),
    [
        ("ttft10%", "ttft10%", "is not METRIC=PERCENT"),
        ("ttft=10%,latency=5%", "latency=5%", "unknown metric 'latency'"),
        ("64Kb:ttft=20%", "64Kb:ttft=20%", "bad length"),
        ("0:ttft=20%", "0:ttft=20%", "bad length"),
        ("ttft=ten%", "ttft=ten%", "bad percentage 'ten%'"),
        ("ttft=", "ttft=", "bad percentage ''"),
        ("decode=-5%", "decode=-5%", "must be 0 or more"),
        ("decode=nan", "decode=nan", "must be 0 or more"),
        ("decode=inf%", "decode=inf%", "must be 0 or more"),
        ("ttft=0.1", "ttft=0.1", "ambiguous percentage '0.1'"),
        ("ttft=10%,ttft=12%", "ttft=12%", "sets ttft as a default a second time"),
        ("64Ki:ttft=1%,65536:ttft=2%", "65536:ttft=2%", "sets ttft at 64Ki a second time"),
    ],
)
def test_every_bad_spec_names_the_part_and_the_form_for_its_option(text, bad_part, problem):
    with pytest.raises(ToleranceError) as caught:
        parse_tolerances(text)
    message = caught.value.for_option("--longctx-tolerance")
    assert message.startswith(f"--longctx-tolerance: {bad_part!r} ")
    assert problem in message
    assert "METRIC=PERCENT or LENGTH:METRIC=PERCENT" in message
    assert isinstance(caught.value, ValueError)


# --------------------------------------------------------------------------- baseline files


def test_write_then_load_a_baseline_keeps_every_passed_record(tmp_path):
    run = baseline_sweep() + points("base", 16 * KI, [0.0], outcome="failed")
    target = tmp_path / "ci" / "baseline.jsonl"

    assert write_baseline(run, target) == 12
    assert sorted(p.name for p in target.parent.iterdir()) == ["baseline.jsonl"]
    problems: list[str] = []
    loaded = load_baseline(target, problems)
    assert loaded == [record for record in run if record.outcome == "passed"]
    assert problems == []

    # Rewriting replaces the file instead of appending to it.
    write_baseline(run[:3], target)
    assert len(read_records(target).records) == 3


def test_a_run_folder_is_read_through_its_results_file(tmp_path):
    for record in baseline_sweep():
        append_record(tmp_path / "results.jsonl", record)
    assert len(load_baseline(tmp_path)) == 12


def test_a_corrupt_line_among_good_ones_is_reported_not_fatal(tmp_path):
    file = tmp_path / "baseline.jsonl"
    records = baseline_sweep()
    append_record(file, records[0])
    with open(file, "a", encoding="utf-8") as handle:
        handle.write('{"schema_version": 1, "run_id": "base", "nodeid": \n')
    append_record(file, records[1])

    problems: list[str] = []
    assert load_baseline(file, problems) == records[:2]
    assert len(problems) == 1
    assert f"{file}:2:" in problems[0]


def test_writing_a_run_without_passed_records_is_refused(tmp_path):
    with pytest.raises(BaselineError, match="no passed records"):
        write_baseline(points("base", KI, [0.0], outcome="error"), tmp_path / "b.jsonl")
    assert not (tmp_path / "b.jsonl").exists()


def write_lines(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda tmp: tmp / "nowhere.jsonl", "no such file"),
        (lambda tmp: (tmp / "empty_run").mkdir() or tmp / "empty_run", "holds no results.jsonl"),
        (lambda tmp: write_lines(tmp / "b.jsonl"), "the file is empty"),
        (lambda tmp: write_lines(tmp / "b.jsonl", "", "   "), "the file is empty"),
        (
            lambda tmp: write_lines(tmp / "b.jsonl", "not json", '{"schema_version": 99}'),
            "every line is corrupt (2 lines)",
        ),
        (
            lambda tmp: write_lines(
                tmp / "b.jsonl",
                *(json.dumps(r.to_json()) for r in points("b", KI, [0, 0], outcome="failed")),
                *(json.dumps(r.to_json()) for r in points("b", KI, [0], outcome="skipped")),
            ),
            "none of its 3 records passed (2 failed, 1 skipped)",
        ),
    ],
    ids=["missing", "folder-without-results", "empty", "blank-lines", "all-corrupt", "no-passed"],
)
def test_unusable_baselines_name_the_file_and_the_problem(tmp_path, make, problem):
    path = make(tmp_path)
    with pytest.raises(BaselineError) as caught:
        load_baseline(path)
    message = str(caught.value)
    assert problem in message
    assert str(path) in message


# --------------------------------------------------------------------------- the t distribution


@pytest.mark.parametrize(
    ("df", "p", "critical"),
    [
        # One-sided critical values from a printed Student t table (three decimals).
        (1, 0.025, 12.706),
        (2, 0.05, 2.920),
        (2, 0.01, 6.965),
        (3, 0.01, 4.541),
        (4, 0.01, 3.747),
        (5, 0.01, 3.365),
        (10, 0.005, 3.169),
        (30, 0.025, 2.042),
        (120, 0.05, 1.658),
        (math.inf, 0.01, 2.326),
    ],
)
def test_t_critical_values_match_the_table(df, p, critical):
    assert student_t_isf(p, df) == pytest.approx(critical, abs=0.0006)
    assert student_t_sf(critical, df) == pytest.approx(p, rel=0.003)


@pytest.mark.parametrize("t", [-7.5, -1.0, 0.0, 0.3, 1.0, 2.5, 40.0])
def test_t_tail_matches_the_closed_forms_of_one_two_and_three_degrees_of_freedom(t):
    cauchy = 0.5 - math.atan(t) / math.pi
    two = 0.5 - t / (2 * math.sqrt(2 + t * t))
    u = t / math.sqrt(3)
    three = 0.5 - (u / (1 + u * u) + math.atan(u)) / math.pi
    assert student_t_sf(t, 1) == pytest.approx(cauchy, rel=1e-10, abs=1e-15)
    assert student_t_sf(t, 2) == pytest.approx(two, rel=1e-10, abs=1e-15)
    assert student_t_sf(t, 3) == pytest.approx(three, rel=1e-10, abs=1e-15)


def test_regularized_beta_known_values():
    assert regularized_beta(1, 1, 0.3) == pytest.approx(0.3)  # uniform
    assert regularized_beta(3, 1, 0.5) == pytest.approx(0.125)  # x^a
    assert regularized_beta(1, 4, 0.5) == pytest.approx(1 - 0.5**4)  # 1 - (1-x)^b
    assert regularized_beta(7.5, 7.5, 0.5) == pytest.approx(0.5)  # symmetry
    assert regularized_beta(2, 3, 0.0) == 0.0
    assert regularized_beta(2, 3, 1.0) == 1.0
    # Non-integer degrees of freedom lie between their integer neighbours.
    assert student_t_sf(2.0, 3) > student_t_sf(2.0, 3.5) > student_t_sf(2.0, 4)


@pytest.mark.parametrize(("text", "level"), [("0.01", 0.01), ("0.05", 0.05), ("1%", 0.01)])
def test_levels_parse(text, level):
    assert parse_level(text) == pytest.approx(level)


@pytest.mark.parametrize("text", ["0", "0.5", "1", "5", "-0.01", "nan", "often", ""])
def test_a_bad_level_names_the_form_for_its_option(text):
    with pytest.raises(LevelError) as caught:
        parse_level(text)
    assert caught.value.for_option("--longctx-gate-level") == (
        f"--longctx-gate-level={text}: expected a probability between 0 and 0.5, e.g. 0.01 "
        "(a 1% one-sided false-alarm level)"
    )


# --------------------------------------------------------------------------- the noise tests


def test_welch_test_worked_by_hand():
    # Means 2 and 5; s^2/n = 1/3 and (20/3)/4 = 5/3; SE^2 = 2, t = 3 / sqrt(2) = 2.1213;
    # df = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4 / 0.98148 = 4.0755.
    test = welch_test([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0], worse_sign=1.0)
    assert test.model == "within-session"
    assert test.se == pytest.approx(math.sqrt(2))
    assert test.t == pytest.approx(2.1213, abs=1e-4)
    assert test.df == pytest.approx(4.0755, abs=1e-4)
    # t_{0.05, 4} = 2.132 and t_{0.05, 4.08} a little lower: p just above 5%.
    assert 0.04 < test.p_worse < 0.06
    assert test.p_worse + test.p_better == pytest.approx(1.0)
    # Lower is worse (decode throughput): the same rise is an improvement.
    assert welch_test([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0], worse_sign=-1.0).t < 0


#: Four baseline sessions, two repeats each, session means 1.0, 1.1, 0.9 and 1.0.
HISTORY = [[0.98, 1.02], [1.08, 1.12], [0.88, 0.92], [0.98, 1.02]]


def test_session_test_worked_by_hand():
    # Means' variance (0 + 0.01 + 0.01 + 0) / 3 = 0.006667; SE^2 = 0.006667 * (1 + 1/4),
    # SE = 0.09129 s; now 1.30 against 1.00: t = 3.2863 on K - 1 = 3 degrees of freedom.
    test = session_test(HISTORY, [1.29, 1.31], worse_sign=1.0)
    assert test.model == "between-session"
    assert test.sessions == 4
    assert test.se == pytest.approx(0.091287, abs=1e-6)
    assert test.t == pytest.approx(3.2863, abs=1e-4)
    assert test.df == pytest.approx(3.0)
    u = test.t / math.sqrt(3)  # closed form of the t tail at 3 df: 0.0231
    assert test.p_worse == pytest.approx(0.5 - (u / (1 + u * u) + math.atan(u)) / math.pi)
    assert test.p_worse == pytest.approx(0.0231, abs=1e-4)


def test_a_run_with_fewer_repeats_than_the_baseline_sessions_adds_their_within_spread():
    # Within-session variance 0.0008 in every session (4 df); one repeat now instead of two:
    # + 0.0008 * (1/1 - 1/2) = 0.0004, SE^2 = 0.008333 + 0.0004, SE = 0.09345 s, and
    # Welch-Satterthwaite df = 0.008733^2 / (0.008333^2 / 3 + 0.0004^2 / 4) = 3.289.
    test = session_test(HISTORY, [1.30], worse_sign=1.0)
    assert test.se == pytest.approx(0.093452, abs=1e-6)
    assert test.df == pytest.approx(3.289, abs=1e-3)
    # More repeats now than in the baseline: nothing is subtracted (a conservative estimate).
    assert session_test(HISTORY, [1.29, 1.30, 1.31], worse_sign=1.0).se == pytest.approx(
        0.091287, abs=1e-6
    )


def sessions_of(figures: dict[str, tuple[list[float], list[float]]], length: int = 2 * KI):
    """Baseline records of one length, one session per run id: {run_id: (ttfts, decodes)}."""
    return [
        record
        for run_id, (ttfts, decodes) in figures.items()
        for record in points(run_id, length, ttfts, decodes)
    ]


#: Decode throughput at 2Ki over four unchanged sessions: it moves by ~10% between server starts
#: (336, 302, 320 and 328 tok/s) while repeats inside a session agree within 2 tok/s.
DRIFTING = {
    "s1": ([0.120, 0.120], [334.0, 338.0]),
    "s2": ([0.120, 0.120], [300.0, 304.0]),
    "s3": ([0.120, 0.120], [318.0, 322.0]),
    "s4": ([0.120, 0.120], [326.0, 330.0]),
}


def test_repeats_from_several_server_starts_of_one_session_count_as_starts():
    """A session whose server was relaunched measured its repeats on different starts: the
    gate counts each start as a session of its own, as it would separate sessions."""
    import dataclasses

    relaunched = [
        dataclasses.replace(
            record,
            run_id="one",
            repeat=2 * index + record.repeat,
            nodeid=f"{record.nodeid}-start{index}",
            server_start={"index": index},
        )
        for index, run_id in enumerate(DRIFTING)
        for record in points(run_id, 2 * KI, *DRIFTING[run_id])
    ]
    now = points("now", 2 * KI, [0.120, 0.120], [298.0, 302.0])
    decode = by_metric(
        compare_length(relaunched, now, 2 * KI, parse_tolerances("ttft=off,itl=off"))
    )["decode"]
    assert session_count(relaunched) == 4
    assert decode.noise == "between-session"
    assert decode.test.t == pytest.approx(1.3213, abs=1e-3)  # as four separate sessions
    one_start = [dataclasses.replace(record, server_start={}) for record in relaunched]
    assert session_count(one_start) == 1


def test_a_history_of_sessions_absorbs_drift_that_one_session_calls_a_regression():
    now = points("now", 2 * KI, [0.120, 0.120], [298.0, 302.0])
    decode_only = parse_tolerances("ttft=off,itl=off")

    one = compare_length(sessions_of({"s1": DRIFTING["s1"]}), now, 2 * KI, decode_only)
    # Against s1 alone: 300 vs 336 is -10.7%; Welch SE = sqrt(8/2 + 8/2) = 2.83, t = 12.7, 2 df.
    decode = by_metric(one)["decode"]
    assert one.status == "regressed"
    assert decode.noise == "within-session"
    assert decode.message.endswith("; one-session baseline: within-session noise only)")

    history = compare_length(sessions_of(DRIFTING), now, 2 * KI, decode_only)
    # Against the four: means 336, 302, 320, 328 -> 321.5 ± 14.55; 300 is -6.7%, beyond the 5%
    # tolerance, but t = 21.5 / (14.55 * sqrt(1.25)) = 1.32 on 3 df: p = 0.14, noise-sized.
    decode = by_metric(history)["decode"]
    assert history.status == "ok"
    assert decode.noise == "between-session"
    assert decode.test.t == pytest.approx(1.3213, abs=1e-3)
    assert decode.message == (
        "decode throughput at 2Ki ok within noise: baseline 322 ± 15 tok/s between 4 sessions "
        "(n=8), now 300 ± 3 tok/s (n=2), -6.7% exceeds tolerance -5% but is not significant "
        "(p=0.14 >= 0.01, t=1.32, df=3.0; against 4 baseline sessions)"
    )


def test_a_real_slowdown_is_still_caught_against_a_history():
    now = points("now", 2 * KI, [0.120, 0.120], [225.0, 227.0])
    verdict = compare_length(
        sessions_of(DRIFTING), now, 2 * KI, parse_tolerances("ttft=off,itl=off")
    )
    # 226 vs 321.5: -29.7%; t = 95.5 / 16.27 = 5.87 on 3 df, beyond t_{0.005, 3} = 5.841.
    decode = by_metric(verdict)["decode"]
    assert verdict.status == "regressed"
    assert 0.004 < decode.test.p_worse < 0.005
    assert decode.message.startswith(
        "decode throughput at 2Ki fell: baseline 322 ± 15 tok/s between 4 sessions (n=8), "
        "now 226 ± 1 tok/s (n=2), -29.7% (tolerance -5%, p=0.0049 < 0.01, t=5.87, df=3.0; "
        "against 4 baseline sessions)"
    )


def test_the_level_decides_a_borderline_change():
    # TTFT 1.30 s against the sessions of HISTORY: +30%, p = 0.0231 (worked out above).
    baseline = sessions_of({f"s{i}": (ttfts, [250.0] * 2) for i, ttfts in enumerate(HISTORY)})
    now = points("now", 2 * KI, [1.29, 1.31], [250.0, 250.0])
    assert compare_length(baseline, now, 2 * KI).status == "ok"
    assert compare_length(baseline, now, 2 * KI, level=0.05).status == "regressed"
    report = compare(baseline, now, level=0.05)
    assert report.baseline_sessions == 4
    assert report.summary_lines()[0] == (
        "regression gate (ttft=10%,decode=5%,itl=10%, level 0.05, 4 baseline sessions: "
        "between-session noise): 1 of 1 lengths regressed (2Ki)"
    )


# --------------------------------------------------------------------------- histories, files


def test_a_header_with_calibrated_tolerances_round_trips(tmp_path):
    target = tmp_path / "baseline.jsonl"
    info = BaselineInfo(tolerance="ttft=20%,decode=8%,itl=15%", max_sessions=6)
    assert write_baseline(sessions_of(DRIFTING), target, info) == 8

    loaded = load_baseline_file(target)
    assert loaded.info == info
    assert loaded.sessions == 4
    assert loaded.tolerances() == parse_tolerances("ttft=20%,decode=8%,itl=15%")
    assert json.loads(target.read_text().splitlines()[0]) == {
        "longctx_baseline": 1,
        "max_sessions": 6,
        "tolerance": "ttft=20%,decode=8%,itl=15%",
    }
    # A file without a header stores no tolerances: the gate falls back to its other sources.
    write_baseline(sessions_of(DRIFTING), target)
    assert load_baseline_file(target).tolerances() is None


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ({"longctx_baseline": 1, "tolerance": "ttft=fast"}, "stores a bad tolerance"),
        ({"longctx_baseline": 9}, "has version 9; this reader knows 1"),
        ({"longctx_baseline": 1, "max_sessions": 0}, "expected a whole number >= 1"),
    ],
)
def test_a_bad_header_is_an_error_naming_the_file_and_line(tmp_path, header, problem):
    target = tmp_path / "baseline.jsonl"
    write_lines(target, json.dumps(header), *(json.dumps(r.to_json()) for r in baseline_sweep()))
    with pytest.raises(BaselineError) as caught:
        load_baseline_file(target)
    assert f"baseline {target}:1: header" in str(caught.value)
    assert problem in str(caught.value)


def test_keep_newest_sessions_drops_the_oldest():
    records = []
    for age, run_id in enumerate(["old", "middle", "new"]):
        for record in points(run_id, KI, [0.1, 0.1]):
            shift = 1000.0 * age
            records.append(Record(**{**vars(record), "finished_at": record.finished_at + shift}))
    kept = keep_newest_sessions(records, 2)
    assert [r.run_id for r in kept] == ["middle", "middle", "new", "new"]
    assert len(keep_newest_sessions(records, 5)) == 6


# --------------------------------------------------------------------------- calibration


def test_calibration_reports_both_spreads_and_proposes_tolerances_at_the_level():
    # 1Ki: TTFT session means 1.0, 1.1, 0.9 (between CV 10%), repeats ±0.01 (within CV 1.41%),
    # decode 250, 275, 225 tok/s (the same ratios); 2Ki: TTFT 0.20, 0.21, 0.19, decode steady.
    records = []
    for run_id, (one, two, rate) in {
        "a": (1.0, 0.20, 250.0),
        "b": (1.1, 0.21, 275.0),
        "c": (0.9, 0.19, 225.0),
    }.items():
        records += points(run_id, KI, [one - 0.01, one + 0.01], [rate, rate])
        records += points(run_id, 2 * KI, [two - 0.001, two + 0.001], [250.0, 250.0])
    calibration = calibrate(records, level=0.01)

    rows = {(row.length, row.metric): row for row in calibration.rows}
    assert calibration.run_ids == ("a", "b", "c")
    assert rows[(KI, "ttft")].between_cv == pytest.approx(0.10)
    assert rows[(KI, "ttft")].within_cv == pytest.approx(0.01 * math.sqrt(2))
    assert rows[(2 * KI, "ttft")].between_cv == pytest.approx(0.05)
    # The proposal works on log session means: sd of ln(1.0, 1.1, 0.9) = 0.10038, and with
    # t_{0.01, 2} = 6.965, b = 6.965 * 0.10038 * sqrt(1 + 1/3) = 0.8072. TTFT (higher is
    # worse): e^b - 1 = 124.2% -> 125%. Decode (lower is worse): 1 - e^-b = 55.4% -> 56%, below
    # 100% however noisy. ITL is 1/decode: 125% again.
    assert rows[(KI, "ttft")].proposed_pct == 125
    assert rows[(KI, "decode")].proposed_pct == 56
    assert rows[(KI, "itl")].proposed_pct == 125
    # 2Ki TTFT: sd of ln(0.20, 0.21, 0.19) = 0.05005, b = 0.4025, e^b - 1 = 49.6% -> 50%.
    assert rows[(2 * KI, "ttft")].proposed_pct == 50
    assert rows[(2 * KI, "decode")].between_cv == 0.0
    assert rows[(2 * KI, "decode")].proposed_pct == 1  # never below 1%
    assert calibration.tolerances().describe() == (
        "ttft=125%,decode=56%,itl=125%,2Ki:ttft=50%,2Ki:decode=1%,2Ki:itl=1%"
    )
    # A looser level asks for less: t_{0.05, 2} = 2.920, b = 0.3384, e^b - 1 = 40.3% -> 41%.
    assert calibrate(records, level=0.05).tolerances().for_metric("ttft", KI) == 41
    header = calibration.info(max_sessions=10).to_json()
    assert header["calibration"]["level"] == 0.01
    assert header["calibration"]["sessions"] == 3


def test_calibration_needs_two_sessions():
    with pytest.raises(ValueError, match="two or more sessions with passed points, got 1"):
        calibrate(points("only", KI, [0.1, 0.1]))


def held_back(records: list[Record], source: str = "server") -> list[Record]:
    """The records as a busy host leaves them: each stream arrived in bursts, so its gaps are
    kept as ``stream_*`` figures and its decode figure is the server's (``none``: absent)."""
    held = []
    for record in records:
        figures = {k: v for k, v in record.figures.items() if k != "itl_median"}
        figures["stream_itl_median"] = record.figures["itl_median"]
        if source == "none":
            figures["stream_decode_throughput"] = figures.pop("decode_throughput")
        stream = {"decode_source": source, "agreement": "the stream delivered 31 tokens"}
        held.append(Record(**{**vars(record), "figures": figures, "stream": stream}))
    return held


def with_server_itl(records: list[Record], factor: float = 1.0) -> list[Record]:
    """The records with the server's own mean ITL of each request (vLLM's per-request
    metrics): the stream's ITL where it had one, else the inverse of its decode rate."""
    timed = []
    for record in records:
        figures = record.figures
        itl = figures.get("itl_median") or figures.get("stream_itl_median")
        itl = itl or 1 / (figures.get("decode_throughput") or 274.0)
        timed.append(
            Record(**{**vars(record), "figures": {**figures, "server_request_itl": itl * factor}})
        )
    return timed


def test_itl_of_streams_held_back_fails_the_length_unless_the_server_timed_the_tokens():
    """Every point of this run kept the server's decode figure: the gate still compares TTFT
    and decode throughput, saying whose decode figures they are; ITL has no per-token figure
    on this side, which fails the length, unless the server's own mean ITL per request is
    on both sides, which it is then judged on."""
    current = held_back(points("now", 4 * KI, *BASELINE_FIGURES[4 * KI]))
    verdict = compare_length(baseline_sweep(), current, 4 * KI)
    assert verdict.status == "insufficient"
    itl = by_metric(verdict)["itl"]
    assert itl.status == "insufficient" and itl.current is None
    assert itl.message.startswith(
        "median inter-token latency at 4Ki: not compared, this run has no per-token figure: "
        "its streams showed no per-token gap (in bursts, off the server's decode: 3 of 3 "
        "points) and the server sent no mean inter-token latency of its own"
    )
    decode = by_metric(verdict)["decode"]
    assert decode.status == "ok"
    assert decode.sources == (
        "decode figures: this run's from the server at 3 of 3 points (their streams arrived "
        "in bursts)"
    )
    assert decode.message.endswith("; " + decode.sources)
    # only where ITL is asked
    off = compare_length(baseline_sweep(), current, 4 * KI, parse_tolerances("itl=off"))
    assert set(by_metric(off)) == {"ttft", "decode"} and off.status == "ok"
    # the server's mean ITL of each request on both sides: judged on it, and 30% slower fails
    timed = compare_length(with_server_itl(baseline_sweep()), with_server_itl(current), 4 * KI)
    assert timed.status == "ok" and by_metric(timed)["itl"].status == "ok"
    assert by_metric(timed)["itl"].message.startswith(
        "the server's mean inter-token latency per request at 4Ki ok"
    )
    slower = compare_length(
        with_server_itl(baseline_sweep()), with_server_itl(current, 1.3), 4 * KI
    )
    assert slower.status == "regressed" and by_metric(slower)["itl"].status == "regressed"
    # the server's figure on one side only is no comparison: never a median against a mean
    one_sided = compare_length(baseline_sweep(), with_server_itl(current), 4 * KI)
    assert by_metric(one_sided)["itl"].status == "insufficient"
    # a run whose points have no decode figure at all (neither the stream's nor the server's)
    none = held_back(points("now", 4 * KI, *BASELINE_FIGURES[4 * KI]), "none")
    lost = by_metric(compare_length(baseline_sweep(), none, 4 * KI))
    assert lost["ttft"].status == "ok" and lost["itl"].status == "insufficient"
    assert lost["decode"].status == "insufficient"
    assert "this run's absent at 3 of 3 points" in lost["decode"].message
    # a stream that agreed at one repeat: ITL compares over the points that have it
    mixed = current[:2] + points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])[2:]
    mixed_itl = by_metric(compare_length(baseline_sweep(), mixed, 4 * KI))["itl"]
    assert mixed_itl.status == "ok" and mixed_itl.current.n == 1


def test_itl_held_back_on_both_sides_fails_the_length():
    """Both runs' streams at a length arrived in bursts, and neither has the server's mean
    ITL: no side says what a token took, so the length is not passed on TTFT alone."""
    baseline = held_back([r for r in baseline_sweep() if r.length == 4 * KI])
    current = held_back(points("now", 4 * KI, *BASELINE_FIGURES[4 * KI]))
    verdict = compare_length(baseline, current, 4 * KI)
    itl = by_metric(verdict)["itl"]
    assert itl.status == "insufficient" and itl.baseline is None and itl.current is None
    assert "the baseline and this run have no per-token figure" in itl.message
    assert "3 of 3 points each" in itl.message
    assert verdict.status == "insufficient" and by_metric(verdict)["ttft"].status == "ok"


@pytest.mark.parametrize(
    ("stream", "said"),
    [
        (
            {"decode_source": "server", "per_token_gaps": False, "stream_interval": None},
            "in bursts, off the server's decode",
        ),
        (
            {"decode_source": "stream", "per_token_gaps": True, "coalesced_chunks": 2},
            "merged into chunks of several tokens at a stream interval of 1, the stream behind "
            "the server",
        ),
    ],
    ids=["one-chunk-burst", "merged"],
)
def test_a_stream_the_server_merged_is_not_a_chunked_server_and_fails_without_its_itl(
    stream: dict, said: str
):
    """vLLM's API server falls behind and merges a stream's chunks: the whole decode in one
    chunk (a burst, and with no warm-up to show the interval, an unknown one), or chunks of
    1, 20 and 11 on a server whose warm-ups showed interval 1 (no burst, and no gap of one
    token). Neither is a server that streams chunks of several tokens; and neither shows a
    token's time, so without the server's own the length fails."""
    current = [
        Record(
            **{
                **vars(record),
                "figures": {k: v for k, v in record.figures.items() if k != "itl_median"},
                "stream": stream,
            }
        )
        for record in points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])
    ]
    verdict = compare_length(baseline_sweep(), current, 4 * KI)
    itl = by_metric(verdict)["itl"]
    assert itl.status == "insufficient", itl.message
    assert itl.message.startswith(
        "median inter-token latency at 4Ki: not compared, this run has no per-token figure: "
        f"its streams showed no per-token gap ({said}: 3 of 3 points)"
    )
    assert "streamed chunks of several tokens" not in itl.message  # not a chunked server
    assert verdict.status == "insufficient"
    timed = compare_length(with_server_itl(baseline_sweep()), with_server_itl(current), 4 * KI)
    assert by_metric(timed)["itl"].status == "ok"
    assert f"({said})" in by_metric(timed)["itl"].sources


REFUTED = (
    "the background gaps disagree with the server's inter-token histogram "
    "(vllm:inter_token_latency_seconds): the streams' gaps sum to 0.2 s, the server's to 22 s"
)


def interference_points(run_id: str, stalls: list[float], set_aside: tuple = ()) -> list[Record]:
    """Interference points at 4Ki: TTFT under load 0.5 s and the background streams' p99 gap
    during the prefill; at the repeats in ``set_aside`` the server's figures refuted the
    gaps, so the background figures were set aside (workloads/interference/under_load.py)."""
    records = []
    for repeat, stall in enumerate(stalls):
        background = {"bg_itl_prefill_p99": stall, "bg_itl_idle_median": 0.02}
        interference: dict = {
            "background_streams": 4,
            "background_gaps": {"verdict": "confirmed", "by": ["the server's histogram"]},
        }
        figures = {"ttft": 0.5, **background}
        if repeat in set_aside:
            figures = {"ttft": 0.5}
            interference = {
                "background_streams": 4,
                "background_gaps": {"verdict": "refuted", "why": REFUTED, "figures": "set aside"},
                "unconfirmed_figures": background,
            }
        records.append(
            Record(
                run_id=run_id,
                nodeid=f"test_sweep[len=4Ki-rep={repeat}-interference]",
                length=4 * KI,
                repeat=repeat,
                outcome="passed",
                figures=figures,
                prompt_tokens=4 * KI,
                completion_tokens=128,
                fingerprint=FINGERPRINT,
                cache_state="interference",
                interference=interference,
            )
        )
    return records


def test_background_figures_set_aside_are_never_gated_and_never_pass_a_length():
    """The stall compares the background gaps the server's figures confirmed: over the
    points that kept them, saying how many were set aside; a side with every point's set
    aside has no stall to compare, which fails the length (both sides so: the same, never
    a length passed without a verdict)."""
    baseline = interference_points("base", [1.0, 1.0, 1.0])
    some = interference_points("now", [1.0, 1.0, 1.0], set_aside=(0,))
    stall = by_metric(compare_length(baseline, some, 4 * KI))["stall"]
    assert stall.status == "ok" and stall.current.n == 2
    assert stall.sources == (
        "background figures: this run's set aside at 1 of 3 points (the server's figures "
        "refuted their streams' gaps; --longctx-allow-unconfirmed keeps and gates them)"
    )
    assert stall.message.endswith("; " + stall.sources)
    every = interference_points("now", [1.0, 1.0, 1.0], set_aside=(0, 1, 2))
    verdict = compare_length(baseline, every, 4 * KI)
    stall = by_metric(verdict)["stall"]
    assert stall.status == "insufficient" and verdict.status == "insufficient"
    assert stall.message.startswith(
        "background p99 inter-token gap during the prefill at 4Ki: not compared, this run set "
        "every interference point's background figures aside: the server's figures refuted "
        f"the background streams' gaps (first: {REFUTED}), so no stall was measured; "
        "--longctx-allow-unconfirmed keeps and gates them"
    )
    assert by_metric(verdict)["load_ttft"].status == "ok"  # the TTFT under load still compares
    both = compare_length(every, every, 4 * KI)
    assert by_metric(both)["stall"].status == "insufficient" and both.status == "insufficient"
    assert "the baseline and this run set every" in by_metric(both)["stall"].message


# --------------------------------------------------------------------------- answers


def answered(records: list[Record], verdict: str, outcome: str | None = None) -> list[Record]:
    """``records`` with a fidelity verdict (and another outcome, for a checked wrong answer)."""
    fidelity = {"expected": "7", "answer": "7" if verdict == "correct" else "8", "depth": 0.5}
    return [
        dataclasses.replace(
            record,
            fidelity={**fidelity, "verdict": verdict},
            outcome=outcome or record.outcome,
            failure_class="wrong_answer" if outcome == "failed" else None,
        )
        for record in records
    ]


def test_a_length_right_in_the_baseline_and_wrong_now_regressed_alone():
    baseline = [r for rs in (baseline_sweep(),) for r in answered(rs, "correct")]
    current = [
        *answered(points("now", 1 * KI, [0.080, 0.080, 0.080]), "correct"),
        *answered(points("now", 2 * KI, [0.120, 0.120, 0.120]), "wrong", "failed"),
        *answered(points("now", 4 * KI, [0.200, 0.200, 0.200]), "wrong"),  # recorded only
        *answered(points("now", 8 * KI, [0.350, 0.350, 0.350]), "correct"),
    ]
    report = compare(baseline, current)
    assert [v.length for v in report.regressed] == [2 * KI, 4 * KI]
    message = report.for_length(2 * KI).message
    assert "2Ki fidelity: regressed, 3 of 3 answers wrong now, all 3 right" in message
    assert "expected 7, answered 8" in message
    assert compare_length(baseline, current, 4 * KI).regressed
    assert not compare_length(baseline, current, 8 * KI).regressed


def test_answers_wrong_in_the_baseline_too_are_no_regression():
    baseline = answered(points("base", 1 * KI, [0.080, 0.080]), "wrong")
    current = answered(points("now", 1 * KI, [0.080, 0.080]), "wrong")
    assert not compare(baseline, current).regressed
    unprobed = points("now", 1 * KI, [0.080, 0.080])  # records of a run without the probe
    assert not compare(answered(baseline, "correct"), unprobed).regressed


# --------------------------------------------------------------------------- the rules' edges


def test_a_record_without_a_start_number_counts_as_its_runs_first_start():
    unnumbered = points("base", 4 * KI, [0.2, 0.2])  # no server_start (an attached server)
    first = [dataclasses.replace(r, server_start={"index": 0}) for r in unnumbered]
    relaunched = [dataclasses.replace(r, server_start={"index": 1}) for r in unnumbered]
    assert session_count(unnumbered + first) == 1
    assert session_count(unnumbered + relaunched) == 2


def test_a_fidelity_regression_names_three_wrong_answers_at_most():
    baseline = answered(points("base", 1 * KI, [0.080] * 4), "correct")
    current = answered(points("now", 1 * KI, [0.080] * 4), "wrong")
    message = compare_length(baseline, current, 1 * KI).message
    assert "4 of 4 answers wrong now" in message
    assert message.count("expected 7, answered 8") == 3


def test_a_length_with_no_gated_figure_on_either_side_is_insufficient_unless_nothing_is_gated():
    bare = [dataclasses.replace(r, figures={}) for r in points("base", 4 * KI, [0.2, 0.2])]
    verdict = compare_length(bare, bare, 4 * KI)
    assert (verdict.status, verdict.message) == (
        "insufficient",
        "4Ki: no gated figure on either side",
    )
    from pytest_longctx.gate.tolerances import METRICS

    nothing = parse_tolerances(",".join(f"{name}=off" for name in METRICS))
    verdict = compare_length(bare, bare, 4 * KI, nothing)
    assert (verdict.status, verdict.message) == ("ok", "4Ki: not gated")


def test_itl_names_only_the_side_whose_streams_lacked_gaps():
    """The baseline's streams arrived in bursts with no server mean ITL, this run records no
    ITL for another reason (no stream record): no side has a token's time, so the length is
    not compared and fails, and only the baseline is named for its bursts."""
    baseline = held_back([r for r in baseline_sweep() if r.length == 4 * KI])
    current = [
        dataclasses.replace(r, figures={k: v for k, v in r.figures.items() if k != "itl_median"})
        for r in points("now", 4 * KI, *BASELINE_FIGURES[4 * KI])
    ]
    verdict = compare_length(baseline, current, 4 * KI)
    itl = by_metric(verdict)["itl"]
    assert itl.status == "insufficient" and verdict.status == "insufficient"
    assert "the baseline has no per-token figure" in itl.message
    assert "this run" not in itl.message.split(": not compared, ", 1)[1].split(":", 1)[0]


def test_a_baseline_mean_of_zero_is_no_base_for_a_percentage():
    baseline = points("base", 4 * KI, [0.0, 0.0, 0.0])
    ttft = by_metric(compare_length(baseline, points("now", 4 * KI, [0.2] * 3), 4 * KI))["ttft"]
    assert ttft.status == "insufficient"
    assert (
        ttft.message
        == "TTFT at 4Ki: not compared, the baseline mean is 0, no base for a percentage"
    )


def test_two_baseline_sessions_are_a_history():
    two = {run_id: DRIFTING[run_id] for run_id in ("s1", "s2")}
    now = points("now", 2 * KI, [0.120, 0.120], [318.0, 320.0])
    decode = by_metric(compare_length(sessions_of(two), now, 2 * KI))["decode"]
    assert decode.noise == "between-session" and decode.test.sessions == 2
    assert decode.message.endswith("against 2 baseline sessions)")


def test_a_change_beyond_a_tolerance_under_one_percent_is_judged_by_its_direction():
    """TTFT +0.8% against a 0.5% tolerance, significant: regressed, with the test of a
    change for the worse; -0.8%: improved."""
    baseline = points("base", 4 * KI, [1.000, 1.001, 0.999])
    tolerances = parse_tolerances("ttft=0.5%,decode=off,itl=off")
    slower = compare_length(
        baseline, points("now", 4 * KI, [1.008, 1.009, 1.007]), 4 * KI, tolerances
    )
    ttft = by_metric(slower)["ttft"]
    assert slower.status == "regressed" and ttft.test.p_worse < 0.01
    assert f"p={ttft.test.p_worse:.2g} < 0.01" in ttft.message
    faster = compare_length(
        baseline, points("now", 4 * KI, [0.992, 0.993, 0.991]), 4 * KI, tolerances
    )
    ttft = by_metric(faster)["ttft"]
    assert faster.status == "improved"
    assert f"p={ttft.test.p_better:.2g} < 0.01" in ttft.message
