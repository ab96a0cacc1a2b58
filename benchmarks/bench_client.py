"""How exact the instrument is, and what it costs the client per request.

(a) accuracy: many requests against tests/fake_vllm.py with injected TTFT and token delays;
    prints the error of the measured TTFT (ms) and decode rate (%).
(b) cost per prompt length: body build time, JSON size and upload time to a loopback sink,
    against ``json.dumps`` and ``",".join`` for the lengths where those finish quickly.
(c) peak memory of building one body (tracemalloc), against the body's own size.
(d) upload time by upload piece size, for one length.

    .venv/bin/python benchmarks/bench_client.py                 # everything, 1Ki..64Mi
    .venv/bin/python benchmarks/bench_client.py --sizes 1Ki,1Mi --requests 10
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fake_vllm import Behaviour, FakeVLLM  # noqa: E402

from pytest_longctx.client import (  # noqa: E402
    ClientConfig,
    CompletionClient,
    CompletionRequest,
    encode_request,
    quantile,
)
from pytest_longctx.sizes import format_size, parse_size, powers_of_two_between  # noqa: E402

VOCAB = 151_936  # a Qwen-sized vocabulary: ids up to six digits
MODEL = "fake-model"


def token_ids(length: int, seed: int) -> array:
    """Random ids as the prompt builder hands them over: ``array('I')``."""
    ids = array("I")
    ids.frombytes(np.random.default_rng(seed).integers(0, VOCAB, length, dtype=np.uint32).tobytes())
    return ids


def accuracy(requests: int, ttfts_s: list[float], tokens: int, token_delay_s: float) -> None:
    print(
        f"(a) instrument error over {requests} requests per row, {tokens} tokens at "
        f"{token_delay_s * 1e3:g} ms, 1Ki-id prompt (measured minus injected). The TTFT error "
        "splits into: intake (client t0 to the fake having read the body: connect, upload, "
        "the fake's thread start and parsing), late (the fake's sleep overshoot) and delivery "
        "(the fake's write to the client's read); medians"
    )
    print(
        f"{'injected':>8} {'TTFT err mean':>13} {'median':>7} {'p90':>6} {'max':>6} "
        f"{'intake':>7} {'late':>5} {'deliv.':>6} {'decode err mean':>15} {'median':>7} "
        f"{'p90 |err|':>9}"
    )
    prompt = token_ids(1024, seed=1)
    true_rate = 1 / token_delay_s
    for ttft_s in ttfts_s:
        behaviour = Behaviour(first_token_delay_s=ttft_s, token_delay_s=token_delay_s)
        ttft_err, rate_err, intake, late, delivery = [], [], [], [], []
        with FakeVLLM(behaviour) as server, CompletionClient(ClientConfig(server.url)) as client:
            for _ in range(requests):
                request = CompletionRequest(model=MODEL, prompt=prompt, decode_tokens=tokens)
                result = client.measure(request, first_token_budget_s=30)
                times = server.streams[-1]
                ttft_err.append((result.ttft_s - ttft_s) * 1e3)
                rate_err.append((result.decode_throughput - true_rate) / true_rate * 100)
                intake.append((times.body_read_at - result.started_perf_s) * 1e3)
                late.append((times.first_token_at - times.body_read_at - ttft_s) * 1e3)
                arrival = result.started_perf_s + result.ttft_s
                delivery.append((arrival - times.first_token_at) * 1e3)
        ordered = sorted(ttft_err)
        rate_abs = sorted(abs(e) for e in rate_err)
        print(
            f"{ttft_s * 1e3:>5.0f} ms {statistics.fmean(ttft_err):>10.2f} ms "
            f"{quantile(ordered, 0.5):>7.2f} {quantile(ordered, 0.9):>6.2f} {ordered[-1]:>6.2f} "
            f"{statistics.median(intake):>7.2f} {statistics.median(late):>5.2f} "
            f"{statistics.median(delivery):>6.2f} {statistics.fmean(rate_err):>13.2f} % "
            f"{statistics.median(rate_err):>7.2f} {quantile(rate_abs, 0.9):>9.2f}"
        )


def seconds(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def dumps_ids(ids: array) -> str:
    return json.dumps(ids.tolist(), separators=(",", ":"))


def join_ids(ids: array) -> str:
    return "[" + ",".join(map(str, ids)) + "]"


def cost(lengths: list[int], compare_up_to: int) -> None:
    print()
    print("(b) client cost per request: body build, JSON size, upload to a loopback sink")
    print(
        f"{'length':>7} {'build':>9} {'ns/id':>6} {'JSON MB':>9} {'upload':>9} {'MB/s':>6} "
        f"{'ttft':>9} {'json.dumps':>11} {'str.join':>9}"
    )
    sink = Behaviour(read_prompt=False, max_model_len=1 << 40)
    with FakeVLLM(sink) as server, CompletionClient(ClientConfig(server.url)) as client:
        for length in lengths:
            print(cost_row(client, length, compare_up_to), flush=True)
            gc.collect()


def cost_row(client: CompletionClient, length: int, compare_up_to: int) -> str:
    ids = token_ids(length, seed=length)
    request = CompletionRequest(model=MODEL, prompt=ids, decode_tokens=1)
    result = client.measure(request, first_token_budget_s=600)
    if result.prompt_tokens != length:
        raise SystemExit(f"the sink counted {result.prompt_tokens} ids, sent {length}")
    dumps = join = "-"
    if length <= compare_up_to:
        dumps, join = f"{seconds(dumps_ids, ids):.4f} s", f"{seconds(join_ids, ids):.4f} s"
    upload = result.upload_s or float("nan")
    return (
        f"{format_size(length):>7} {result.body_build_s:>7.4f} s "
        f"{result.body_build_s / length * 1e9:>6.1f} {result.body_bytes / 1e6:>9.2f} "
        f"{upload:>7.4f} s {result.body_bytes / 1e6 / upload:>6.0f} "
        f"{result.ttft_s:>7.4f} s {dumps:>11} {join:>9}"
    )


def memory(length: int) -> None:
    print()
    ids = token_ids(length, seed=7)
    request = CompletionRequest(model=MODEL, prompt=ids, decode_tokens=1)
    encode_request(CompletionRequest(model=MODEL, prompt=ids[:10], decode_tokens=1))  # table
    gc.collect()
    tracemalloc.start()
    baseline, _ = tracemalloc.get_traced_memory()
    body = encode_request(request)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    extra = peak - baseline - body.size
    print(
        f"(c) building the {format_size(length)} body: body {body.size / 2**20:.1f} MiB, "
        f"peak traced {(peak - baseline) / 2**20:.1f} MiB (body + {extra / 2**20:.1f} MiB "
        f"of working space); the ids themselves: {len(ids) * ids.itemsize / 2**20:.1f} MiB"
    )


def upload_pieces(length: int) -> None:
    print()
    print(
        f"(d) upload of the {format_size(length)} body by piece size (httpcore copies the "
        "unsent rest of each piece after every send)"
    )
    ids = token_ids(length, seed=3)
    with FakeVLLM(Behaviour(read_prompt=False, max_model_len=1 << 40)) as server:
        for piece in (64 << 10, 1 << 20, 16 << 20, 1 << 40):
            config = ClientConfig(server.url, upload_chunk_bytes=piece)
            with CompletionClient(config) as client:
                request = CompletionRequest(model=MODEL, prompt=ids, decode_tokens=1)
                result = client.measure(request, first_token_budget_s=600)
            label = "whole body" if piece >= 1 << 40 else f"{piece >> 10} KiB"
            print(f"{label:>11}: upload {result.upload_s:.4f} s, ttft {result.ttft_s:.4f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="1Ki-64Mi",
        help="comma-separated lengths, or LOW-HIGH for the powers of two between",
    )
    parser.add_argument("--requests", type=int, default=50, help="requests per accuracy row")
    parser.add_argument(
        "--compare-up-to",
        default="4Mi",
        help="longest length also encoded with json.dumps and str.join",
    )
    parser.add_argument("--memory-size", default="16Mi")
    parser.add_argument("--pieces-size", default="16Mi")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d")
    args = parser.parse_args()
    if "-" in args.sizes:
        low, high = args.sizes.split("-")
        lengths = powers_of_two_between(parse_size(low), parse_size(high))
    else:
        lengths = [parse_size(size) for size in args.sizes.split(",")]
    skip = set(args.skip.split(","))
    started = time.perf_counter()
    if "a" not in skip:
        accuracy(args.requests, [0.1, 0.2], tokens=32, token_delay_s=0.01)
    if "b" not in skip:
        cost(lengths, parse_size(args.compare_up_to))
    if "c" not in skip:
        memory(parse_size(args.memory_size))
    if "d" not in skip:
        upload_pieces(parse_size(args.pieces_size))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
