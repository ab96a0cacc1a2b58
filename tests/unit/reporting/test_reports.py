"""Reports built from records alone: statistics, markdown, benchmark JSON, plots, HTML, CLI."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import shutil
import statistics
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from longctx_testing import pytest_benchmark_compare

from pytest_longctx.cli import main, rebuild_reports
from pytest_longctx.core.records import Record, append_record
from pytest_longctx.core.stats import latest_records, summarize, summarize_values
from pytest_longctx.reporting.benchmark_json import (
    benchmark_entries,
    build_benchmark_json,
    sweep_benchmarks,
    write_benchmark_json,
)
from pytest_longctx.reporting.html import (
    RESULTS_TABLE_COLUMNS,
    standalone_page,
    summary_fragment,
    table_header_cells,
    table_row_cells,
)
from pytest_longctx.reporting.markdown import render_markdown, render_terminal_table, write_markdown
from pytest_longctx.reporting.plots import plot_decode, plot_ttft, write_plots
from pytest_longctx.reporting.view import TABLE_COLUMNS, summary_rows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FINGERPRINT = {
    "profile": "cpu-tiny",
    "model": "org/tiny-model",
    "revision": "0123abcd",
    "vllm_version": "0.32.0",
    "torch_version": "2.9.0+cpu",
    "hardware": {"cpu": "AMD EPYC", "cores": 2},
    "command_line": ["pytest", "--longctx-profile", "cpu-tiny", "--longctx-to", "64Ki"],
    "server_command": ["vllm", "serve", "org/tiny-model", "--max-model-len", "65536"],
}
KI, MI = 1024, 1024**2


def record(
    length: int,
    repeat: int,
    *,
    ttft: float | None = None,
    decode: float | None = None,
    outcome: str = "passed",
    reason: str | None = None,
    run_id: str = "run-a",
    fingerprint: dict | None = None,
    prompt_tokens: int | None = None,
) -> Record:
    figures = {}
    if ttft is not None:
        figures["ttft"] = ttft
    if decode is not None:
        figures["decode_throughput"] = decode
    return Record(
        run_id=run_id,
        nodeid=f"tests/test_sweep.py::test_prefill_decode[len={length}-rep={repeat}]",
        length=length,
        repeat=repeat,
        outcome=outcome,
        reason=reason,
        figures=figures,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else length,
        completion_tokens=64,
        fingerprint=FINGERPRINT if fingerprint is None else fingerprint,
        started_at=1_790_000_000.0 + repeat,
        finished_at=1_790_000_001.0 + repeat,
    )


def study_records() -> list[Record]:
    """1Ki x3 like the study's first row, 64Mi x3 with large values, a failure at 64Ki."""
    return [
        record(KI, 0, ttft=0.08, decode=275.6),
        record(KI, 1, ttft=0.08, decode=275.9),
        record(KI, 2, ttft=0.09, decode=276.2),
        record(64 * KI, 0, ttft=0.67, decode=259.2),
        record(64 * KI, 1, outcome="failed", reason="HTTP 400: prompt too long\nfor the model"),
        record(64 * MI, 0, ttft=40_000.00, decode=16.6),
        record(64 * MI, 1, ttft=40_171.67, decode=16.6),
        record(64 * MI, 2, ttft=40_343.34, decode=16.6),
    ]


# --------------------------------------------------------------------------- stats


def test_mean_sample_std_and_cv_match_hand_computation():
    summary = summarize(study_records())[0]
    ttft = summary.figure("ttft")
    # mean = (0.08 + 0.08 + 0.09) / 3 = 0.25 / 3 = 0.083333...
    # deviations: -0.003333, -0.003333, +0.006667; squares sum to 0.0000666667
    # sample variance = 0.0000666667 / (3 - 1) = 0.0000333333; std = sqrt(...) = 0.0057735
    # CV = 0.0057735 / 0.0833333 = 0.0692820
    assert ttft.n == 3
    assert ttft.mean == pytest.approx(0.0833333333, rel=1e-9)
    assert ttft.std == pytest.approx(0.0057735027, rel=1e-7)
    assert ttft.cv == pytest.approx(0.0692820323, rel=1e-7)
    assert (ttft.min, ttft.max) == (0.08, 0.09)
    assert ttft.unit == "s"
    # Cross-check against the standard library's sample standard deviation.
    assert ttft.std == pytest.approx(statistics.stdev([0.08, 0.08, 0.09]), rel=1e-12)

    decode = summary.figure("decode_throughput")
    # mean = (275.6 + 275.9 + 276.2) / 3 = 827.7 / 3 = 275.9
    # deviations -0.3, 0, +0.3 -> squares 0.09 + 0 + 0.09 = 0.18; / 2 = 0.09; sqrt = 0.3
    # CV = 0.3 / 275.9 = 0.00108735
    assert decode.mean == pytest.approx(275.9, rel=1e-12)
    assert decode.std == pytest.approx(0.3, rel=1e-9)
    assert decode.cv == pytest.approx(0.00108735049, rel=1e-7)
    assert decode.unit == "tok/s"


