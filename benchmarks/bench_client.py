"""How exact the instrument is, and what it costs the client per request.

(a) accuracy: many requests against tests/support/fake_vllm.py (in a process of its own) with
    100 ms and 1 s injected TTFTs; prints the TTFT error (ms) split by the fake's stamps into the
    client's share and the fake's share, and the decode-rate error (%) against the fake's write
    times.
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
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT))

from fake_vllm import Behaviour, FakeVLLM, FakeVLLMProcess  # noqa: E402

from pytest_longctx.client import (  # noqa: E402
    ClientConfig,
    CompletionClient,
    CompletionRequest,
    encode_request,
    quantile,
)
from pytest_longctx.core.sizes import format_size, parse_size, powers_of_two_between  # noqa: E402

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
        f"{token_delay_s * 1e3:g} ms, 1Ki-id prompt; the fake runs in its own process and "
        "stamps on the same clock when it read the request line and just before each chunk's "
        "write. TTFT error = measured - injected = client's share + fake's share:\n"
        "    fake's share: the request line read to the first chunk's write, less the injected "
        "delay (header and JSON parsing, sleep overshoot, the response headers)\n"
        "    client's share: the rest: t0 to the fake reading the request line (upload, "
        "the fake's wake-up), plus the chunk's write to the client's arrival stamp\n"
        "decode error: the client's rate against the fake's own write times"
    )
    print(
        f"{'injected':>8} {'TTFT err':>8} {'p90':>6} {'client':>7} {'p90':>6} {'intake':>6} "
        f"{'deliv.':>6} {'fake':>6} {'p90':>6} {'decode err':>10} {'p90 |err|':>9}   (ms, medians)"
    )
    prompt = token_ids(1024, seed=1)
    for ttft_s in ttfts_s:
        behaviour = Behaviour(first_token_delay_s=ttft_s, token_delay_s=token_delay_s)
        ttft_err, client, fake, intake, delivery, rate_err = [], [], [], [], [], []
        with FakeVLLMProcess(behaviour) as server:
            with CompletionClient(ClientConfig(server.url)) as client_:
                request = CompletionRequest(model=MODEL, prompt=prompt, decode_tokens=tokens)
                results = [
                    client_.measure(request, first_token_budget_s=30) for _ in range(requests + 2)
                ][2:]  # the first two warm up imports and caches
            streams = server.streams[2:]
        for result, times in zip(results, streams, strict=True):
            written = times.chunks_written_at
            fake_ms = (written[0] - times.request_at - ttft_s) * 1e3
            ttft_err.append((result.ttft_s - ttft_s) * 1e3)
            fake.append(fake_ms)
            client.append(ttft_err[-1] - fake_ms)
            intake.append((times.request_at - result.started_perf_s) * 1e3)
            delivery.append((result.started_perf_s + result.ttft_s - written[0]) * 1e3)
            true_rate = (times.tokens - times.tokens_per_chunk[0]) / (written[-1] - written[0])
            rate_err.append((result.decode_throughput - true_rate) / true_rate * 100)
        rate_abs = sorted(abs(e) for e in rate_err)
        print(
            f"{ttft_s * 1e3:>5.0f} ms {median(ttft_err):>8.2f} {p90(ttft_err):>6.2f} "
            f"{median(client):>7.2f} {p90(client):>6.2f} {median(intake):>6.2f} "
            f"{median(delivery):>6.2f} {median(fake):>6.2f} {p90(fake):>6.2f} "
            f"{median(rate_err):>8.3f} % {quantile(rate_abs, 0.9):>7.3f} %"
        )


def median(values: list[float]) -> float:
    return statistics.median(values)


def p90(values: list[float]) -> float:
    return quantile(sorted(values), 0.9)


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
        accuracy(args.requests, [0.1, 1.0], tokens=32, token_delay_s=0.01)
    if "b" not in skip:
        cost(lengths, parse_size(args.compare_up_to))
    if "c" not in skip:
        memory(parse_size(args.memory_size))
    if "d" not in skip:
        upload_pieces(parse_size(args.pieces_size))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
