"""How well does the ETA model predict the points a sweep has not reached yet?

From real records, the last three lengths are predicted from the earlier ones, two ways:

* **next length**: the model fitted to every shorter length predicts the next one; this is the
  ``predicted_ttft`` a session records before each point;
* **from the start**: one model fitted to the lengths before the last three predicts all
  three, the way the sweep's ETA prices points far ahead.

Beside them, what an equal-step ETA would have said (the mean TTFT per point so far, times the
points left): the ETA model weighs each point by its cost instead.

    .venv/bin/python benchmarks/bench_eta.py reports/RUN [reports/RUN2 ...]   # finished runs
    .venv/bin/python benchmarks/bench_eta.py --sweep                           # run one first:
        # cpu-tiny prefilling 2,048 tokens a step (--max-num-batched-tokens), 1Ki..32Ki
    .venv/bin/python benchmarks/bench_eta.py --sweep --chunk 0 -- --longctx-to=16Ki
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_longctx.core.records import read_runs  # noqa: E402
from pytest_longctx.core.sizes import format_size  # noqa: E402
from pytest_longctx.profiles import PROFILE_DIR  # noqa: E402
from pytest_longctx.progress.eta import CostModel, fit_ttft, passed_means  # noqa: E402

DEFAULT_SWEEP = ["--longctx-from=1Ki", "--longctx-to=32Ki", "--longctx-repeats=2"]


def chunked_profile(folder: Path, chunk: int) -> Path:
    """cpu-tiny with ``--max-num-batched-tokens chunk`` (0: cpu-tiny as it ships)."""
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    if chunk:
        old = 'extra_args = ["--seed", "0"]'
        assert old in text, "cpu-tiny.toml changed: update the benchmark"
        text = text.replace(
            old, f'extra_args = ["--seed", "0", "--max-num-batched-tokens", "{chunk}"]'
        )
    path = folder / f"cpu-tiny-chunk{chunk}.toml"
    path.write_text(text)
    return path


def run_sweep(output: Path, chunk: int, sweep_args: list[str]) -> Path:
    profile = chunked_profile(output, chunk)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    command += ["tests/test_sweep.py", f"--longctx-output={output}"]
    command += [f"--longctx-profile={profile}", "--longctx-progress=off", *sweep_args]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, check=False)
    if done.returncode != 0:
        sys.exit(f"the sweep failed (exit status {done.returncode})")
    return (output / "latest").resolve()


def report(run_dirs: list[Path]) -> None:
    result = read_runs(run_dirs)
    records = list(result.records)
    means = passed_means(records, "ttft")
    lengths = list(means)
    if len(lengths) < 5:
        sys.exit(f"{len(lengths)} measured lengths: need 5 (two to fit, three to predict)")
    counts = {n: sum(r.length == n and r.outcome == "passed" for r in records) for n in lengths}
    print(f"runs: {', '.join(str(p) for p in run_dirs)}")
    print(
        "measured (mean client TTFT over passed repeats): "
        + ", ".join(f"{format_size(n)} {means[n]:.3f} s (n={counts[n]})" for n in lengths)
    )
    last = lengths[-3:]
    early = [r for r in records if r.length < last[0]]
    fixed = fit_ttft(early)
    print(f"from the start: {fixed.describe()}")
    print()
    header = (
        f"{'length':>7}  {'measured':>9}  {'next length':>11}  {'error':>7}  "
        f"{'from start':>10}  {'error':>7}  fitted to"
    )
    print(header)
    print("-" * len(header))
    for length in last:
        before = [r for r in records if r.length < length]
        step = fit_ttft(before)
        measured = means[length]
        one, far = step(length), fixed(length)
        one_error, far_error = (one - measured) / measured, (far - measured) / measured
        print(
            f"{format_size(length):>7}  {measured:>8.3f}s  {one:>10.3f}s  {one_error:>+7.1%}  "
            f"{far:>9.3f}s  {far_error:>+7.1%}"
            f"  {format_size(step.lengths[0])}..{format_size(step.lengths[-1])}"
        )
    # The ETA for the last three points, as it stood before them, against what they took.
    decode_tokens = max((r.completion_tokens or 0) for r in records) or 32
    model = CostModel.fit(early, decode_tokens)
    took = sum(
        (r.figures.get("ttft") or 0.0) + (decode_tokens - 1) / r.figures["decode_throughput"]
        for r in records
        if r.length in last and r.outcome == "passed" and r.figures.get("decode_throughput")
    )
    left = [r.length for r in records if r.length in last and r.outcome == "passed"]
    weighted = model.sweep_cost(left)
    done = [r for r in early if r.outcome == "passed" and r.figures.get("decode_throughput")]
    per_point = sum(
        r.figures["ttft"] + (decode_tokens - 1) / r.figures["decode_throughput"] for r in done
    ) / len(done)
    print()
    print(
        f"ETA for the last {len(left)} points before them: cost-weighted {weighted:.1f} s, "
        f"equal steps {per_point * len(left):.1f} s; they took {took:.1f} s "
        "(TTFT + decode, no prompt building)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run folders or results.jsonl files")
    parser.add_argument("--sweep", action="store_true", help="run a sweep first, then report")
    parser.add_argument(
        "--chunk", type=int, default=2048, help="--max-num-batched-tokens for --sweep (0: off)"
    )
    parser.add_argument("--output", help="where --sweep writes its run (default: a temp folder)")
    args, extra = parser.parse_known_args(argv)
    extra = [arg for arg in extra if arg != "--"]
    runs = [Path(run) for run in args.runs]
    if args.sweep:
        output = Path(args.output or tempfile.mkdtemp(prefix="bench-eta-"))
        output.mkdir(parents=True, exist_ok=True)
        runs.append(run_sweep(output, args.chunk, extra or DEFAULT_SWEEP))
    if not runs:
        parser.error("give run folders, or --sweep")
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