def test_single_value_has_zero_std_and_empty_sample_is_refused():
    single = summarize_values("ttft", [1.5])
    assert (single.n, single.mean, single.std, single.cv) == (1, 1.5, 0.0, 0.0)
    zero_mean = summarize_values("ttft", [0.0, 0.0])
    assert zero_mean.cv is None
    with pytest.raises(ValueError, match="ttft"):
        summarize_values("ttft", [])


def test_summaries_are_sorted_by_length_with_outcome_counts_and_reasons():
    records = [
        record(4 * KI, 0, ttft=0.4),
        record(KI, 0, ttft=0.1),
        record(KI, 1, outcome="skipped", reason="beyond max-model-len"),
        record(KI, 2, outcome="error", reason="server died"),
        record(2 * KI, 0, outcome="failed", reason="timeout"),
    ]
    summaries = summarize(records)
    assert [s.length for s in summaries] == [KI, 2 * KI, 4 * KI]
    first = summaries[0]
    assert dict(first.outcomes) == {
        "passed": 1,
        "failed": 0,
        "skipped": 1,
        "error": 1,
        "interrupted": 0,
    }
    assert first.n == 1
    assert [r.reason for r in first.non_passed] == ["beyond max-model-len", "server died"]
    # A length with no passed record has counts but no figures.
    assert summaries[1].n == 0 and summaries[1].figure("ttft") is None
    assert summaries[1].outcomes["failed"] == 1


def test_last_record_of_a_point_wins_and_runs_merge_as_repeats():
    records = [
        record(KI, 0, ttft=0.10),
        record(KI, 1, outcome="failed", reason="connection reset"),
        record(KI, 1, ttft=0.30),  # the resumed run re-measured repeat 1
        record(KI, 0, ttft=0.20, run_id="run-b"),  # another pass: a further repeat
    ]
    assert len(latest_records(records)) == 3
    (summary,) = summarize(records)
    assert summary.outcomes["failed"] == 0 and summary.n == 3
    # mean of 0.10, 0.30, 0.20 = 0.60 / 3 = 0.20
    assert summary.figure("ttft").mean == pytest.approx(0.20)
    assert summary.run_ids == ("run-a", "run-b")


def test_summarize_accepts_any_figure_name():
    records = [
        Record(run_id="r", nodeid="n", length=KI, repeat=i, outcome="passed", figures={"e2e": v})
        for i, v in enumerate([2.0, 4.0])
    ]
    (summary,) = summarize(records, figures=("e2e", "ttft"))
    # mean (2 + 4) / 2 = 3; std sqrt(((-1)^2 + 1^2) / 1) = sqrt(2)
    assert summary.figure("e2e").mean == 3.0
    assert summary.figure("e2e").std == pytest.approx(math.sqrt(2))
    assert summary.figure("ttft") is None


# --------------------------------------------------------------------------- markdown


def markdown_table_rows(markdown: str) -> tuple[list[str], list[list[str]]]:
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Prompt"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, _alignment, *body = rows
    return header, body


