"""How often the gate cries wolf, and how often it catches a slowdown: by simulation.

Every trial builds records of one length with normally distributed TTFT and runs them through
the gate's own ``compare_length``, so the rule measured is the rule CI runs.

(a) The noise test alone (tolerance 0%) on unchanged runs of n repeats against a one-session
    baseline of n repeats, for n = 2, 3 and 5 (and 1 vs 2): its false-alarm rate should sit at
    or below the configured level. The old rule (3 Welch standard errors) is shown beside it.
(b) The full rule (tolerance AND test) at the default TTFT tolerance: false alarms of unchanged
    runs, and the detection rate of a 20% slowdown, at 5% CV; also 2 vs 1 repeats, where the
    tolerance alone decides.
(c) Sessions that differ from each other (a server start shifts the mean by a between-session
    CV) judged against a one-session baseline and against a history of sessions.

    .venv/bin/python benchmarks/bench_gate.py
    .venv/bin/python benchmarks/bench_gate.py --level 0.05 --trials 20000
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_longctx.core.records import Record  # noqa: E402
from pytest_longctx.gate import (  # noqa: E402
    DEFAULT_LEVEL,
    DEFAULT_TOLERANCES,
    compare_length,
    parse_level,
    parse_tolerances,
)

LENGTH = 4096
MEAN_TTFT = 0.200


def records(run_id: str, ttfts: list[float]) -> list[Record]:
    return [
        Record(
            run_id=run_id,
            nodeid=f"test_prefill_decode[len=4Ki-rep={repeat}]",
            length=LENGTH,
            repeat=repeat,
            outcome="passed",
            figures={"ttft": ttft},
        )
        for repeat, ttft in enumerate(ttfts)
    ]


def draw(rng: random.Random, n: int, mean: float, cv: float) -> list[float]:
    return [rng.gauss(mean, cv * mean) for _ in range(n)]


def old_rule_fails(before: list[float], after: list[float], tolerance_pct: float) -> bool:
    """The rule this gate replaced: beyond the tolerance and 3 Welch standard errors."""

    def var(values: list[float]) -> float:
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / (len(values) - 1)

    delta = sum(after) / len(after) - sum(before) / len(before)
    if len(before) > 1 and len(after) > 1:
        error = math.sqrt(var(before) / len(before) + var(after) / len(after))
    else:  # the other side's std stood in for a single sample
        known = before if len(before) > 1 else after
        error = math.sqrt(var(known)) * math.sqrt(1 / len(before) + 1 / len(after))
    return delta > tolerance_pct / 100 * (sum(before) / len(before)) and delta > 3 * error


def rate(hits: int, trials: int) -> str:
    half = 1.96 * math.sqrt(max(hits, 1) * (trials - hits) / trials) / trials
    return f"{hits / trials:7.2%} ± {half:.2%}"


def section_a(rng: random.Random, trials: int, level: float, cv: float) -> None:
    print(
        f"(a) noise test alone (tolerance 0%), unchanged runs, {cv:.0%} CV, level {level:g}, "
        f"{trials} trials per row: false-alarm rate (95% interval)"
    )
    print(f"    {'n base/now':>10}  {'Welch t-test':>18}  {'old: 3 SE':>18}")
    tolerance = parse_tolerances("ttft=0%,decode=off,itl=off")
    for n_base, n_now in ((2, 2), (3, 3), (5, 5)):
        new = old = 0
        for _ in range(trials):
            before = draw(rng, n_base, MEAN_TTFT, cv)
            after = draw(rng, n_now, MEAN_TTFT, cv)
            verdict = compare_length(
                records("base", before), records("now", after), LENGTH, tolerance, level=level
            )
            new += verdict.status == "regressed"
            old += old_rule_fails(before, after, 0.0)
        print(f"    {n_base:>4} / {n_now:<3}  {rate(new, trials):>18}  {rate(old, trials):>18}")


def section_b(rng: random.Random, trials: int, level: float, cv: float) -> None:
    tolerance_pct = DEFAULT_TOLERANCES["ttft"]
    tolerance = parse_tolerances(f"ttft={tolerance_pct:g}%,decode=off,itl=off")
    print(
        f"\n(b) full rule (TTFT tolerance {tolerance_pct:g}% and the test at {level:g}), "
        f"{cv:.0%} CV, {trials} trials per row"
    )
    print(f"    {'n base/now':>10}  {'false alarms':>18}  {'20% slowdown caught':>20}")
    for n_base, n_now in ((2, 2), (3, 3), (5, 5), (2, 1)):
        alarms = caught = 0
        for _ in range(trials):
            before = records("base", draw(rng, n_base, MEAN_TTFT, cv))
            same = records("now", draw(rng, n_now, MEAN_TTFT, cv))
            slower = records("now", draw(rng, n_now, MEAN_TTFT * 1.2, cv))
            alarms += compare_length(before, same, LENGTH, tolerance, level=level).regressed
            caught += compare_length(before, slower, LENGTH, tolerance, level=level).regressed
        note = "  (n=1 now: tolerance alone)" if n_now == 1 else ""
        print(
            f"    {n_base:>4} / {n_now:<3}  {rate(alarms, trials):>18}  "
            f"{rate(caught, trials):>20}{note}"
        )


def section_c(rng: random.Random, trials: int, level: float) -> None:
    between, within, repeats, history = 0.05, 0.01, 2, 5
    tolerance = parse_tolerances("ttft=0%,decode=off,itl=off")
    print(
        f"\n(c) sessions differ: between-session CV {between:.0%}, within {within:.0%}, "
        f"{repeats} repeats, noise test alone at {level:g}, {trials} trials per row"
    )

    def session(run_id: str, slowdown: float = 1.0) -> list[Record]:
        centre = rng.gauss(MEAN_TTFT, between * MEAN_TTFT) * slowdown
        return records(run_id, draw(rng, repeats, centre, within))

    for label, sessions in (("one-session baseline", 1), (f"{history}-session history", history)):
        alarms = caught = 0
        for _ in range(trials):
            baseline = [r for k in range(sessions) for r in session(f"s{k}")]
            alarms += compare_length(
                baseline, session("now"), LENGTH, tolerance, level=level
            ).regressed
            caught += compare_length(
                baseline, session("now", 1.2), LENGTH, tolerance, level=level
            ).regressed
        print(
            f"    {label:<22} false alarms {rate(alarms, trials)}, "
            f"20% slowdown caught {rate(caught, trials)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20_000)
    parser.add_argument("--level", default=str(DEFAULT_LEVEL), help="the gate level (0.01)")
    parser.add_argument("--cv", type=float, default=0.05, help="repeat-to-repeat CV (0.05)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    level = parse_level(args.level)
    rng = random.Random(args.seed)
    section_a(rng, args.trials, level, args.cv)
    section_b(rng, args.trials, level, args.cv)
    section_c(rng, max(args.trials // 4, 1000), level)


if __name__ == "__main__":
    main()
