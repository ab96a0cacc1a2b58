"""The gate in the reports and the index of runs, from records alone (no browser, no server);
tests/unit/reporting/test_browser.py renders the same pages in Chromium."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fabricated_runs import (
    BUILT_IN,
    NOW,
    faster,
    make_records,
    merged,
    write_records,
    write_run,
)

from pytest_longctx.cli import main
from pytest_longctx.core.records import Record, append_record
from pytest_longctx.gate import compare_length, parse_tolerances
from pytest_longctx.reporting import gate_report, index

KI = 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOW_RUN = "20260101T000000Z-c0ffee"
BASE_RUN = "20251201T000000Z-ba5e11"


def view(baseline_figures=None, current=None, **kwargs) -> gate_report.GateView:  # noqa: ANN001
    baseline = make_records(BASE_RUN, baseline_figures or faster(NOW))
    return gate_report.build_view(
        baseline,
        current if current is not None else make_records(NOW_RUN, NOW),
        parse_tolerances(BUILT_IN),
        **kwargs,
    )


def test_the_view_agrees_with_the_gate_items_and_shows_both_sides() -> None:
    gate = view()
    assert [(row.length, row.status, row.failing) for row in gate.rows] == [
        (1 * KI, "ok", False),
        (2 * KI, "regressed", True),
        (4 * KI, "ok", False),
        (8 * KI, "regressed", True),
    ]
    two = gate.rows[1].metrics["ttft"]
    assert (two.baseline.mean, two.current.mean) == (pytest.approx(0.07), pytest.approx(0.1))
    assert two.change_pct == pytest.approx(100 * (0.1 / 0.07 - 1))
    assert gate.rows[1].messages[0].startswith("TTFT at 2Ki regressed: baseline 0.0700 ± 0.0014")
    assert gate.headline() == "2 of 4 lengths failed (2Ki, 8Ki)"
    assert gate_report.table_rows(gate)[1][:5] == [
        "2Ki",
        "regressed",
        "0.0700 ± 0.0014 (n=3)",
        "0.100 ± 0.002 (n=3)",
        "+42.9% worse",
    ]


def test_lengths_on_one_side_and_a_failed_point() -> None:
    current = [r for r in make_records(NOW_RUN, NOW) if r.length != 8 * KI]
    # 4Ki: every repeat failed now, so its item fails with "no passed point"
    current = [
        Record(**{**r.__dict__, "outcome": "failed"}) if r.length == 4 * KI else r for r in current
    ]
    gate = view(NOW, current)
    statuses = {row.length: row.status for row in gate.rows}
    assert statuses == {1 * KI: "ok", 2 * KI: "ok", 4 * KI: "missing_in_current"}
    assert gate.unmeasured == (8 * KI,)
    assert gate.headline() == "1 of 3 lengths failed (4Ki)"
    markdown = gate_report.markdown_section(gate)
    assert "| 4Ki | no passed point now | 0.200 ± 0.004 (n=3) | – | – |" in markdown
    assert "Baseline lengths not measured in this run: 8Ki." in markdown


def test_itl_of_chunked_streams_on_both_sides_shows_as_not_compared() -> None:
    """Chunks of eight on both sides: no ITL to gate; the report says so, as for any gated
    figure a side lacks, instead of leaving the column blank."""

    def chunked(records: list[Record]) -> list[Record]:
        return [
            Record(
                **{
                    **r.__dict__,
                    "figures": {k: v for k, v in r.figures.items() if not k.startswith("itl_")},
                    "stream": {"stream_interval": 8, "per_token_gaps": False},
                }
            )
            for r in records
        ]

    baseline = chunked(make_records(BASE_RUN, NOW))
    gate = gate_report.build_view(baseline, chunked(make_records(NOW_RUN, NOW)))
    assert {row.status for row in gate.rows} == {"insufficient"}
    assert gate.rows[0].metrics["itl"].status == "insufficient"
    markdown = gate_report.markdown_section(gate)
    assert "| 1Ki | not compared |" in markdown
    assert (
        "- 1Ki: median inter-token latency at 1Ki: not compared, the baseline and this run "
        "streamed chunks of several tokens (stream interval 8)" in markdown
    )
    assert "gate with itl=off" in markdown
    off = gate_report.build_view(
        baseline, chunked(make_records(NOW_RUN, NOW)), parse_tolerances("itl=off")
    )
    assert {row.status for row in off.rows} == {"ok"}


def test_a_baseline_of_another_setup_is_refused_unless_forced() -> None:
    other = [
        Record(**{**r.__dict__, "fingerprint": {**r.fingerprint, "vllm_version": "0.31.0"}})
        for r in make_records(BASE_RUN, NOW)
    ]
    current = make_records(NOW_RUN, NOW)
    refused = gate_report.build_view(other, current, parse_tolerances(BUILT_IN))
    assert {row.status for row in refused.rows} == {"refused"}
    assert refused.refused == ("vllm_version: baseline 0.31.0, now 0.32.0",)
    assert "refused to compare unlike with unlike" in gate_report.html_fragment(refused)
    forced = gate_report.build_view(other, current, parse_tolerances(BUILT_IN), force=True)
    assert {row.status for row in forced.rows} == {"ok"}


def test_a_history_baseline_shows_its_session_means() -> None:
    history = make_records("20251201T000000Z-aaaaaa", NOW) + make_records(
        "20251202T000000Z-bbbbbb", faster(NOW, lengths=tuple(NOW), by=0.9)
    )
    gate = gate_report.build_view(history, make_records(NOW_RUN, NOW), parse_tolerances(BUILT_IN))
    assert gate.baseline_sessions == 2
    cell = gate_report.format_stats(gate.rows[0].metrics["ttft"].baseline, "ttft")
    # session means 0.050 and 0.045: 0.0475 ± 0.0035
    assert cell == "0.0475 ± 0.0035 (2 sessions, n=6)"
    assert "2 baseline sessions: between-session noise" in gate.settings()


def test_the_chart_is_drawn_only_with_figures(tmp_path: Path) -> None:
    drawn = gate_report.write_gate_plot(view(), tmp_path)
    assert drawn.plot == tmp_path / "gate.png"
    assert drawn.plot.read_bytes().startswith(PNG_SIGNATURE)
    empty = gate_report.build_view(make_records(BASE_RUN, NOW), [], lengths=())
    assert gate_report.write_gate_plot(empty, tmp_path / "none").plot is None
    assert not (tmp_path / "none").exists()


def test_report_command_adds_the_gate_and_rewrites_the_index(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    run = write_run(tmp_path / "reports", NOW_RUN)
    baseline = write_records(tmp_path / "b.jsonl", make_records(BASE_RUN, faster(NOW)))
    assert main(["report", str(run), "--baseline", str(baseline), "--tolerance", BUILT_IN]) == 0
    printed = capsys.readouterr().out.split()
    assert str(run / "gate.png") in printed
    assert str((tmp_path / "reports" / "index.html").absolute()) in printed
    markdown = (run / "report.md").read_text()
    gate = markdown[markdown.index("## Regression gate") : markdown.index("## Points that")]
    assert "**2 of 4 lengths failed (2Ki, 8Ki)**" in gate
    assert "(from --tolerance), level 0.01" in gate
    page = (run / "report.html").read_text()
    assert page.count('class="longctx-gate-failing"') == 2
    assert page.count("data:image/png;base64,") == 3  # ttft, decode, gate


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--tolerance", "ttft=5%"], "--tolerance and --level need --baseline FILE"),
        (["--baseline", "nowhere.jsonl"], "nowhere.jsonl: no such file"),
        (["--baseline", "{b}", "--level", "0.7"], "--level=0.7: expected a probability"),
        (["--baseline", "{b}", "--tolerance", "ttft=fast"], "--tolerance: 'ttft=fast'"),
    ],
)
def test_report_gate_options_are_checked(tmp_path: Path, capsys, args, problem) -> None:  # noqa: ANN001
    run = write_run(tmp_path, NOW_RUN)
    baseline = write_records(tmp_path / "b.jsonl", make_records(BASE_RUN, NOW))
    args = [arg.replace("{b}", str(baseline)) for arg in args]
    assert main(["report", str(run), *args]) == 2
    assert problem in capsys.readouterr().err


def test_the_index_reads_each_run_folder(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    done = write_run(root, "20260101T000000Z-0000aa", start=1_780_000_000.0)
    broken = root / "20260601T000000Z-0000cc"
    broken.mkdir()
    (broken / "results.jsonl").write_text("{half a line\n")
    interrupted = write_run(root, "20260102T000000Z-0000bb", start=1_780_086_400.0)
    last = make_records(interrupted.name, {KI: NOW[KI]}, start=1_780_086_400.0)[0]
    append_record(
        interrupted / "results.jsonl", Record(**{**last.__dict__, "outcome": "interrupted"})
    )
    os.symlink(interrupted.name, root / "latest")
    (root / "notes").mkdir()

    entries = index.scan_runs(root)

    assert [e.folder for e in entries] == [broken.name, interrupted.name, done.name]
    by_name = {e.folder: e for e in entries}
    assert by_name[interrupted.name].latest and not by_name[done.name].latest
    # the re-measured 1Ki rep 0 counts once, as its latest record says
    assert (by_name[interrupted.name].passed, by_name[interrupted.name].total) == (11, 12)
    assert by_name[interrupted.name].outcome_words() == "failed: 11 passed, 1 interrupted"
    assert by_name[done.name].outcome_words() == "passed"
    assert by_name[broken.name].outcome == "no points" and by_name[broken.name].problems == 1
    assert by_name[broken.name].date() == "2026-06-01 00:00:00 UTC"  # from its run id
    page = index.write_index(root).read_text()
    assert page.count("<tr class=") == 3
    assert "(1 unreadable line(s))" in page
    assert "http" not in page and "<script" not in page


def test_index_command(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    write_run(tmp_path, NOW_RUN)
    assert main(["index", str(tmp_path)]) == 0
    assert (tmp_path / "index.html").is_file()
    assert main(["index", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_lengths_whose_streams_were_held_back_are_judged_on_the_servers_figures() -> None:
    """A run whose 1Ki points all kept the server's decode figure (their streams in bursts)
    and its per-request mean ITL: the length is judged on the server's figures on both sides,
    and the report says whose figures were compared, blaming no one."""

    def with_server_itl(record: Record, **changes) -> Record:  # noqa: ANN003
        figures = {**record.figures, "server_request_itl": record.figures["itl_median"]}
        return Record(**{**record.__dict__, "figures": figures, **changes})

    baseline = [with_server_itl(r) for r in make_records(BASE_RUN, NOW)]
    current = []
    for record in make_records(NOW_RUN, NOW):
        record = with_server_itl(record)
        if record.length == 1 * KI:
            figures = {k: v for k, v in record.figures.items() if k != "itl_median"}
            record = Record(
                **{**record.__dict__, "figures": figures, "stream": {"decode_source": "server"}}
            )
        current.append(record)
    gate = gate_report.build_view(baseline, current, parse_tolerances(BUILT_IN))
    one = gate.rows[0]
    assert (one.length, one.status, one.failing) == (1 * KI, "ok", False)
    assert one.metrics["itl"].status == "ok"
    assert one.metrics["itl"].current.mean == pytest.approx(sum(1 / d for d in NOW[KI][1]) / 3)
    markdown = gate_report.markdown_section(gate)
    assert "Where the figures came from:" in markdown
    assert (
        "- 1Ki: decode throughput: decode figures: this run's from the server at 3 of 3 points"
        in markdown
    )
    assert (
        "- 1Ki: median inter-token latency: judged on the server's own mean inter-token "
        "latency per request (vLLM's per-request metrics) on both sides: this run's streams "
        "showed no per-token gap at 3 of 3 points (in bursts, off the server's decode)"
    ) in markdown
    assert "busy host" not in markdown
    assert "Where the figures came from:" in gate_report.html_fragment(gate)


def test_a_length_whose_streams_were_all_merged_fails_without_the_servers_figure() -> None:
    """A release whose API server falls behind at every point: every stream merged into
    chunks of several tokens on both sides, and no per-request figure from the server. No
    side has a token's time at 1Ki, so its ITL is not compared and the length fails; the
    message names what is missing rather than a busy host."""
    baseline, current = merged(make_records(BASE_RUN, NOW)), merged(make_records(NOW_RUN, NOW))
    verdict = compare_length(baseline, current, 1 * KI, parse_tolerances(BUILT_IN))
    itl = {v.metric: v for v in verdict.verdicts}["itl"]
    assert itl.status == "insufficient" and verdict.status == "insufficient"
    assert itl.message == (
        "median inter-token latency at 1Ki: not compared, the baseline and this run have no "
        "per-token figure: their streams showed no per-token gap (merged into chunks of "
        "several tokens at a stream interval of 1, the stream behind the server: 3 of 3 "
        "points each) and the server sent no mean inter-token latency of its own (vLLM's "
        "--enable-per-request-metrics, which a launched server gets); measure on a server "
        "that sends per-request metrics, or gate with itl=off"
    )
    gate = gate_report.build_view(baseline, current, parse_tolerances(BUILT_IN))
    assert [(row.status, row.failing) for row in gate.rows] == [("insufficient", True)] * 4
    # one side merged is as short of a figure as both
    one_side = compare_length(make_records(BASE_RUN, NOW), current, 1 * KI)
    assert one_side.status == "insufficient"
    assert "not compared, this run has no per-token figure: its streams" in one_side.message
    # itl=off: the length compares what it has
    off = compare_length(baseline, current, 1 * KI, parse_tolerances("ttft=10%,decode=5%,itl=off"))
    assert off.status == "ok"


@pytest.mark.parametrize(("factor", "status"), [(1.0, "ok"), (1.5, "regressed")])
def test_merged_streams_are_judged_on_the_servers_mean_itl(factor: float, status: str) -> None:
    """The same release with the server's per-request figures: each side's mean ITL, as
    vLLM timed every request, is what the gate compares (never a stream's median against
    the server's mean), and 50% slower tokens regress."""
    baseline = merged(make_records(BASE_RUN, NOW), server_itl=1.0)
    current = merged(make_records(NOW_RUN, NOW), server_itl=factor)
    verdict = compare_length(baseline, current, 1 * KI, parse_tolerances(BUILT_IN))
    itl = {v.metric: v for v in verdict.verdicts}["itl"]
    assert itl.status == status and verdict.status == status
    assert itl.change_pct == pytest.approx(100 * (factor - 1))
    assert itl.message.startswith(
        "the server's mean inter-token latency per request at 1Ki "
        + ("ok" if status == "ok" else "rose")
    )
    assert itl.sources == (
        "judged on the server's own mean inter-token latency per request (vLLM's per-request "
        "metrics) on both sides: the baseline's and this run's streams showed no per-token "
        "gap at 3 of 3 points each (merged into chunks of several tokens at a stream "
        "interval of 1, the stream behind the server)"
    )


def test_a_baseline_from_before_per_request_metrics_names_what_to_refresh() -> None:
    """The baseline's streams had per-token gaps and no server mean ITL (recorded before
    per-request metrics); this run's streams are all merged and carry the server's. Nothing
    per-token is on both sides: the length fails, and the message says the baseline needs
    recording again, not only that a figure is missing."""
    baseline = make_records(BASE_RUN, NOW)
    current = merged(make_records(NOW_RUN, NOW), server_itl=1.0)
    verdict = compare_length(baseline, current, 1 * KI, parse_tolerances(BUILT_IN))
    itl = {v.metric: v for v in verdict.verdicts}["itl"]
    assert itl.status == "insufficient" and verdict.status == "insufficient"
    assert "the baseline has per-token gaps but no server mean inter-token latency" in (itl.message)
    assert "record the baseline again on a server that sends them" in itl.message
