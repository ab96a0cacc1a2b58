"""Progress inside a point on real vLLM: the suite's loaded cpu-tiny server prefills 2,048 tokens
per step (``--max-num-batched-tokens 2048``), so a 16Ki prompt takes eight chunks: several
seconds on an AVX2 host, well under one on an AMX host. Sampling every 50 ms sees the chunks on
either."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from longctx_testing import PLOTS, records_of, run_folder, run_session
from server_pool import SMALL_CHUNK

from pytest_longctx.progress.samples import read_samples

#: Timing relations a loaded host disturbs: ``make test`` runs them alone (the Makefile).
pytestmark = [pytest.mark.vllm, pytest.mark.host_timing]

CHUNK = SMALL_CHUNK
LENGTH = 16384
DECODE = 128
#: Short enough to see several of the eight chunks on the fastest CPU host.
INTERVAL = "--longctx-progress-interval=50ms"


def _watched_session(sweep_dir: pytest.Pytester, loaded_url: str):  # noqa: ANN202
    """One session 4Ki..16Ki on the loaded server, with another program polling its
    progress.json: (the run result, the output root, what that program read)."""
    output = sweep_dir.path / "reports"
    seen: list[dict] = []
    stop = threading.Event()

    def poll() -> None:  # another program watching progress.json while the session runs
        while not stop.is_set():
            for path in output.glob("*/progress.json"):
                try:
                    seen.append(json.loads(path.read_text()))
                except (OSError, ValueError) as exc:
                    seen.append({"error": repr(exc)})
            time.sleep(0.05)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        result, _ = run_session(
            sweep_dir,
            "--longctx-from=4Ki",
            f"--longctx-to={LENGTH}",
            f"--longctx-decode-tokens={DECODE}",
            INTERVAL,
            "--longctx-progress-throttle=0",
            PLOTS,
            url=loaded_url,
        )
    finally:
        stop.set()
        watcher.join()
    return result, output, seen


def _chunks_read(output: Path) -> list[int]:
    """The 16Ki point's KV gauge readings during its prefill."""
    point = read_samples(run_folder(output) / "samples" / "len=16Ki-rep=0.jsonl")
    return [
        s["kv_tokens"]
        for s in point.samples
        if s["phase"] == "prefill" and s["kv_tokens"] is not None
    ]


def _readings_apart(point, spacing_s: float) -> int:  # noqa: ANN001
    """The gauge's readings of the prefill before its end (less than the whole prompt),
    counted only where each came ``spacing_s`` or more after the last one counted."""
    counted, last = 0, None
    for sample in point.samples:
        value = sample.get("kv_tokens")
        if sample.get("phase") != "prefill" or value is None or value >= LENGTH:
            continue
        if last is None or sample["t"] - last >= spacing_s:
            counted, last = counted + 1, sample["t"]
    return counted


