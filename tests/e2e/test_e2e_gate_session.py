"""The regression gate as CI sees it, on real vLLM: a run gated against its own records, then
against a baseline five times faster. The gate's sessions on records written by hand:
tests/unit/gate/test_gate_session.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from longctx_testing import (
    SHARED_SERVERS_PROFILE,
    SWEEP_TEST,
    cli,
    regression_outcomes,
    run_folder,
    sweep_outcomes,
)

from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.gate import student_t_isf

pytestmark = pytest.mark.vllm


def store_baseline(run_dir: Path, output: Path) -> list[Record]:
    """The command a team runs once, then commits the file it writes."""
    completed = cli("baseline", run_dir, "--output", output)
    assert completed.returncode == 0, completed.stderr
    assert f"--longctx-baseline={output}" in completed.stdout
    return list(read_records(output).records)


@pytest.mark.vllm
def test_gate_against_real_vllm(pytester: pytest.Pytester, vllm_url: str) -> None:
    """A real run gated against its own records passes, and against a baseline five times
    faster fails, however noisy the machine: neither verdict depends on the measured spread."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def session(*args: str) -> pytest.RunResult:
        # Each in its own process, as CI runs them; the serving stack stays out of this one.
        return pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            "-v",
            f"--longctx-url={vllm_url}",
            SHARED_SERVERS_PROFILE,
            f"--longctx-output={output}",
            "--longctx-to=2Ki",
            "--longctx-repeats=2",
            *args,
        )

    first = session()
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    assert sweep_outcomes(first) == {"PASSED"}
    run_dir = run_folder(output)
    same = pytester.path / "longctx-baseline.jsonl"
    stored = store_baseline(run_dir, same)
    assert sorted((r.length, r.repeat) for r in stored) == [
        (1024, 0),
        (1024, 1),
        (2048, 0),
        (2048, 1),
    ]

    # The run against its own records: every change is exactly 0%, so every length passes.
    # Resumed, the session reports the first one's measurements without asking the server.
    # ITL is left out: a point whose stream a busy host delivered in a burst has no per-token
    # figure to compare, and the gate's handling of that is tested on the fake server.
    again = session(
        f"--longctx-baseline={same}",
        f"--longctx-resume={run_dir.name}",
        "--longctx-tolerance=ttft=10%,decode=10%,itl=off",
    )
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    assert regression_outcomes(again) == {"1Ki": "PASSED", "2Ki": "PASSED"}
    assert sweep_outcomes(again) == {"PASSED"}

    # The same records five times faster: TTFT / 5, decode throughput x 5. Each metric
    # is 5x worse now (+400% or -80%), beyond these tolerances, and beyond noise whatever the
    # machine's spread. With now's two repeats at mean m and std s (CV = s / m), the baseline's
    # are m/5 and s/5: Welch's t = 0.8 m / sqrt(s^2/2 + (s/5)^2/2) = 4/sqrt(26) * sqrt(2)/CV
    # on a fixed 26^2 / (25^2 + 1) = 1.08 df (decode: the same, sides swapped). Two positive
    # numbers have a CV below sqrt(2), so t > 4/sqrt(26) = 0.784, above level 0.3's critical
    # 0.709: the verdict does not depend on the measured spread.
    assert student_t_isf(0.3, 26**2 / (25**2 + 1)) < 4 / math.sqrt(26)
    faster = pytester.path / "faster-baseline.jsonl"
    for record in stored:
        figures = {
            **record.figures,
            "ttft": record.figures["ttft"] / 5,
            "decode_throughput": record.figures["decode_throughput"] * 5,
        }
        if "itl_median" in record.figures:  # none where a busy host held the stream back
            figures["itl_median"] = record.figures["itl_median"] / 5
        append_record(faster, Record(**{**record.__dict__, "figures": figures}))
    slower = session(
        f"--longctx-baseline={faster}",
        f"--longctx-resume={run_dir.name}",
        "--longctx-tolerance=ttft=200%,decode=60%,itl=off",
        "--longctx-gate-level=0.3",
    )
    assert slower.ret == pytest.ExitCode.TESTS_FAILED, slower.stdout.str()
    assert regression_outcomes(slower) == {"1Ki": "FAILED", "2Ki": "FAILED"}
    assert sweep_outcomes(slower) == {"PASSED"}
    for size in ("1Ki", "2Ki"):
        slower.stdout.fnmatch_lines(
            [
                f"*TTFT at {size} regressed: baseline *, now *, +400.0% (tolerance +200%, "
                "p=* < 0.3, Welch t=*; one-session baseline: within-session noise only)",
                f"*decode throughput at {size} fell: *, -80.0% (tolerance -60%, p=* < 0.3*",
            ]
        )
