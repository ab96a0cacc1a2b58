"""The reports of real vLLM sweeps as a reader sees them: rendered by headless Chromium, read
from the live DOM. A plain sweep, and a gated one that fails against a baseline made a
thousand times faster than what was measured; the runs' index, the compare page and a rebuilt
report of them. The pages' structure, on records written by hand:
tests/unit/reporting/test_browser.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import (  # noqa: F401 - the fixtures
    Browser,
    assert_clean,
    assert_images_decoded,
    assert_shown,
    browser,
    chromium,
    gate_rows,
    results_table,
    summary_lengths,
)
from longctx_testing import ATTACHED_TIMEOUT_S, SHARED_SERVERS_PROFILE, SWEEP_TEST, run_folder

from pytest_longctx.cli import main as cli_main
from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.core.sizes import format_size
from pytest_longctx.reporting.run_comparison import write_comparison

pytestmark = pytest.mark.vllm

KI = 1024
#: The columns the plugin adds to pytest-html's results table, as rendered.
RESULTS_COLUMNS = ["Length", "Repeat", "TTFT (s)", "Decode (tok/s)", "Prompt tokens"]


@dataclass(frozen=True)
class RealRuns:
    output: Path
    plain: Path  # 1Ki..2Ki x2, measured
    gated: Path  # the same sweep measured again, gated against `baseline`
    baseline: Path
    gated_stdout: str


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=ATTACHED_TIMEOUT_S,
        env={key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"},
    )


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory, vllm_url: str) -> RealRuns:
    project = tmp_path_factory.mktemp("browser-sweeps")
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (project / "test_sweep.py").write_text(SWEEP_TEST, encoding="utf-8")
    output = project / "reports"
    sweep = (
        f"--longctx-url={vllm_url}",
        SHARED_SERVERS_PROFILE,
        f"--longctx-output={output}",
        "--longctx-to=2Ki",
    )
    plain = run_pytest(project, *sweep, "--longctx-repeats=2")
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-2000:]
    plain_dir = run_folder(output)
    # The baseline: one record per length, a thousand times faster than that length's fastest
    # repeat. One repeat has no spread, so the tolerance alone decides. A busy host can slow
    # one real point many times over against the next, so the factor is far past any such
    # swing: a fresh measurement is nowhere near 1/1000th of the fastest one.
    baseline = project / "faster-baseline.jsonl"
    records = list(read_records(plain_dir / "results.jsonl").records)
    for record in records:
        if record.repeat == 0:
            fastest = min(r.figures["ttft"] for r in records if r.length == record.length)
            figures = {**record.figures, "ttft": fastest / 1000}
            append_record(baseline, Record(**{**record.__dict__, "figures": figures}))
    gated = run_pytest(
        project,
        *sweep,
        "--longctx-repeats=2",
        f"--longctx-baseline={baseline}",
        "--longctx-tolerance=ttft=200%,decode=off,itl=off",
    )
    assert gated.returncode == 1, gated.stdout[-4000:] + gated.stderr[-2000:]
    gated_dir = run_folder(output)
    assert gated_dir != plain_dir
    return RealRuns(output, plain_dir, gated_dir, baseline, gated.stdout)


def test_real_sweep_page_lists_its_items_with_their_figures(
    browser: Browser,  # noqa: F811
    real_runs: RealRuns,
) -> None:
    records = list(read_records(real_runs.plain / "results.jsonl").records)
    assert len(records) == 4 and {r.outcome for r in records} == {"passed"}
    page = browser.open(real_runs.plain / "report.html")
    table = results_table(page)
    assert set(table) == {r.nodeid.rsplit("::", 1)[-1] for r in records}
    header = page.header("#results-table")
    assert header[2:7] == RESULTS_COLUMNS
    for record in records:
        row = table[record.nodeid.rsplit("::", 1)[-1]]
        assert row["Result"] == "Passed"
        assert row["Length"] == format_size(record.length)
        assert_shown(row["TTFT (s)"], record.figures["ttft"])
        assert_shown(row["Decode (tok/s)"], record.figures["decode_throughput"])
    assert summary_lengths(page) == ["1Ki", "2Ki"]
    assert_images_decoded(page, {"ttft", "decode", "kv_cache"})
    assert page.evaluate("document.querySelectorAll('.longctx-gate').length") == 0
    assert_clean(page)


def test_real_failing_gated_session_shows_the_gate_chart(
    browser: Browser,  # noqa: F811
    real_runs: RealRuns,
) -> None:
    """Done when: the gate's chart appears on a failing gated session."""
    assert "FAILED test_sweep.py::test_regression[len=1Ki]" in real_runs.gated_stdout
    assert (real_runs.gated / "gate.png").is_file()
    page = browser.open(real_runs.gated / "report.html")
    table = results_table(page)
    assert {n: r["Result"] for n, r in table.items() if "regression" in n} == {
        "test_regression[len=1Ki]": "Failed",
        "test_regression[len=2Ki]": "Failed",
    }
    assert all(r["Result"] == "Passed" for n, r in table.items() if "prefill" in n)
    rows = gate_rows(page)
    assert set(rows) == {"1Ki", "2Ki"}
    baseline = {r.length: r for r in read_records(real_runs.baseline).records}
    for length, row in rows.items():
        assert row["failing"] and row["Gate"] == "regressed"
        # the baseline's single repeat, as the table prints it
        expected = baseline[KI if length == "1Ki" else 2 * KI].figures["ttft"]
        mean = float(row["TTFT baseline (s)"].split(" ")[0])
        assert abs(mean - expected) <= 0.005 * expected + 1e-9
        assert row["TTFT change"].endswith("% worse"), row
    images = assert_images_decoded(page, {"ttft", "decode", "gate"})
    gate_image = [image for image in images if image["alt"] == "gate"]
    assert len(gate_image) == 1 and gate_image[0]["width"] >= 400
    assert_clean(page)
    markdown = (real_runs.gated / "report.md").read_text(encoding="utf-8")
    assert "## Regression gate" in markdown and "![gate](gate.png)" in markdown
    assert "**2 of 2 lengths failed (1Ki, 2Ki)**" in markdown