def test_markdown_table_rows_match_hand_computed_values():
    markdown = render_markdown(study_records(), title="Campaign")
    header, rows = markdown_table_rows(markdown)
    assert header == list(TABLE_COLUMNS)
    by_prompt = {row[0]: row for row in rows}
    assert list(by_prompt) == ["1Ki", "64Ki", "64Mi"]
    # TTFT 0.0833 +- 0.0058 (below 0.1 s: 3 decimals); CV 6.93 %; decode 275.9 +- 0.3, CV 0.11 %
    assert by_prompt["1Ki"] == [
        "1Ki", "1,024", "3", "0.083 ± 0.006", "6.9%", "275.9 ± 0.3", "0.1%", "–",
        "3 passed",
    ]  # fmt: skip
    # one passed repeat: mean alone, no spread, no CV
    assert by_prompt["64Ki"] == [
        "64Ki", "65,536", "1", "0.67", "–", "259.2", "–", "–",
        "1 passed, 1 failed",
    ]  # fmt: skip
    # mean (40000 + 40171.67 + 40343.34) / 3 = 40171.67; deviations -171.67, 0, +171.67
    # std = sqrt(2 * 171.67^2 / 2) = 171.67; CV = 171.67 / 40171.67 = 0.43 %
    assert by_prompt["64Mi"] == [
        "64Mi", "67,108,864", "3", "40,171.67 ± 171.67", "0.4%", "16.6 ± 0.0", "0.0%", "–",
        "3 passed",
    ]  # fmt: skip
    assert markdown.startswith("# Campaign\n")  # records without a probe: no answers ("–")


def test_markdown_header_failures_and_reproduce_section():
    markdown = render_markdown(study_records())
    assert "- Runs: run-a" in markdown
    assert "- Model: org/tiny-model" in markdown
    assert "- Revision: 0123abcd" in markdown
    assert "- vLLM: 0.32.0" in markdown
    assert "- Hardware: cpu: AMD EPYC, cores: 2" in markdown
    assert "differ in fingerprint" not in markdown
    failures = markdown.split("## Points that did not pass", 1)[1].split("##", 1)[0]
    assert "64Ki repeat 1 (run `run-a`): **failed**: HTTP 400: prompt too long for the model" in (
        failures
    )
    reproduce = markdown.split("## How to reproduce", 1)[1]
    assert "pytest --longctx-profile cpu-tiny --longctx-to 64Ki" in reproduce
    assert "vllm serve org/tiny-model --max-model-len 65536" in reproduce
    assert "- torch: 2.9.0+cpu" in reproduce


def test_markdown_says_when_runs_differ_in_fingerprint():
    newer = {**FINGERPRINT, "vllm_version": "0.33.0"}
    records = [record(KI, 0, ttft=0.1), record(KI, 0, ttft=0.1, run_id="run-b", fingerprint=newer)]
    markdown = render_markdown(records)
    assert "differ in fingerprint" in markdown
    assert "  - `run-a`: 0.32.0" in markdown
    assert "  - `run-b`: 0.33.0" in markdown


def test_reproduce_accepts_string_command_line_and_overrides():
    fingerprint = {**FINGERPRINT, "command_line": "make run FROM=1Ki TO=8Ki"}
    markdown = render_markdown(
        [record(KI, 0, ttft=0.1, fingerprint=fingerprint)], reproduce={"seed": 7}
    )
    reproduce = markdown.split("## How to reproduce", 1)[1]
    assert "make run FROM=1Ki TO=8Ki" in reproduce
    assert "- seed: 7" in reproduce


