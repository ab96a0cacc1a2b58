"""The names of the report files in a run folder, in one place (``results.jsonl``, their only
input, is :data:`pytest_longctx.core.records.RESULTS_FILE`)."""

MARKDOWN = "report.md"
HTML = "report.html"
BENCHMARK = "benchmark.json"
TTFT_PLOT = "ttft.png"
DECODE_PLOT = "decode.png"
KV_CACHE_PLOT = "kv_cache.png"
GATE_PLOT = "gate.png"
#: The list of every run, in the output root beside the run folders.
INDEX = "index.html"
PREFILL_RATE_PLOT = "prefill_rate.png"
