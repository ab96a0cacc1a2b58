"""Prompt building cost: time and peak memory to build an exact-length prompt.

Prints, for each length, the first build (corpus body made and cached on disk) and a rebuild
(body read from the cache, as a rerun or a resumed campaign does), with the peak memory that
tracemalloc saw and the process's peak RSS. Uses the embedded tiny-llama tokenizer.

    python benchmarks/bench_prompts.py            # 1Mi and 16Mi
    python benchmarks/bench_prompts.py 1Ki 64Mi
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from pytest_longctx.core.sizes import format_size, parse_size
from pytest_longctx.prompts import LocalTokenSource, PromptBuilder
from pytest_longctx.serving.embedded import ensure_embedded_model


def measure(builder: PromptBuilder, length: int, tag: str) -> tuple[float, float]:
    """Time without tracing (tracemalloc slows allocation), then peak memory with it."""
    started = time.perf_counter()
    prompt = builder.build(length, tag)
    elapsed = time.perf_counter() - started
    assert prompt.token_count == length
    del prompt
    tracemalloc.start()
    builder.build(length, tag)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return elapsed, peak / 2**20


def main(argv: list[str]) -> None:
    lengths = [parse_size(a) for a in argv] or [parse_size("1Mi"), parse_size("16Mi")]
    source = LocalTokenSource(str(ensure_embedded_model("tiny-llama")))
    with tempfile.TemporaryDirectory() as cache:
        builder = PromptBuilder(source, Path(cache), seed=0)
        started = time.perf_counter()
        corpus = builder.corpus_ids()
        print(
            f"corpus: {len(corpus):,} tokens tokenized and cached in "
            f"{time.perf_counter() - started:.2f} s"
        )
        print(f"{'length':>8} {'first build':>12} {'peak MiB':>9} {'rebuild':>9} {'peak MiB':>9}")
        for length in lengths:
            first, first_peak = measure(builder, length, f"bench first {length}")
            again, again_peak = measure(builder, length, f"bench again {length}")
            print(
                f"{format_size(length):>8} {first:>10.3f} s {first_peak:>9.1f} "
                f"{again:>7.3f} s {again_peak:>9.1f}"
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS: {rss:.0f} MiB (ids are 4 bytes each: 16Mi ids = 64 MiB)")


if __name__ == "__main__":
    main(sys.argv[1:])
