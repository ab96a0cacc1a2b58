"""Wall time of one sweep run serially on one server and with ``-n N`` on N servers.

Each session launches its own servers (cpu-tiny by default) and stops them, as CI does. On a
machine with few cores the servers share them, so the figure to read is the overhead of the
distributed run (N server starts in parallel, the workers' start-up, the scheduling), not a
speedup; on a node with a device per server the long points overlap.

    .venv/bin/python benchmarks/bench_distributed.py                       # 1Ki..8Ki x2, -n 2
    .venv/bin/python benchmarks/bench_distributed.py --workers 2 -- --longctx-to=16Ki
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_longctx.core.records import read_records  # noqa: E402


def session(output: Path, workers: int, extra: list[str]) -> tuple[float, list]:
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    args += [str(ROOT / "tests" / "test_sweep.py"), f"--longctx-output={output}", *extra]
    if workers:
        args += ["-n", str(workers)]
    started = time.monotonic()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:])
        raise SystemExit(f"the session failed (exit {done.returncode})")
    records = read_records(output / "latest" / "results.jsonl").records
    return wall, list(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("extra", nargs="*", help="sweep options after --")
    options = parser.parse_args()
    extra = options.extra or ["--longctx-to=8Ki", "--longctx-repeats=2"]
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for workers in (0, options.workers):
            wall, records = session(Path(folder) / f"n{workers}", workers, extra)
            busy: dict[str, float] = {}
            for r in records:
                server = str(r.fingerprint.get("server", {}).get("endpoint"))
                busy[server] = busy.get(server, 0.0) + (r.finished_at or 0) - (r.started_at or 0)
            rows.append((workers, wall, sum(busy.values()), max(busy.values()), len(busy)))
    print(f"sweep: {' '.join(extra)}")
    print(
        f"{'run':<8} {'servers':>7} {'wall s':>7} {'points s':>9} {'busiest server s':>17} "
        f"{'rest s':>7}"
    )
    for workers, wall, measured, busiest, servers in rows:
        name = "serial" if not workers else f"-n {workers}"
        print(
            f"{name:<8} {servers:>7} {wall:7.1f} {measured:9.1f} {busiest:17.1f} "
            f"{wall - busiest:7.1f}"
        )
    print("rest: the wall time outside the busiest server's points (start-up, warm-up, stop)")
    serial, distributed = rows[0][1], rows[1][1]
    print(f"-n {options.workers} / serial wall time: {distributed / serial:.2f}")


if __name__ == "__main__":
    main()
