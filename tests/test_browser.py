"""The reports as a reader sees them: rendered by headless Chromium, read from the live DOM.

Every page here is opened from disk, offline, and checked after its scripts ran: the tables'
rows, every image decoded, no console error, nothing fetched from elsewhere. pytest-html's
results table exists only once its JavaScript has built it from the page's data blob, so it
can only be checked this way.

The first tests use records written here (the pages' structure); the last ones render the
pages of real vLLM sweeps: a plain one, and a gated one that fails against a baseline made
a thousand times faster than what was measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from browser import Browser, Page, browser, chromium  # noqa: F401 - the fixtures
from fabricated_runs import BUILT_IN, NOW, faster, make_records, write_records, write_run
from longctx_testing import ATTACHED_TIMEOUT_S, SHARED_SERVERS_PROFILE, SWEEP_TEST, run_folder

from pytest_longctx.campaign import lifecycle
from pytest_longctx.cli import main as cli_main
from pytest_longctx.core.records import Record, append_record, read_records
from pytest_longctx.core.sizes import format_size
from pytest_longctx.reporting.run_comparison import write_comparison

KI = 1024
#: The columns the plugin adds to pytest-html's results table, as rendered.
RESULTS_COLUMNS = ["Length", "Repeat", "TTFT (s)", "Decode (tok/s)", "Prompt tokens"]


# --------------------------------------------------------------------------- what pages show


def assert_clean(page: Page) -> None:
    """No console error or uncaught exception, and nothing loaded from elsewhere."""
    page.evaluate("document.readyState")  # reads every event the browser sent so far
    assert page.errors == [], page.url
    assert page.external_requests == [], page.url


def assert_images_decoded(page: Page, expected: set[str]) -> list[dict]:
    """Every image on show decoded (a broken or empty one has naturalWidth 0), ``expected``
    among them; returns those. pytest-html's per-row media viewers hold an ``<img src="">``
    that stays hidden in rows without media: those may be empty, never shown."""
    images = page.images()
    shown = [image for image in images if image["shown"]]
    assert shown, f"no image on show in {page.url}: {images}"
    for image in shown:
        assert image["width"] > 0 and image["height"] > 0, image
        assert image["src"].startswith("data:image/png;base64"), image
    for image in images:
        assert image["shown"] or image["src"] == "", image  # a hidden image is a placeholder
    assert expected <= {image["alt"] for image in shown}, images
    return shown


def gate_rows(page: Page) -> dict[str, dict]:
    """The gate table's rows as rendered: length -> cells by header, failing, background."""
    rows = page.evaluate(
        """[...document.querySelectorAll('.longctx-gate-table tbody tr')].map((tr) => ({
            cells: [...tr.cells].map((td) => td.innerText.trim()),
            failing: tr.classList.contains('longctx-gate-failing'),
            background: getComputedStyle(tr.cells[0]).backgroundColor}))"""
    )
    header = page.header(".longctx-gate-table")
    return {
        row["cells"][0]: {
            **dict(zip(header, row["cells"], strict=True)),
            "failing": row["failing"],
            "background": row["background"],
        }
        for row in rows
    }


def assert_gate_shows(page: Page, failing: set[str], passing: set[str]) -> dict[str, dict]:
    rows = gate_rows(page)
    assert set(rows) == failing | passing
    assert {n for n, row in rows.items() if row["failing"]} == failing
    for length in failing:
        assert rows[length]["Gate"] == "regressed"
        assert rows[length]["background"] == "rgb(253, 232, 232)"  # highlighted, as rendered
    for length in passing:
        assert rows[length]["Gate"] == "passed"
        assert rows[length]["background"] != "rgb(253, 232, 232)"
    shown = page.evaluate(
        "[...document.querySelectorAll('.longctx-gate-failures li')].map((li) => li.innerText)"
    )
    assert {text.split(":")[0] for text in shown} == failing
    return rows


def assert_shown(text: str, value: float) -> None:
    """``text`` is ``value`` rounded to the decimals it shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    assert abs(float(text.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9, (text, value)


def results_table(page: Page) -> dict[str, dict[str, str]]:
    """pytest-html's results table once its script built it: test name -> cells by header."""
    page.wait_for("document.querySelectorAll('#results-table tbody.results-table-row').length")
    header = page.header("#results-table")
    rows = page.evaluate(
        """[...document.querySelectorAll('#results-table tbody.results-table-row')].map(
            (body) => [...body.querySelector('tr.collapsible').cells].map(
                (td) => td.innerText.trim()))"""
    )
    table = {}
    for cells in rows:
        row = dict(zip(header, cells, strict=True))
        table[row["Test"].rsplit("::", 1)[-1]] = row
    return table


