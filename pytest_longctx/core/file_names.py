"""The names of the files a session writes, in one place: those in a run folder, and those
beside the run folders in the output root."""

from __future__ import annotations

#: The records of every point, appended as each is measured: every report's only input.
RESULTS_FILE = "results.jsonl"
#: Where the session stands, rewritten as it goes (see :func:`progress_file_name`).
PROGRESS_FILE = "progress.json"
#: The folder of each point's progress samples, one ``<point id>.jsonl`` per point.
SAMPLES_DIR = "samples"
#: The servers that measured this run, one entry per server start.
MEASURED_BY_FILE = "measured-by.json"

MARKDOWN = "report.md"
HTML = "report.html"
BENCHMARK = "benchmark.json"
TTFT_PLOT = "ttft.png"
DECODE_PLOT = "decode.png"
KV_CACHE_PLOT = "kv_cache.png"
GATE_PLOT = "gate.png"
PREFILL_RATE_PLOT = "prefill_rate.png"
REUSE_PLOT = "reuse.png"
INTERFERENCE_ITL_PLOT = "interference_itl.png"
INTERFERENCE_TTFT_PLOT = "interference_ttft.png"
CONCURRENCY_PLOT = "concurrency_decode.png"

#: ``pytest_longctx compare``'s outputs, in the folder it is given.
COMPARE_MARKDOWN = "compare.md"
COMPARE_HTML = "compare.html"
COMPARE_PLOTS = ("compare_ttft.png", "compare_decode.png", "compare_ratio.png")
COMPARE_INTERFERENCE_PLOT = "compare_interference.png"
COMPARE_CONCURRENCY_PLOT = "compare_concurrency.png"

#: The list of every run, in the output root beside the run folders.
INDEX = "index.html"
#: The symlink in the output root to the newest run folder.
LATEST = "latest"


def progress_file_name(worker: str | None = None) -> str:
    """``progress.json``; a pytest-xdist worker's own is ``progress-gw0.json``."""
    return f"progress-{worker}.json" if worker else PROGRESS_FILE


def server_file_stem(worker: str | None = None) -> str:
    """A launched server's files without their suffix: its log ``server.log`` and its process
    file ``server.json``; a pytest-xdist worker's server writes ``server-gw1.log``."""
    return f"server-{worker}" if worker else "server"