def test_write_markdown_replaces_the_file_in_one_step(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("stale")
    write_markdown(path, study_records())
    assert path.read_text() == render_markdown(study_records())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_empty_markdown_says_so():
    assert "No records yet." in render_markdown([])


def test_terminal_table_has_aligned_columns():
    records = study_records()
    lines = render_terminal_table(records).splitlines()
    header, rule, *body = lines
    # The dashed rule marks every column's extent.
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    assert len(spans) == len(TABLE_COLUMNS) and len(body) == 3
    expected_rows = [list(TABLE_COLUMNS)] + summary_rows(records)
    for line, expected in zip([header, *body], expected_rows, strict=True):
        for (start, end), column, cell in zip(spans, TABLE_COLUMNS, expected, strict=True):
            if column in ("Prompt", "answers", "outcomes"):  # text, left-aligned
                assert line[start:].startswith(cell), (line, column)
            else:
                assert line[start:end] == cell.rjust(end - start), (line, column)


# --------------------------------------------------------------------------- benchmark JSON


def test_benchmark_json_has_one_benchmark_per_length_and_metric_with_repeats_as_rounds():
    document = build_benchmark_json(
        study_records(), machine_info={"node": "test-host"}, commit_info={"id": "abc"}
    )
    assert set(document) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert document["machine_info"]["node"] == "test-host"
    assert document["machine_info"]["longctx_fingerprint"]["model"] == "org/tiny-model"
    assert document["commit_info"] == {"id": "abc"}
    benchmarks = document["benchmarks"]
    # 3 lengths (64Ki: one passed, one failed) x (ttft, decode)
    assert [b["name"] for b in benchmarks] == [
        f"test_prefill_decode[len={size}-{metric}]"
        for size in ("1Ki", "64Ki", "64Mi")
        for metric in ("ttft", "decode")
    ]
    ttft, decode = benchmarks[0], benchmarks[1]
    assert ttft["group"] == "longctx ttft (s)" and decode["group"] == "longctx decode (s/token)"
    assert ttft["fullname"] == "tests/test_sweep.py::test_prefill_decode[len=1Ki-ttft]"
    assert ttft["param"] == "len=1Ki-ttft"
    assert ttft["params"] == {"length": 1024, "metric": "ttft"}
    # The three repeats are the rounds: 0.08, 0.08, 0.09 s, statistics by hand.
    stats = ttft["stats"]
    assert stats["data"] == [0.08, 0.08, 0.09]
    assert (stats["rounds"], stats["iterations"]) == (3, 1)
    assert stats["mean"] == pytest.approx(0.25 / 3)
    assert stats["stddev"] == pytest.approx(0.0057735027, rel=1e-7)
    assert (stats["min"], stats["max"], stats["median"]) == (0.08, 0.09, 0.08)
    assert stats["total"] == pytest.approx(0.25)
    assert stats["ops"] == pytest.approx(3 / 0.25)
    # Decode as seconds per token, lower is better: 1 / 275.6, 1 / 275.9, 1 / 276.2.
    assert decode["stats"]["data"] == pytest.approx([1 / 275.6, 1 / 275.9, 1 / 276.2])
    assert decode["stats"]["max"] == pytest.approx(1 / 275.6)
    assert decode["stats"]["ops"] == pytest.approx(3 / (1 / 275.6 + 1 / 275.9 + 1 / 276.2))
    extra = ttft["extra_info"]
    assert (extra["length"], extra["length_label"], extra["metric"], extra["unit"]) == (
        1024, "1Ki", "ttft", "s",
    )  # fmt: skip
    assert decode["extra_info"]["unit"] == "s/token"
    assert extra["runs"] == ["run-a"]
    assert [(r["repeat"], r["seconds"]) for r in extra["rounds"]] == [
        (0, 0.08), (1, 0.08), (2, 0.09),
    ]  # fmt: skip
    first = extra["rounds"][0]
    assert first["figures"] == {"ttft": 0.08, "decode_throughput": 275.6}
    assert (first["prompt_tokens"], first["completion_tokens"]) == (1024, 64)
    assert extra["figure_units"] == {"ttft": "s", "decode_throughput": "tok/s"}
    # 64Ki: only the passed repeat is a round
    assert benchmarks[2]["stats"]["data"] == [0.67]


def test_benchmark_rounds_merge_runs_and_skip_superseded_failures():
    records = [
        record(KI, 0, outcome="failed", reason="x"),
        record(KI, 0, ttft=0.5),  # the resumed point: the later record counts
        record(KI, 0, ttft=0.7, run_id="run-b"),
    ]
    (ttft,) = benchmark_entries(records)  # no decode figure, no decode benchmark
    assert ttft["stats"]["data"] == [0.5, 0.7]
    assert ttft["extra_info"]["runs"] == ["run-a", "run-b"]


def test_the_entries_are_pytest_benchmarks_own_metadata():
    from pytest_benchmark.stats import Metadata

    (ttft, decode) = sweep_benchmarks([record(KI, 0, ttft=0.1, decode=200.0)])
    metadata = ttft.metadata()
    assert isinstance(metadata, Metadata)
    # --benchmark-compare-fail reads the fields through Metadata's item access
    assert (metadata["mean"], metadata["rounds"], metadata.has_error) == (0.1, 1, False)
    assert metadata.as_dict(include_data=True)["stats"] == ttft.entry()["stats"]
    assert decode.metadata()["mean"] == pytest.approx(0.005)


def test_benchmark_json_loads_in_pytest_benchmark_storage_and_compare(tmp_path):
    path = write_benchmark_json(tmp_path / "benchmark.json", study_records())
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage

    storage = FileStorage(tmp_path / "storage", logger=Logger(Logger.QUIET))
    loaded = list(storage.load_benchmarks(str(path)))
    assert len(loaded) == 6
    assert {bench["group"] for bench in loaded} == {"longctx ttft (s)", "longctx decode (s/token)"}

    result = pytest_benchmark_compare(tmp_path, str(path))
    assert result.returncode == 0, result.stderr
    assert "benchmark 'longctx ttft (s)': 3 tests" in result.stdout
    assert "benchmark 'longctx decode (s/token)': 3 tests" in result.stdout
    assert "test_prefill_decode[len=64Mi-ttft]" in result.stdout


# --------------------------------------------------------------------------- plots


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    width, height = struct.unpack(">II", data[16:24])  # IHDR follows the signature
    return width, height


def test_plots_are_pngs_and_skip_lengths_without_passed_records(tmp_path):
    records = study_records() + [record(8 * KI, 0, outcome="error", reason="server died")]
    written = write_plots(tmp_path, records)
    assert [path.name for path in written] == ["ttft.png", "decode.png"]
    for path in written:
        width, height = png_size(path)
        assert width > 100 and height > 100


def test_plots_write_nothing_without_passed_records(tmp_path):
    failed = [record(KI, 0, outcome="failed", reason="x")]
    assert plot_ttft(failed, tmp_path / "ttft.png") is None
    assert plot_decode([], tmp_path / "decode.png") is None
    assert write_plots(tmp_path, []) == []
    assert list(tmp_path.iterdir()) == []


def test_extra_plots_join_the_list(tmp_path):
    calls = []

    def footprint(records, run_dir):
        calls.append((len(records), run_dir))
        path = run_dir / "kv.png"
        shutil.copyfile(run_dir / "ttft.png", path)
        return path

    written = write_plots(tmp_path, study_records(), [footprint, lambda records, run_dir: None])
    assert [path.name for path in written] == ["ttft.png", "decode.png", "kv.png"]
    assert calls == [(8, tmp_path)]


# --------------------------------------------------------------------------- HTML


class Document(HTMLParser):
    """Tables (header and body cells as text), images and links of an HTML string."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[dict[str, list]] = []
        self.images: list[dict[str, str | None]] = []
        self.links: list[str] = []
        self.title = ""
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_head = False
        self._in_title = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table":
            self.tables.append({"header": [], "rows": [], "class": attributes.get("class")})
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(attributes)
        elif tag == "title":
            self._in_title = True
        for name in ("href", "src"):
            if attributes.get(name) and tag != "img":
                self.links.append(attributes[name])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            table = self.tables[-1]
            if self._in_head:
                table["header"] = self._row
            else:
                table["rows"].append(self._row)
            self._row = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_title:
            self.title += data


def decoded_png(image: dict[str, str | None]) -> bytes:
    prefix = "data:image/png;base64,"
    assert image["src"].startswith(prefix)
    return base64.b64decode(image["src"][len(prefix) :], validate=True)


def test_summary_fragment_holds_the_table_and_embedded_pngs(tmp_path):
    records = study_records()
    plots = write_plots(tmp_path, records)
    document = Document(summary_fragment(records, [*plots, None, tmp_path / "gone.png"]))
    (table,) = document.tables
    assert table["header"] == list(TABLE_COLUMNS)
    assert table["rows"] == summary_rows(records)
    assert len(document.images) == 2
    for image, path in zip(document.images, plots, strict=True):
        assert decoded_png(image) == path.read_bytes()


def test_standalone_page_is_self_contained(tmp_path):
    records = study_records()
    plots = write_plots(tmp_path, records)
    text = standalone_page(records, plots, title="Campaign <3>")
    assert text.startswith("<!DOCTYPE html>")
    document = Document(text)
    assert document.title == "Campaign <3>"
    assert document.links == []  # nothing to fetch: no stylesheet, script or link
    assert all(decoded_png(image).startswith(PNG_SIGNATURE) for image in document.images)
    assert len(document.images) == 2
    summary_table, points_table = document.tables
    assert summary_table["rows"] == summary_rows(records)
    assert points_table["header"][:4] == ["Run", "Prompt", "Repeat", "Outcome"]
    assert len(points_table["rows"]) == len(records)
    failed = [row for row in points_table["rows"] if row[3] == "failed"]
    assert failed == [
        [
            "run-a",
            "64Ki",
            "1",
            "failed",
            "",
            "",
            "65,536",
            "HTTP 400: prompt too long for the model",
        ]
    ]


def hydrate(header: list[str], cells: list[str]) -> dict[str, str]:
    """Row data exactly as pytest-html 4 extracts it for sorting."""
    from pytest_html.basereport import BaseReport

    data: dict[str, str] = {}
    fake_report = SimpleNamespace(_report=SimpleNamespace(table_header=header))
    BaseReport._hydrate_data(fake_report, data, cells)
    return data


def sweep_rows() -> tuple[list[str], list[dict[str, str]], list[Record]]:
    header = ['<th class="sortable" data-column-type="testId">Test</th>', *table_header_cells()]
    records = [
        record(64 * KI, 1, ttft=12.5, decode=9.5, prompt_tokens=65_540),
        record(KI, 10, ttft=0.08, decode=275.9),
        record(2 * KI, 2, ttft=0.7, decode=100.0),
        record(1 * MI, 0, ttft=130.0, decode=10.25),
    ]
    rows = [
        hydrate(header, [f'<td class="col-testId">{r.nodeid}</td>', *table_row_cells(r)])
        for r in records
    ]
    return header, rows, records


def test_results_table_columns_sort_numerically_in_pytest_html():
    header, rows, records = sweep_rows()
    assert len(header) == 1 + len(RESULTS_TABLE_COLUMNS)
    numeric = {
        "longctx_length": lambda r: r.length,
        "longctx_repeat": lambda r: r.repeat,
        "longctx_ttft": lambda r: r.figures["ttft"],
        "longctx_decode": lambda r: r.figures["decode_throughput"],
        "longctx_prompt_tokens": lambda r: r.prompt_tokens,
    }
    for key, value_of in numeric.items():
        # pytest-html's browser sort compares these strings with `>`, i.e. by code point.
        by_text = sorted(range(len(rows)), key=lambda i: rows[i][key])
        by_value = sorted(range(len(rows)), key=lambda i: value_of(records[i]))
        assert by_text == by_value, key
    assert rows[0]["longctx_length"].endswith("64Ki")


def test_results_table_cells_are_empty_outside_the_sweep():
    cells = table_row_cells(None)
    assert len(cells) == len(table_header_cells())
    row = hydrate(table_header_cells(), cells)
    assert set(row.values()) == {""}


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run pytest-html's JS")
def test_pytest_html_javascript_sorts_the_columns_numerically(tmp_path):
    import pytest_html

    app_js = (Path(pytest_html.__file__).parent / "resources" / "app.js").read_text()
    start = app_js.index("const genericSort = ")
    sort_source = app_js[start : app_js.index("const durationSort", start)]
    _, rows, records = sweep_rows()
    script = (
        sort_source
        + "const rows = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
        + "const order = genericSort(rows, 'longctx_length', false).map((r) => r.testId);\n"
        + "console.log(JSON.stringify(order));\n"
    )
    result = subprocess.run(
        ["node", "-e", script], input=json.dumps(rows), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    expected = [r.nodeid for r in sorted(records, key=lambda r: r.length)]
    assert json.loads(result.stdout) == expected


# --------------------------------------------------------------------------- CLI


def test_cli_merges_runs_and_warns_about_a_truncated_line(tmp_path):
    run_a, run_b, out = tmp_path / "run-a", tmp_path / "run-b", tmp_path / "merged"
    for repeat, ttft in enumerate([0.08, 0.08]):
        append_record(run_a / "results.jsonl", record(KI, repeat, ttft=ttft, decode=275.6))
    append_record(run_b / "results.jsonl", record(KI, 0, ttft=0.09, decode=276.2, run_id="b"))
    append_record(run_b / "results.jsonl", record(2 * KI, 0, ttft=0.2, decode=270.0, run_id="b"))
    # A session killed mid-write leaves half a line behind.
    half_line = json.dumps(record(4 * KI, 0, ttft=0.4, run_id="b").to_json())[:40]
    with open(run_b / "results.jsonl", "a") as handle:
        handle.write(half_line)
    before = (run_b / "results.jsonl").read_bytes()

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_longctx",
            "report",
            str(run_a),
            str(run_b),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"{run_b / 'results.jsonl'}:3:" in result.stderr
    assert "warning" in result.stderr
    assert (run_b / "results.jsonl").read_bytes() == before  # never rewritten
    names = sorted(path.name for path in out.iterdir())
    assert names == ["benchmark.json", "decode.png", "report.html", "report.md", "ttft.png"]
    _, rows = markdown_table_rows((out / "report.md").read_text())
    # 1Ki: repeats 0.08, 0.08 (run-a) and 0.09 (b) merge into n=3, as in the hand-computed test
    assert rows[0][:5] == ["1Ki", "1,024", "3", "0.083 ± 0.006", "6.9%"]
    assert [row[0] for row in rows] == ["1Ki", "2Ki"]
    # 1Ki and 2Ki, TTFT and decode; 1Ki's rounds are the repeats of both runs
    benchmarks = json.loads((out / "benchmark.json").read_text())["benchmarks"]
    assert len(benchmarks) == 4
    assert sorted(benchmarks[0]["stats"]["data"]) == [0.08, 0.08, 0.09]
    assert len(Document((out / "report.html").read_text()).images) == 2


def test_cli_defaults_to_the_single_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    append_record(run / "results.jsonl", record(KI, 0, ttft=0.1, decode=100.0))
    assert main(["report", str(run / "results.jsonl")]) == 0
    assert (run / "report.md").is_file() and (run / "report.html").is_file()
    printed = capsys.readouterr().out.split()
    assert str(run / "benchmark.json") in printed


@pytest.mark.parametrize("case", ["missing", "no-results", "several-without-output"])
def test_cli_usage_errors_exit_2(tmp_path, capsys, case):
    present = tmp_path / "present"
    append_record(present / "results.jsonl", record(KI, 0, ttft=0.1))
    (tmp_path / "empty").mkdir()
    argv = {
        "missing": ["report", str(tmp_path / "nowhere")],
        "no-results": ["report", str(tmp_path / "empty")],
        "several-without-output": ["report", str(present), str(present)],
    }[case]
    assert main(argv) == 2
    error = capsys.readouterr().err
    expected = {
        "missing": "does not exist",
        "no-results": "holds no results.jsonl",
        "several-without-output": "--output DIR",
    }[case]
    assert expected in error
    assert not (present / "report.md").exists()


def test_rebuild_reports_returns_every_written_path(tmp_path):
    paths = rebuild_reports(
        study_records(), tmp_path, machine_info={"node": "n"}, commit_info={"id": "c"}
    )
    assert [path.name for path in paths] == [
        "report.md", "ttft.png", "decode.png", "report.html", "benchmark.json",
    ]  # fmt: skip
    assert all(path.is_file() for path in paths)
    markdown = (tmp_path / "report.md").read_text()
    assert "![ttft](ttft.png)" in markdown and "![decode](decode.png)" in markdown


def test_the_report_command_draws_the_kv_plot_the_session_drew(tmp_path, capsys):
    """The KV plot is drawn from what the records say about the served model."""
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.serving.model_description import describe_launched

    described = {**FINGERPRINT, **describe_launched(load_profile("cpu-tiny")).fingerprint()}
    run_dir = tmp_path / "run-a"
    for length in (KI, 2 * KI):
        append_record(run_dir / "results.jsonl", record(length, 0, ttft=0.1, fingerprint=described))
    assert main(["report", str(run_dir)]) == 0
    plot = run_dir / "kv_cache.png"
    assert plot.read_bytes().startswith(PNG_SIGNATURE)
    assert "![kv_cache](kv_cache.png)" in (run_dir / "report.md").read_text()


def test_a_model_nothing_describes_gets_a_line_instead_of_a_kv_plot(tmp_path):
    unknown = {**FINGERPRINT, "kv_plot": {"unavailable": "the server serves 'x' (no root)"}}
    run_dir = tmp_path / "run-a"
    append_record(run_dir / "results.jsonl", record(KI, 0, ttft=0.1, fingerprint=unknown))
    assert main(["report", str(run_dir)]) == 0
    assert not (run_dir / "kv_cache.png").exists()
    note = "KV-cache plot not drawn: the server serves 'x' (no root)"
    assert note in (run_dir / "report.md").read_text()
    assert note.replace("'", "&#x27;") in (run_dir / "report.html").read_text()


# --- compare ----------------------------------------------------------------------------------


def test_compare_lists_what_differs_then_ratios_and_verdicts(tmp_path):
    fast = {**FINGERPRINT, "kv_cache_dtype": "fp8_e4m3"}
    slow = {**FINGERPRINT, "kv_cache_dtype": "bfloat16"}
    for run, fingerprint, scale in (("run-fp8", fast, 1.0), ("run-bf16", slow, 2.0)):
        for length in (KI, 2 * KI):
            for repeat, jitter in enumerate((0.99, 1.01, 1.0)):
                append_record(
                    tmp_path / run / "results.jsonl",
                    record(
                        length,
                        repeat,
                        ttft=0.1 * length / KI * scale * jitter,
                        decode=200.0 / scale * jitter,
                        run_id=run,
                        fingerprint=fingerprint,
                    ),
                )
    out = tmp_path / "compared"
    assert (
        main(
            ["compare", str(tmp_path / "run-fp8"), str(tmp_path / "run-bf16"), "--output", str(out)]
        )
        == 0
    )
    markdown = (out / "compare.md").read_text()
    differs = markdown.index("## What differs")
    assert "- `kv_cache_dtype`: 1: fp8_e4m3 | 2: bfloat16" in markdown[differs:]
    assert markdown.index("kv_cache_dtype") < markdown.index("## TTFT")
    ttft_rows = [line for line in markdown.splitlines() if line.startswith("| 1Ki |")]
    assert "x2.000" in ttft_rows[0] and "worse (p=" in ttft_rows[0]  # TTFT doubled
    assert "x0.500" in ttft_rows[1] and "worse (p=" in ttft_rows[1]  # decode halved
    for name in ("compare_ttft.png", "compare_decode.png", "compare_ratio.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE)
    page = (out / "compare.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<td>kv_cache_dtype</td>" in page


def test_compare_needs_two_runs_with_passed_points(tmp_path, capsys):
    append_record(tmp_path / "a" / "results.jsonl", record(KI, 0, ttft=0.1))
    assert main(["compare", str(tmp_path / "a"), "--output", str(tmp_path / "o")]) == 2
    assert "compare needs two runs or more" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "none"), "--output", "o"]) == 2
    assert "no results.jsonl there" in capsys.readouterr().err


# --------------------------------------------------------------------------- answers' map


def answered(length: int, repeat: int, verdict: str, depth: float, **changes) -> Record:
    """A record whose probe (needle at ``depth``) got ``verdict``."""

    fidelity = {"verdict": verdict, "depth": depth, "expected": "7", "answer": "7"}
    return dataclasses.replace(record(length, repeat, ttft=0.1), fidelity=fidelity, **changes)


def test_the_answers_map_counts_verdicts_by_length_and_needle_depth(tmp_path):
    records = [
        answered(KI, 0, "correct", 0.031),  # the first token after the header: column 0
        answered(KI, 1, "correct", 0.9998),
        answered(KI, 2, "correct", 0.9),  # the nearest eighth of 0.9 is 7/8
        answered(4 * KI, 0, "wrong", 0.13),
        answered(4 * KI, 1, "wrong", 0.12),
        answered(4 * KI, 2, "correct", 0.5),
        answered(4 * KI, 0, "correct", 0.62, cache_state="warm", cache={"question": 1}),
        dataclasses.replace(record(8 * KI, 0, ttft=0.2), fidelity={"verdict": "not_checked"}),
    ]
    markdown = render_markdown(records)
    section = markdown.split("## Answers by length and needle depth", 1)[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == "| Prompt | 0 | 0.125 | 0.25 | 0.375 | 0.5 | 0.625 | 0.75 | 0.875 | 1 |"
    assert rows[1:] == [
        "| 1Ki | ✓ | · | · | · | · | · | · | ✓ | ✓ |",
        "| 4Ki | · | 2✗ | · | · | ✓ | · | · | · | · |",
        "| 4Ki warm | · | · | · | · | · | ✓ | · | · | · |",
    ]  # 8Ki's point carried no probe: no row
    page = standalone_page(records, [], "t")
    assert "Answers by length and needle depth" in page and "4Ki warm" in page
    assert "Answers by length" not in render_markdown([record(KI, 0, ttft=0.1)])
