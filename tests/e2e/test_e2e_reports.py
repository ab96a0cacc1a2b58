"""Results that survive anything, and reports people read: real sweeps against real vLLM.

Three sweep sessions run as separate processes, as a user would run them, attached to the
shared cpu-tiny server: one with an item made to fail (records, report.md, report.html,
benchmark JSON, plots, terminal summary), one killed with SIGKILL mid-sweep, and the session
that resumes it (records survive, a half-written line is skipped, nothing is measured twice).
Each session runs once per module; the tests read what it left behind.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from longctx_testing import (
    ATTACHED_TIMEOUT_S,
    SHARED_SERVERS_PROFILE,
    SWEEP_TEST,
    Session,
    raw_lines,
    run_folder,
    run_process,
)

from pytest_longctx.core.records import Record, read_records
from pytest_longctx.core.stats import latest_records, outcome_label

pytestmark = pytest.mark.vllm

KI = 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SESSION_TIMEOUT_S = ATTACHED_TIMEOUT_S
#: What a reader sees in every per-length table (report.md, terminal, report.html).
SUMMARY_HEADER = [
    "Prompt",
    "Tokens",
    "n",
    "TTFT (s) mean ± std",
    "TTFT CV",
    "Decode tok/s mean ± std",
    "Decode CV",
    "answers",
    "outcomes",
]
#: (pytest-html sort key, header label) of the columns the plugin adds to the results table.
RESULTS_COLUMNS = [
    ("longctx_length", "Length"),
    ("longctx_repeat", "Repeat"),
    ("longctx_ttft", "TTFT (s)"),
    ("longctx_decode", "Decode (tok/s)"),
    ("longctx_prompt_tokens", "Prompt tokens"),
]
FAILING_NODE_SUFFIX = "[len=2Ki-rep=1]"
FAILURE_MESSAGE = "made to fail after measuring, to be recorded"

FAIL_ONE_ITEM = f'''
import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if item.name.endswith("{FAILING_NODE_SUFFIX}"):
        raise AssertionError("{FAILURE_MESSAGE}")
    return result
'''

KILL_AT_FOURTH_ITEM = """
import os
import signal

started = []


def pytest_runtest_call(item):
    started.append(item.nodeid)
    if len(started) == 4:
        os.kill(os.getpid(), signal.SIGKILL)
"""


# --------------------------------------------------------------------------- sessions


def project(directory: Path, conftest: str | None = None) -> Path:
    """A user's project: the repository's sweep test, its own ini file, maybe a conftest."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (directory / "test_sweep.py").write_text(SWEEP_TEST, encoding="utf-8")
    if conftest is not None:
        (directory / "conftest.py").write_text(conftest, encoding="utf-8")
    return directory


def run_pytest(directory: Path, *args: str) -> Session:
    """A sweep session as a user runs it; a point whose stream a busy host held back is kept
    with the server's decode figure, as by default."""
    return run_process(
        directory,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *args,
        timeout=SESSION_TIMEOUT_S,
    )


@dataclass(frozen=True)
class FailingSweep:
    """1Ki..2Ki x2 with len=2Ki rep=1 failing, reports under the default ``reports/``."""

    project: Path
    session: Session
    user_benchmark_json: Path

    @property
    def output(self) -> Path:
        return self.project / "reports"

    @property
    def run_dir(self) -> Path:
        return run_folder(self.output)


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory: pytest.TempPathFactory, vllm_url: str) -> FailingSweep:
    directory = project(tmp_path_factory.mktemp("failing-sweep"), FAIL_ONE_ITEM)
    user_json = directory / "user-benchmark.json"
    session = run_pytest(
        directory,
        f"--longctx-url={vllm_url}",
        SHARED_SERVERS_PROFILE,
        "--longctx-to=2Ki",
        "--longctx-repeats=2",
        f"--benchmark-json={user_json}",
    )
    assert session.returncode == 1, session.describe()  # one failed item, nothing else wrong
    return FailingSweep(directory, session, user_json)


@dataclass(frozen=True)
class KilledThenResumed:
    """1Ki..4Ki x2: killed with SIGKILL as the 4th item starts, a half line appended, resumed."""

    output: Path
    killed: Session
    after_kill: str  # results.jsonl as the killed session left it
    report_after_kill: str
    half_line: str
    resumed: Session

    @property
    def run_dir(self) -> Path:
        return run_folder(self.output)