def test_real_runs_in_the_index_the_compare_page_and_a_rebuilt_report(
    browser: Browser,  # noqa: F811
    real_runs: RealRuns,
    tmp_path: Path,
) -> None:
    index = browser.open(real_runs.output / "index.html")
    header = index.header(".longctx-runs")
    table = [dict(zip(header, row, strict=True)) for row in index.table(".longctx-runs")]
    assert [row["Run"] for row in table] == [
        f"{real_runs.gated.name} (latest)",
        real_runs.plain.name,
    ]
    assert [row["Points (passed/total)"] for row in table] == ["4/4", "4/4"]
    assert {row["Profile"] for row in table} == {"cpu-tiny"}
    assert {row["Reports"] for row in table} == {"report.html report.md results.jsonl"}
    assert_clean(index)

    write_comparison([real_runs.plain, real_runs.gated], tmp_path / "compared")
    compared = browser.open(tmp_path / "compared" / "compare.html")
    lengths = compared.evaluate(
        """[...document.querySelectorAll('table.longctx-compare-ttft tr')].slice(1).map(
            (tr) => tr.cells[0].innerText)"""
    )
    assert lengths == ["1Ki", "2Ki"]
    assert_images_decoded(compared, {"compare_ttft", "compare_decode", "compare_ratio"})
    assert_clean(compared)

    rebuilt = tmp_path / "rebuilt"
    args = ["report", str(real_runs.gated), "--output", str(rebuilt)]
    tolerance = "ttft=200%,decode=off,itl=off"
    assert cli_main([*args, "--baseline", str(real_runs.baseline), "--tolerance", tolerance]) == 0
    page = browser.open(rebuilt / "report.html")
    assert summary_lengths(page) == ["1Ki", "2Ki"]
    assert {n for n, row in gate_rows(page).items() if row["failing"]} == {"1Ki", "2Ki"}
    assert_images_decoded(page, {"ttft", "decode", "kv_cache", "gate"})
    assert_clean(page)