def summary_lengths(page: Page) -> list[str]:
    return [row[0] for row in page.table(".longctx-lengths")]  # the per-length table


# --------------------------------------------------------------------------- written records


def test_standalone_report_shows_the_gate_beside_the_run(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path / "reports", "20260101T000000Z-c0ffee")
    baseline = write_records(
        tmp_path / "baseline.jsonl", make_records("20251201T000000Z-ba5e11", faster(NOW))
    )

    assert cli_main(["report", str(run), "--baseline", str(baseline), "--tolerance", BUILT_IN]) == 0

    page = browser.open(run / "report.html")
    assert summary_lengths(page) == ["1Ki", "2Ki", "4Ki", "8Ki"]
    rows = assert_gate_shows(page, failing={"2Ki", "8Ki"}, passing={"1Ki", "4Ki"})
    assert rows["2Ki"]["TTFT baseline (s)"] == "0.0700 ± 0.0014 (n=3)"
    assert rows["2Ki"]["TTFT now (s)"] == "0.100 ± 0.002 (n=3)"
    assert rows["2Ki"]["TTFT change"] == "+42.9% worse"
    assert rows["2Ki"]["Decode change"] == "-30.0% worse"
    assert rows["1Ki"]["TTFT change"] == "+0.0%"
    headline = page.evaluate("document.querySelector('.longctx-gate-headline').innerText")
    assert headline == "2 of 4 lengths failed (2Ki, 8Ki)"
    assert_images_decoded(page, {"ttft", "decode", "gate"})
    assert_clean(page)

    markdown = (run / "report.md").read_text(encoding="utf-8")
    assert "## Regression gate" in markdown and "![gate](gate.png)" in markdown
    assert "| 2Ki | regressed | 0.0700 ± 0.0014 (n=3) | 0.100 ± 0.002 (n=3) | +42.9% worse |" in (
        markdown
    )
    assert "- 8Ki: TTFT at 8Ki regressed: baseline 0.280 ± 0.006 s (n=3)" in markdown
    # the report was written into a run folder: its output root lists it
    index = browser.open(tmp_path / "reports" / "index.html")
    assert [row[0] for row in index.table(".longctx-runs")] == [run.name]


def test_a_passing_gate_says_so_and_highlights_nothing(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path, "20260101T000000Z-c0ffee")
    baseline = write_records(tmp_path / "b.jsonl", make_records("20251201T000000Z-ba5e11", NOW))
    out = tmp_path / "out"
    args = ["report", str(run), "--baseline", str(baseline), "--output", str(out)]
    assert cli_main([*args, "--tolerance", BUILT_IN]) == 0

    page = browser.open(out / "report.html")
    assert_gate_shows(page, failing=set(), passing={"1Ki", "2Ki", "4Ki", "8Ki"})
    headline = page.evaluate("document.querySelector('.longctx-gate-headline').innerText")
    assert headline == "no regression over 4 lengths"
    assert_images_decoded(page, {"gate"})
    assert_clean(page)
    assert not (tmp_path / "index.html").exists()  # merged output, not a run folder