@pytest.fixture(scope="module")
def killed_then_resumed(
    tmp_path_factory: pytest.TempPathFactory, vllm_url: str
) -> KilledThenResumed:
    directory = project(tmp_path_factory.mktemp("killed-sweep"), KILL_AT_FOURTH_ITEM)
    output = directory / "out"
    sweep = (
        f"--longctx-url={vllm_url}",
        SHARED_SERVERS_PROFILE,
        f"--longctx-output={output}",
        "--longctx-to=4Ki",
        "--longctx-repeats=2",
    )
    killed = run_pytest(directory, *sweep)
    results = run_folder(output) / "results.jsonl"
    after_kill = results.read_text(encoding="utf-8")
    report_after_kill = (run_folder(output) / "report.md").read_text(encoding="utf-8")
    # A crash in the middle of writing a line: the first half of a record, no newline.
    last = after_kill.splitlines()[-1]
    half_line = last[: len(last) // 2]
    with open(results, "a", encoding="utf-8") as handle:
        handle.write(half_line)
    (directory / "conftest.py").unlink()
    resumed = run_pytest(directory, *sweep, "--longctx-resume")
    return KilledThenResumed(output, killed, after_kill, report_after_kill, half_line, resumed)


# --------------------------------------------------------------------------- reading reports


def split_row(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def markdown_summary(markdown: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of report.md's per-length table."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Prompt |"))
    assert re.fullmatch(r"\|(-{3,}:?\|)+", lines[start + 1]), lines[start + 1]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(split_row(line))
    return split_row(lines[start]), rows


def markdown_section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert match, f"no '## {heading}' section in:\n{markdown}"
    return match.group(1)


def terminal_summary(stdout: str) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """The sweep table printed at the end of a session, and the ``results:``/``reports:`` lines.

    Columns are separated by at least two spaces; cells hold single spaces only.
    """
    lines = stdout.splitlines()
    section = next(
        i for i, line in enumerate(lines) if re.search(r"=+ long-context sweep =+", line)
    )
    start = next(i for i in range(section, len(lines)) if lines[i].startswith("Prompt  "))
    assert set(lines[start + 1].replace(" ", "")) == {"-"}, lines[start + 1]
    rows, places = [], {}
    for line in lines[start + 2 :]:
        key, _, rest = line.partition(": ")
        if key in ("fidelity", "results", "reports"):  # the lines after the table
            places[key] = rest
            continue
        if places:
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return re.split(r"\s{2,}", lines[start].strip()), rows, places


def size_label(length: int) -> str:
    return f"{length // KI}Ki"


def decimals_of(number_text: str) -> int:
    return len(number_text.split(".")[1]) if "." in number_text else 0


def number(text: str) -> float:
    return float(text.replace(",", ""))


def assert_printed(text: str, value: float) -> None:
    """``text`` is ``value`` rounded to the decimals it shows."""
    tolerance = 0.5 * 10 ** -decimals_of(text) + 1e-9
    assert abs(number(text) - value) <= tolerance, (text, value)


def assert_mean_std(cell: str, values: list[float]) -> None:
    if len(values) == 1:
        assert "±" not in cell, cell  # one sample has no spread
        assert_printed(cell, values[0])
        return
    mean_text, std_text = cell.split(" ± ")
    assert decimals_of(mean_text) == decimals_of(std_text), cell
    assert_printed(mean_text, statistics.mean(values))
    assert_printed(std_text, statistics.stdev(values))


def assert_cv(cell: str, values: list[float]) -> None:
    if len(values) < 2:
        assert cell == "–", cell
        return
    assert cell.endswith("%"), cell
    assert_printed(cell[:-1], 100 * statistics.stdev(values) / statistics.mean(values))


def assert_summary_row(cells: list[str], records: list[Record]) -> None:
    """One length's row, checked against its records computed by hand here."""
    row = dict(zip(SUMMARY_HEADER, cells, strict=True))
    (length,) = {r.length for r in records}
    passed = [r for r in records if r.outcome == "passed"]
    assert row["Prompt"] == size_label(length)
    assert row["Tokens"] == f"{length:,}"
    assert int(row["n"]) == len(passed)
    for column, cv_column, figure in (
        ("TTFT (s) mean ± std", "TTFT CV", "ttft"),
        ("Decode tok/s mean ± std", "Decode CV", "decode_throughput"),
    ):
        values = [r.figures[figure] for r in passed]
        assert_mean_std(row[column], values)
        assert_cv(row[cv_column], values)
    # the fidelity verdicts of every point of the length: the embedded default answers right
    latest = latest_records(records)
    verdicts = Counter(r.fidelity["verdict"] for r in latest if r.fidelity.get("verdict"))
    assert verdicts and set(verdicts) == {"correct"}, [r.fidelity for r in records]
    assert row["answers"] == f"{verdicts['correct']} correct"
    printed = {}
    for part in row["outcomes"].split(", "):
        count, outcome = part.split(" ", 1)
        printed[outcome] = int(count)
    # passed points by outcome, the others by their failure class ("1 passed, 1 contract")
    assert printed == dict(Counter(outcome_label(r) for r in latest_records(records)))


def assert_summary_rows(rows: list[list[str]], records: Iterable[Record]) -> None:
    by_length: dict[int, list[Record]] = {}
    for record in records:
        by_length.setdefault(record.length, []).append(record)
    assert [row[0] for row in rows] == [size_label(n) for n in sorted(by_length)]
    for row, length in zip(rows, sorted(by_length), strict=True):
        assert_summary_row(row, by_length[length])


def readable_records(path: Path) -> list[Record]:
    return list(read_records(path).records)


# --------------------------------------------------------------------------- report.html


@dataclass
class Table:
    attributes: dict[str, str | None]
    header: list[tuple[dict[str, str | None], str]] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


class HtmlPage(HTMLParser):
    """Tables, tag attributes and inline style text of a page, as a reader's browser sees them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.styles: list[str] = []
        self.headings: list[str] = []  # <h1> texts
        self._heading: list[str] | None = None
        self._open_tables: list[Table] = []
        self._in_head = False
        self._in_style = False
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._cell_attributes: dict[str, str | None] = {}
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "table":
            self._open_tables.append(Table(attributes))
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("th", "td"):
            self._cell, self._cell_attributes = [], attributes
        elif tag == "style":
            self._in_style = True
        elif tag == "h1":
            self._heading = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._open_tables:
            self.tables.append(self._open_tables.pop())
        elif tag == "thead":
            self._in_head = False
        elif tag in ("th", "td") and self._cell is not None:
            text = "".join(self._cell).strip()
            if self._open_tables and self._in_head:
                self._open_tables[-1].header.append((self._cell_attributes, text))
            elif self._row is not None:
                self._row.append(text)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._open_tables and not self._in_head and self._row:
                self._open_tables[-1].rows.append(self._row)
            self._row = None
        elif tag == "style":
            self._in_style = False
        elif tag == "h1" and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._in_style:
            self.styles.append(data)

    def table(self, **attributes: str) -> Table:
        matches = [
            t for t in self.tables if all(t.attributes.get(k) == v for k, v in attributes.items())
        ]
        assert len(matches) == 1, (attributes, [t.attributes for t in self.tables])
        return matches[0]

    def attribute(self, tag: str, name: str) -> str:
        (value,) = [a[name] for t, a in self.tags if t == tag and a.get(name) is not None]
        return value or ""


class Cell(HTMLParser):
    """One results-table cell of pytest-html's JSON: its column class, text and comment."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.column = ""
        self.text = ""
        self.comment = ""
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        self.column = next((c[4:] for c in classes if c.startswith("col-")), self.column)

    def handle_data(self, data: str) -> None:
        self.text += data

    def handle_comment(self, data: str) -> None:
        self.comment += data


def pytest_html_rows(page: HtmlPage) -> dict[str, list[Cell]]:
    """Each test's results-table row, from the JSON pytest-html 4 embeds in the page."""
    blob = json.loads(page.attribute("div", "data-jsonblob"))
    rows = {}
    for nodeid, reports in blob["tests"].items():
        (report,) = [r for r in reports if "resultsTableRow" in r]
        rows[nodeid] = [Cell(cell) for cell in report["resultsTableRow"]]
    return rows


def embedded_pngs(page: HtmlPage) -> list[bytes]:
    prefix = "data:image/png;base64,"
    sources = [a.get("src") or "" for tag, a in page.tags if tag == "img"]
    return [
        base64.b64decode(s[len(prefix) :], validate=True) for s in sources if s.startswith(prefix)
    ]


def external_resources(page: HtmlPage) -> list[str]:
    """Whatever a browser would fetch from elsewhere to show the page (links are not fetched)."""
    remote = re.compile(r"^\s*(https?:)?//", re.I)
    found, styles = [], list(page.styles)
    for tag, attributes in page.tags:
        for name in ("src", "srcset", "data", "poster"):
            if remote.match(attributes.get(name) or ""):
                found.append(f"<{tag} {name}={attributes[name]}>")
        if tag == "link" and remote.match(attributes.get("href") or ""):
            found.append(f"<link href={attributes['href']}>")
        styles.append(attributes.get("style") or "")
    for style in styles:
        found += re.findall(r"(?:url\(\s*['\"]?|@import\s+['\"]?)(?:https?:)?//[^)'\"\s]+", style)
    return found


def assert_results_rows(page: HtmlPage, records: list[Record]) -> None:
    """pytest-html's header carries the added columns and every sweep row their values."""
    header = page.table(id="results-table").header
    keys = [attributes.get("data-column-type") for attributes, _ in header]
    labels = [text for _, text in header]
    first = keys.index("longctx_length")
    assert list(zip(keys, labels, strict=True))[first : first + 5] == RESULTS_COLUMNS
    rows = pytest_html_rows(page)
    by_node = {r.nodeid.rsplit("::", 1)[-1]: r for r in records}
    sweep_rows = {nodeid: cells for nodeid, cells in rows.items() if "[len=" in nodeid}
    assert sorted(n.rsplit("::", 1)[-1] for n in sweep_rows) == sorted(by_node)
    for nodeid, cells in sweep_rows.items():
        record = by_node[nodeid.rsplit("::", 1)[-1]]
        # pytest-html pairs a row cell with the header cell at the same index.
        assert len(cells) == len(keys), nodeid
        assert all(k is None or cell.column == k for cell, k in zip(cells, keys, strict=True))
        values = {cell.column: cell for cell in cells}
        assert values["longctx_length"].text == size_label(record.length)
        assert int(values["longctx_repeat"].text) == record.repeat
        assert_printed(values["longctx_ttft"].text, record.figures["ttft"])
        assert_printed(values["longctx_decode"].text, record.figures["decode_throughput"])
        assert number(values["longctx_prompt_tokens"].text) == record.prompt_tokens
        # the hidden sort key is the exact value, so sorting is numeric
        assert float(values["longctx_ttft"].comment) == pytest.approx(
            record.figures["ttft"], abs=1e-9
        )


# --------------------------------------------------------------------------- 1: records


def test_every_record_carries_the_schema_and_fingerprint(
    failing_sweep: FailingSweep, vllm_url: str
) -> None:
    run_dir = failing_sweep.run_dir
    latest = failing_sweep.output / "latest"  # reports/ under the rootdir: the default
    assert latest.is_symlink() and latest.resolve() == run_dir
    lines = raw_lines(run_dir / "results.jsonl")
    assert [(line["length"], line["repeat"]) for line in lines] == [
        (KI, 0),
        (2 * KI, 0),
        (KI, 1),
        (2 * KI, 1),
    ]
    served = httpx.get(f"{vllm_url}/v1/models", timeout=10).json()["data"][0]
    version = httpx.get(f"{vllm_url}/version", timeout=10).json()["version"]
    for line in lines:
        assert line["schema_version"] == 1
        assert line["run_id"] == run_dir.name  # reports/latest points at this run
        assert line["nodeid"].endswith(f"[len={size_label(line['length'])}-rep={line['repeat']}]")
        assert line["figures"]["ttft"]["unit"] == "s"
        assert line["figures"]["decode_throughput"]["unit"] == "tok/s"
        for name, figure in line["figures"].items():
            assert set(figure) == {"value", "unit"}, name
            assert isinstance(figure["value"], float) and figure["unit"], name
        assert line["prompt_tokens"] == line["length"]
        assert line["completion_tokens"] == 32  # cpu-tiny's decode length
        assert line["server_metrics"]["prompt_tokens"] == line["length"]
        assert line["started_at"] < line["finished_at"]
        fingerprint = line["fingerprint"]
        assert fingerprint["profile"] == "cpu-tiny"
        # the server serves the profile's model: the profile describes it
        assert fingerprint["served_model_name"] == served["id"]
        assert fingerprint["model_root"] == served["root"]
        assert fingerprint["model"] == "embedded:tiny-llama"
        assert fingerprint["model_described_by"] == "profile"
        assert fingerprint["architecture"] == "LlamaForCausalLM"
        assert fingerprint["revision"]
        assert fingerprint["server_url"] == vllm_url  # attached: the URL, not a command
        assert fingerprint["vllm_version"] == version
        assert fingerprint["hardware"]["cpu_count"] == os.cpu_count()  # this host, attached locally
        assert "--longctx-to=2Ki" in fingerprint["command_line"]
    for earlier, later in zip(lines, lines[1:], strict=False):
        assert earlier["finished_at"] <= later["started_at"]
    outcomes = {(line["length"], line["repeat"]): line for line in lines}
    failed = outcomes[(2 * KI, 1)]
    assert failed["outcome"] == "failed"
    assert failed["reason"] == f"AssertionError: {FAILURE_MESSAGE}"
    assert failed["figures"]["ttft"]["value"] > 0  # it was measured before it failed
    assert [line["reason"] for line in lines if line["outcome"] == "passed"] == [None] * 3


def test_report_md_has_the_per_length_table_failures_and_how_to_reproduce(
    failing_sweep: FailingSweep, vllm_url: str
) -> None:
    run_dir = failing_sweep.run_dir
    markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    header, rows = markdown_summary(markdown)
    assert header == SUMMARY_HEADER
    records = readable_records(run_dir / "results.jsonl")
    assert_summary_rows(rows, records)
    assert rows[1][SUMMARY_HEADER.index("outcomes")] == "1 passed, 1 contract"
    not_passed = markdown_section(markdown, "Points that did not pass")
    assert (
        f"2Ki repeat 1 (run `{run_dir.name}`): **failed (contract)**: AssertionError: "
        in not_passed
    )
    assert FAILURE_MESSAGE in not_passed and "1Ki" not in not_passed
    reproduce = markdown_section(markdown, "How to reproduce")
    command = re.search(r"```sh\n(.*?)\n```", reproduce, re.S)
    assert command, reproduce
    assert command.group(1).startswith("pytest ")
    assert f"--longctx-url={vllm_url}" in command.group(1)
    assert "--longctx-to=2Ki --longctx-repeats=2" in command.group(1)
    assert "- Profile: cpu-tiny" in reproduce


def test_benchmark_json_has_one_benchmark_per_length_and_metric(
    failing_sweep: FailingSweep,
) -> None:
    run_dir = failing_sweep.run_dir
    records = readable_records(run_dir / "results.jsonl")
    document = json.loads((run_dir / "benchmark.json").read_text(encoding="utf-8"))
    passed = [r for r in records if r.outcome == "passed"]
    assert len(passed) == 3  # 2Ki rep 1 failed: it is no round
    benchmarks = {b["name"]: b for b in document["benchmarks"]}
    assert list(benchmarks) == [
        f"test_prefill_decode[len={size}-{metric}]"
        for size in ("1Ki", "2Ki")
        for metric in ("ttft", "decode")
    ]
    for length in (KI, 2 * KI):
        repeats = sorted((r for r in passed if r.length == length), key=lambda r: r.started_at)
        ttft = benchmarks[f"test_prefill_decode[len={size_label(length)}-ttft]"]
        decode = benchmarks[f"test_prefill_decode[len={size_label(length)}-decode]"]
        assert ttft["stats"]["data"] == [r.figures["ttft"] for r in repeats]
        assert ttft["stats"]["rounds"] == len(repeats)
        assert ttft["stats"]["mean"] == pytest.approx(
            statistics.mean(r.figures["ttft"] for r in repeats)
        )
        per_token = [1 / r.figures["decode_throughput"] for r in repeats]
        assert decode["stats"]["data"] == pytest.approx(per_token)
        assert decode["extra_info"]["unit"] == "s/token"
        info = ttft["extra_info"]
        assert info["length"] == length
        assert [(r["repeat"], r["prompt_tokens"]) for r in info["rounds"]] == [
            (r.repeat, length) for r in repeats
        ]
        assert (
            info["rounds"][0]["figures"]["decode_throughput"]
            == repeats[0].figures["decode_throughput"]
        )
    assert document["machine_info"]["longctx_fingerprint"]["profile"] == "cpu-tiny"


def test_plots_are_pngs(failing_sweep: FailingSweep) -> None:
    for name in ("ttft.png", "decode.png", "kv_cache.png"):
        path = failing_sweep.run_dir / name
        assert path.read_bytes().startswith(PNG_SIGNATURE), name
        assert path.stat().st_size > 1000, name


# --------------------------------------------------------------------------- 3: report.html


def test_html_report_shows_the_table_columns_and_embedded_plots(
    failing_sweep: FailingSweep, vllm_url: str
) -> None:
    run_dir = failing_sweep.run_dir
    page = HtmlPage((run_dir / "report.html").read_text(encoding="utf-8"))
    records = readable_records(run_dir / "results.jsonl")

    summary = page.table(**{"class": "longctx-summary-table longctx-lengths"})
    assert [text for _, text in summary.header] == SUMMARY_HEADER
    assert_summary_rows(summary.rows, records)
    _, markdown_rows = markdown_summary((run_dir / "report.md").read_text(encoding="utf-8"))
    assert summary.rows == [[cell.replace("\\|", "|") for cell in row] for row in markdown_rows]

    assert_results_rows(page, records)
    rows = pytest_html_rows(page)
    results = {nodeid.rsplit("::", 1)[-1]: cells[0].text for nodeid, cells in rows.items()}
    assert results[f"test_prefill_decode{FAILING_NODE_SUFFIX}"] == "Failed"
    assert Counter(results.values()) == {"Passed": 3, "Failed": 1}

    images = embedded_pngs(page)
    assert images and all(image.startswith(PNG_SIGNATURE) for image in images)
    # the plots shown are the run's own, carried inside the page
    assert sorted(images) == sorted(p.read_bytes() for p in run_dir.glob("*.png"))
    assert external_resources(page) == []

    environment = json.loads(page.attribute("div", "data-jsonblob"))["environment"]
    assert environment["longctx run"] == run_dir.name
    assert environment["longctx profile"].startswith("cpu-tiny: ")
    # attached: the table is written before the server is asked what it serves
    assert environment["longctx model"] == f"as {vllm_url} serves it (see the sweep summary)"
    assert environment["longctx points"] == "1Ki..2Ki, 2 repeat(s), 32 decode tokens"
    assert page.headings == [f"Long-context sweep {run_dir.name} (cpu-tiny)"]


def test_each_record_carries_the_servers_own_timing_and_the_reports_set_both_sides_per_length(
    failing_sweep: FailingSweep,
) -> None:
    """The shared server is launched with ``--enable-per-request-metrics``: vLLM times each
    request and sends the figures on its stream's last chunk. Every record (the failed one
    too: it was measured) holds them beside the client's; a request alone is the one
    /metrics counted between the reads, so its own prefill, queue and decode are the
    histograms' sums there. Both reports set client and server TTFT per length, with the
    front end's share between them."""
    run_dir = failing_sweep.run_dir
    records = readable_records(run_dir / "results.jsonl")
    for record in records:
        timing = record.server_timing
        assert timing["source"] == "per_request", timing
        entry = timing["request"]
        view = record.server_metrics
        assert entry["ttft_s"] == pytest.approx(view["server_prefill"], rel=1e-6, abs=1e-9)
        assert entry["queue_s"] == pytest.approx(view["server_queue"], rel=1e-6, abs=1e-9)
        assert entry["decode_s"] == pytest.approx(view["server_decode"], rel=1e-6, abs=1e-9)
        assert entry["mean_itl_s"] == pytest.approx(entry["decode_s"] / 31)
        assert entry["client_ttft_s"] == record.figures["ttft"]
        assert 0 < entry["ttft_s"] < entry["client_ttft_s"]
        assert entry["front_end_s"] == pytest.approx(entry["client_ttft_s"] - entry["ttft_s"])
        assert record.figures["server_request_ttft"] == entry["ttft_s"]
        assert record.figures["front_end_ttft"] == entry["front_end_s"]
        assert entry["decode"] == "agrees" or entry["decode"].startswith("the stream"), entry
    markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    section = markdown_section(markdown, "Client and server TTFT")
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, rows = split_row(lines[0]), [split_row(line) for line in lines[2:]]
    assert header[:5] == [
        "Prompt",
        "Requests",
        "Client TTFT (s)",
        "Server TTFT (s)",
        "Front end (s)",
    ]
    assert [row[0] for row in rows] == ["1Ki", "2Ki"]
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        passed = [
            r.server_timing["request"]
            for r in records
            if size_label(r.length) == row[0] and r.outcome == "passed"
        ]
        assert int(cells["Requests"]) == len(passed)
        assert_mean_std(cells["Client TTFT (s)"], [e["client_ttft_s"] for e in passed])
        assert_mean_std(cells["Server TTFT (s)"], [e["ttft_s"] for e in passed])
        assert_mean_std(cells["Front end (s)"], [e["front_end_s"] for e in passed])
    assert "without the server's per-request timing" not in markdown
    page = HtmlPage((run_dir / "report.html").read_text(encoding="utf-8"))
    table = page.table(**{"class": "longctx-summary-table longctx-server-timing"})
    assert table.rows == [[cell.replace("\\|", "|") for cell in row] for row in rows]


# --------------------------------------------------------------------------- 4: --benchmark-json


def test_users_own_benchmark_json_holds_the_same_benchmarks(failing_sweep: FailingSweep) -> None:
    assert failing_sweep.user_benchmark_json.is_file(), failing_sweep.session.describe()
    document = json.loads(failing_sweep.user_benchmark_json.read_text(encoding="utf-8"))
    ours = json.loads((failing_sweep.run_dir / "benchmark.json").read_text(encoding="utf-8"))
    # pytest-benchmark wrote this one itself, from the benchmarks its session was handed
    assert document["benchmarks"] == ours["benchmarks"]
    assert document["machine_info"]["python_version"]  # pytest-benchmark's own layout
    output = failing_sweep.session.stdout + failing_sweep.session.stderr
    assert "Not saving anything" not in output
    assert "benchmark 'longctx ttft (s)': 2 tests" in output  # its table of the sweep


# --------------------------------------------------------------------------- 5: terminal


def test_terminal_summary_prints_the_report_table_and_where_files_are(
    failing_sweep: FailingSweep,
) -> None:
    run_dir = failing_sweep.run_dir
    header, rows, places = terminal_summary(failing_sweep.session.stdout)
    _, markdown_rows = markdown_summary((run_dir / "report.md").read_text(encoding="utf-8"))
    assert header == SUMMARY_HEADER
    assert rows == markdown_rows
    assert Path(places["results"]) == run_dir / "results.jsonl"
    assert Path(places["reports"].split(" (")[0]) == run_dir
    assert places["reports"].endswith("(report.md, report.html, benchmark.json, plots)")
    assert places["fidelity"].startswith("0 wrong answer(s) of 4 point(s)"), places


# --------------------------------------------------------------------------- 2: kill, resume


def test_a_killed_sweep_keeps_exactly_the_finished_points(
    killed_then_resumed: KilledThenResumed,
) -> None:
    killed = killed_then_resumed.killed
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    lines = [json.loads(line) for line in killed_then_resumed.after_kill.splitlines()]
    assert [(line["length"], line["repeat"], line["outcome"]) for line in lines] == [
        (KI, 0, "passed"),
        (2 * KI, 0, "passed"),
        (4 * KI, 0, "passed"),
    ]
    assert killed_then_resumed.after_kill.endswith("\n")
    # report.md was rewritten after every point, so the killed run still has its report
    _, rows = markdown_summary(killed_then_resumed.report_after_kill)
    assert [(row[0], row[2]) for row in rows] == [("1Ki", "1"), ("2Ki", "1"), ("4Ki", "1")]


def test_resume_measures_only_the_missing_points_and_keeps_the_corrupt_line(
    killed_then_resumed: KilledThenResumed,
) -> None:
    resumed = killed_then_resumed.resumed
    assert resumed.returncode == 0, resumed.describe()
    assert re.search(r"\b6 passed\b", resumed.stdout), resumed.stdout[-2000:]
    run_dir = killed_then_resumed.run_dir
    results = run_dir / "results.jsonl"
    text = results.read_text(encoding="utf-8")
    before = killed_then_resumed.after_kill
    # the earlier records are byte for byte what the killed session wrote, corrupt tail kept
    assert text.startswith(before + killed_then_resumed.half_line)
    lines = text.splitlines()
    assert lines[3] == killed_then_resumed.half_line
    new = [json.loads(line) for line in lines[4:]]
    assert [(line["length"], line["repeat"]) for line in new] == [(KI, 1), (2 * KI, 1), (4 * KI, 1)]

    read = read_records(results)
    assert len(read.problems) == 1 and f"{results}:4: skipped a corrupt record" in read.problems[0]
    assert "results.jsonl:4: skipped a corrupt record" in resumed.stdout
    points = Counter((r.length, r.repeat) for r in read.records)
    assert points == {(n * KI, rep): 1 for n in (1, 2, 4) for rep in (0, 1)}
    assert {r.outcome for r in read.records} == {"passed"}
    assert {r.run_id for r in read.records} == {run_dir.name}


def test_resumed_reports_show_all_points(killed_then_resumed: KilledThenResumed) -> None:
    run_dir = killed_then_resumed.run_dir
    records = readable_records(run_dir / "results.jsonl")
    markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    _, rows = markdown_summary(markdown)
    assert_summary_rows(rows, records)
    assert [row[2] for row in rows] == ["2", "2", "2"]
    assert "- Points: 6 recorded (6 passed)" in markdown
    _, terminal_rows, _ = terminal_summary(killed_then_resumed.resumed.stdout)
    assert terminal_rows == rows
    document = json.loads((run_dir / "benchmark.json").read_text(encoding="utf-8"))
    assert len(document["benchmarks"]) == 6
    page = HtmlPage((run_dir / "report.html").read_text(encoding="utf-8"))
    assert page.table(**{"class": "longctx-summary-table longctx-lengths"}).rows == rows
    # resumed items show the values recorded by the killed session
    assert_results_rows(page, records)


# --------------------------------------------------------------------------- 6: merging runs


def test_report_command_merges_two_real_runs(
    failing_sweep: FailingSweep, killed_then_resumed: KilledThenResumed, tmp_path: Path
) -> None:
    first, second = failing_sweep.run_dir, killed_then_resumed.run_dir
    merged = tmp_path / "merged"
    before = (second / "results.jsonl").read_bytes()
    session = run_process(
        tmp_path, "-m", "pytest_longctx", "report", str(first), str(second), "--output", str(merged)
    )
    assert session.returncode == 0, session.describe()
    assert "results.jsonl:4: skipped a corrupt record" in session.stderr
    assert (second / "results.jsonl").read_bytes() == before  # reported, never rewritten
    records = readable_records(first / "results.jsonl") + readable_records(second / "results.jsonl")
    markdown = (merged / "report.md").read_text(encoding="utf-8")
    _, rows = markdown_summary(markdown)
    assert_summary_rows(rows, records)
    # repeats are counted across runs: 1Ki has 2 + 2, 2Ki 1 + 2 (and the failure), 4Ki 0 + 2
    outcomes = SUMMARY_HEADER.index("outcomes")
    assert [(row[0], row[2], row[outcomes]) for row in rows] == [
        ("1Ki", "4", "4 passed"),
        ("2Ki", "3", "3 passed, 1 contract"),
        ("4Ki", "2", "2 passed"),
    ]
    assert f"- Runs: {first.name}, {second.name}" in markdown
    document = json.loads((merged / "benchmark.json").read_text(encoding="utf-8"))
    # 1Ki, 2Ki and 4Ki, TTFT and decode; each length's rounds are the repeats of both runs
    assert [b["stats"]["rounds"] for b in document["benchmarks"]] == [4, 4, 3, 3, 2, 2]
    for name in ("ttft.png", "decode.png"):
        assert (merged / name).read_bytes().startswith(PNG_SIGNATURE)
    page = HtmlPage((merged / "report.html").read_text(encoding="utf-8"))
    assert page.table(**{"class": "longctx-summary-table longctx-lengths"}).rows == rows
    assert external_resources(page) == []


# --------------------------------------------------------------------------- compare


def test_compare_two_real_runs_made_with_different_decode_lengths(
    pytester: pytest.Pytester, vllm_url: str
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    runs = []
    for decode in (8, 32):
        output = pytester.path / f"reports-{decode}"
        result = pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            f"--longctx-url={vllm_url}",
            SHARED_SERVERS_PROFILE,
            f"--longctx-output={output}",
            "--longctx-to=2Ki",
            "--longctx-repeats=2",
            f"--longctx-decode-tokens={decode}",
            timeout=ATTACHED_TIMEOUT_S,
        )
        result.assert_outcomes(passed=4)
        runs.append(run_folder(output))
    compared = pytester.path / "compared"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_longctx",
            "compare",
            *map(str, runs),
            "--output",
            str(compared),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    markdown = (compared / "compare.md").read_text()
    assert "- `decode_tokens`: 1: 8 | 2: 32" in markdown
    for length in ("1Ki", "2Ki"):
        (ttft_row, *_) = [ln for ln in markdown.splitlines() if ln.startswith(f"| {length} |")]
        assert ttft_row.count("(n=2)") == 2 and " | x" in ttft_row
    assert (compared / "compare.html").read_text().count("data:image/png;base64,") == 3