def test_a_long_prefill_is_watched_chunk_by_chunk(
    sweep_dir: pytest.Pytester, loaded_url: str
) -> None:
    result, output, seen = _watched_session(sweep_dir, loaded_url)
    result.assert_outcomes(passed=3)

    # The samples of the 16Ki point: the gauge rose chunk by chunk, in whole blocks.
    folder = run_folder(output)
    point = read_samples(folder / "samples" / "len=16Ki-rep=0.jsonl")
    block = point.header["block_size"]
    assert point.header["capacity_tokens"] > LENGTH
    tokens = _chunks_read(output)
    assert tokens == sorted(tokens), tokens  # monotonic
    assert all(value % block == 0 for value in tokens), tokens
    # a new chunk at each reading of the prefill three of the server's chunk times after the
    # one before (its own prefill time over eight), at least three (the first may read none
    # yet): a host busy with other work can hold the sampler's reads of /metrics back past a
    # short prefill, and the readings' own times say when it did
    chunk_s = records_of(output)[-1].figures["server_prefill"] * CHUNK / LENGTH
    apart = _readings_apart(point, 3 * chunk_s)
    seen_chunks = {value for value in tokens if 0 < value < LENGTH}
    assert len(seen_chunks) >= min(3, apart - 1), (tokens, apart, chunk_s, point.samples)
    # The first reading after the first token: the whole prompt, within one block of L (plus
    # the tokens decoded by then). A stream a busy host held back and flushed at once (all 128
    # tokens within 22 ms, once) has ended before the sampler reads: no reading then.
    decode = [s for s in point.samples if s["phase"] == "decode" and s["kv_tokens"] is not None]
    last = records_of(output)[-1]
    if last.stream["decode_source"] == "stream":
        assert decode, point.samples
    for reading in decode[:1]:
        assert LENGTH <= reading["kv_tokens"] <= LENGTH + block + DECODE, reading
        assert reading["prefilled"] == LENGTH
    assert len(point.prefill_curve()) >= 2

    # progress.json moved while the point ran, as another program sees it.
    assert not [state for state in seen if "error" in state]
    inside = [s for s in seen if s["phase"] == "prefill" and s["length"] == LENGTH]
    assert len({s["elapsed_s"] for s in inside}) >= 2, inside
    prefilled = [s["prefilled"] for s in inside if s["prefilled"] is not None]
    assert prefilled == sorted(prefilled) and max(prefilled) > 0, prefilled
    assert inside[-1]["index"] == 3 and inside[-1]["of"] == 3
    assert inside[-1]["predicted_ttft_s"] > 0 and inside[-1]["first_token_eta_s"] is not None
    # The session's last word, read once it is over (the watcher may not get a turn after it).
    assert json.loads((folder / "progress.json").read_text())["phase"] == "finished"

    # No terminal: plain lines (the throttle itself is tested against the fake server), the ETA
    # before each point, the summary.
    lines = result.stdout.lines
    assert [line for line in lines if line.startswith("longctx next: ")][-1].startswith(
        "longctx next: 16Ki rep 0 [3/3]: predicted TTFT "
    )
    watched = [line for line in lines if line.startswith("longctx 16Ki rep 0 [3/3] | ")]
    assert any("prefilled" in line for line in watched), lines
    assert not [line for line in lines if "\r" in line]
    result.stdout.fnmatch_lines(["pytest-longctx progress: predicted vs measured TTFT: *16Ki*"])

    # The prefill curve and the predictions in the reports.
    assert (folder / "prefill_rate.png").read_bytes().startswith(b"\x89PNG")
    report = (folder / "report.md").read_text()
    assert "![prefill_rate](prefill_rate.png)" in report
    assert "## Prediction and energy" in report and "Energy not measured: " in report

    records = records_of(output)
    assert records[-1].figures["predicted_ttft"] > 0
    assert "predicted_ttft" not in records[0].figures  # 4Ki: before two lengths


def test_quiet_mode_prints_nothing(sweep_dir: pytest.Pytester, loaded_url: str) -> None:
    """Off prints nothing, and the point is still watched and its samples kept. A 4Ki point:
    on an AMX host its prefill takes 0.07 s, between two readings, so only the readings every
    point has (before, at the first token when the thread gets to it, after) are asserted."""
    result, output = run_session(
        sweep_dir,
        "-m",
        "len==4Ki",
        "--longctx-progress=off",
        INTERVAL,
        "--longctx-progress-throttle=0",
        url=loaded_url,
    )
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert "longctx next" not in text and "longctx 4Ki" not in text
    assert "pytest-longctx progress" not in text
    folder = run_folder(output)
    assert json.loads((folder / "progress.json").read_text())["phase"] == "finished"
    point = read_samples(folder / "samples" / "len=4Ki-rep=0.jsonl")
    phases = [s["phase"] for s in point.samples]
    assert phases[0] == "before" and phases[-1] == "after", phases
    assert point.samples[-1]["received"] == 32 and point.samples[-1]["first_token_t"] > 0