def test_index_lists_every_run_newest_first_with_links_that_open(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / "reports"
    older = write_run(root, "20260101T000000Z-0000aa", start=1_780_000_000.0)
    newer = write_run(root, "20260102T000000Z-0000bb", start=1_780_086_400.0)
    first = make_records(newer.name, {KI: NOW[KI]}, start=1_780_086_400.0)[0].__dict__
    failed = Record(**{**first, "repeat": 3, "outcome": "failed", "reason": "AssertionError"})
    append_record(newer / "results.jsonl", failed)
    (root / "latest").symlink_to(newer.name)
    (root / "not-a-run").mkdir()
    assert cli_main(["report", str(newer)]) == 0  # newer gets its reports, older has none
    assert cli_main(["index", str(root)]) == 0

    page = browser.open(root / "index.html")
    rows = page.table(".longctx-runs")
    header = page.header(".longctx-runs")
    table = [dict(zip(header, row, strict=True)) for row in rows]
    assert [row["Run"] for row in table] == [f"{newer.name} (latest)", older.name]
    assert [row["Date"] for row in table] == ["2026-05-29 20:26:40 UTC", "2026-05-28 20:26:40 UTC"]
    assert {row["Profile"] for row in table} == {"cpu-tiny"}
    assert {row["Model"] for row in table} == {"embedded:tiny-llama @ x"}
    assert [row["Points (passed/total)"] for row in table] == ["12/13", "12/12"]
    assert [row["Outcome"] for row in table] == ["failed: 12 passed, 1 failed", "passed"]
    assert [row["Reports"] for row in table] == [
        "report.html report.md results.jsonl",
        "results.jsonl",
    ]
    links = page.evaluate("[...document.querySelectorAll('.longctx-runs a')].map((a) => a.href)")
    assert len(links) == 4
    for link in links:
        assert Path(unquote(urlparse(link).path)).is_file(), link
    assert_clean(page)

    report = browser.open(Path(unquote(urlparse(links[0]).path)))
    assert summary_lengths(report) == ["1Ki", "2Ki", "4Ki", "8Ki"]
    assert_images_decoded(report, {"ttft", "decode"})
    assert_clean(report)


def test_compare_page_renders_its_tables_and_overlays(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    runs = [
        write_run(tmp_path, "20260101T000000Z-0000aa"),
        write_run(tmp_path, "20260102T000000Z-0000bb", faster(NOW, lengths=(4 * KI,), by=2.0)),
    ]
    write_comparison(runs, tmp_path / "compared")

    page = browser.open(tmp_path / "compared" / "compare.html")
    rows = page.evaluate(
        """[...document.querySelectorAll('table.longctx-compare-ttft tr')].slice(1).map(
            (tr) => [...tr.cells].map((td) => td.innerText.trim()))"""
    )
    assert [row[0] for row in rows] == ["1Ki", "2Ki", "4Ki", "8Ki"]
    four = dict(zip(["Length", "run 1", "run 2", "ratio", "verdict"], rows[2], strict=True))
    assert four["ratio"] == "x2.000" and four["verdict"].startswith("worse (p=")
    assert_images_decoded(page, {"compare_ttft", "compare_decode", "compare_ratio"})
    assert_clean(page)


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: lifecycle.ServerLifecycle) -> None:
        raise AssertionError("a session reporting finished records started a server")

    monkeypatch.setattr(lifecycle.ServerLifecycle, "start", refuse)


def test_pytest_html_page_of_a_failing_gated_session(
    browser: Browser,  # noqa: F811
    pytester: pytest.Pytester,
    no_server: None,
) -> None:
    """A session that resumes a finished run (no server) and gates it; the page as rendered."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    run = write_run(output, "20260101T000000Z-c0ffee")
    baseline = write_records(
        pytester.path / "baseline.jsonl", make_records("20251201T000000Z-ba5e11", faster(NOW))
    )
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--longctx-output={output}",
        f"--longctx-resume={run.name}",
        f"--longctx-baseline={baseline}",
        "--longctx-to=8Ki",
        "--longctx-repeats=3",
        f"--longctx-tolerance={BUILT_IN}",
    )
    result.assert_outcomes(passed=12 + 2, failed=2)

    page = browser.open(run / "report.html")
    table = results_table(page)
    sweep = {name: row for name, row in table.items() if name.startswith("test_prefill_decode")}
    assert len(sweep) == 12
    for record in make_records(run.name, NOW):
        row = sweep[record.nodeid.rsplit("::", 1)[-1]]
        assert row["Result"] == "Passed"
        assert row["Length"] == format_size(record.length)
        assert row["Repeat"] == str(record.repeat)
        assert_shown(row["TTFT (s)"], record.figures["ttft"])
        assert_shown(row["Decode (tok/s)"], record.figures["decode_throughput"])
        assert row["Prompt tokens"] == f"{record.length:,}"
    gate_items = {name: row["Result"] for name, row in table.items() if "regression" in name}
    assert gate_items == {
        "test_regression[len=1Ki]": "Passed",
        "test_regression[len=2Ki]": "Failed",
        "test_regression[len=4Ki]": "Passed",
        "test_regression[len=8Ki]": "Failed",
    }
    assert summary_lengths(page) == ["1Ki", "2Ki", "4Ki", "8Ki"]
    assert_gate_shows(page, failing={"2Ki", "8Ki"}, passing={"1Ki", "4Ki"})
    assert_images_decoded(page, {"ttft", "decode", "gate"})
    assert_clean(page)
    # the session listed its run in the output root (it wrote no record, so no `latest`)
    index = browser.open(output / "index.html")
    assert [row[0] for row in index.table(".longctx-runs")] == [run.name]


# --------------------------------------------------------------------------- real vLLM


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


@pytest.mark.vllm
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


@pytest.mark.vllm
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


@pytest.mark.vllm
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
