"""The reports as a reader sees them: rendered by headless Chromium, read from the live DOM.

Every page here is opened from disk, offline, and checked after its scripts ran: the tables'
rows, every image decoded, no console error, nothing fetched from elsewhere. pytest-html's
results table exists only once its JavaScript has built it from the page's data blob, so it
can only be checked this way.

The tests use records written here (the pages' structure); the pages of real vLLM sweeps
are rendered in tests/e2e/test_e2e_browser.py. What a page shows is read with the helpers of
tests/support/browser.py.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from browser import (  # noqa: F401 - the fixtures
    Browser,
    assert_clean,
    assert_gate_shows,
    assert_images_decoded,
    assert_shown,
    browser,
    chromium,
    results_table,
    summary_lengths,
)
from fabricated_runs import BUILT_IN, NOW, faster, make_records, write_records, write_run
from longctx_testing import SWEEP_TEST

from pytest_longctx.campaign import lifecycle
from pytest_longctx.cli import main as cli_main
from pytest_longctx.core.records import Record, append_record
from pytest_longctx.core.sizes import format_size
from pytest_longctx.reporting.run_comparison import write_comparison

KI = 1024


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
