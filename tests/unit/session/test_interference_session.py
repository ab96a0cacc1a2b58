"""The interference workload in a session: its items and options, its own server in the plan,
its records and reports, a server that cannot run the load refused with the reason, and runs
of two chunk sizes compared. Against a fake server of exactly known timing (the real server:
test_e2e_interference.py and test_e2e_interference_session.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fake_vllm import Behaviour, FakeVLLMProcess
from longctx_testing import (
    NO_PLOTS,
    PLOTS,
    SWEEP_TEST,
    fake_session_args,
    records_of,
    run_folder,
    schedule_on_two,
)

from pytest_longctx.core.records import read_records
from pytest_longctx.gate import Tolerances, compare_length
from pytest_longctx.plan.points import BACKGROUND_DECODE_TOKENS, BACKGROUND_PROMPT_TOKENS
from pytest_longctx.workloads import points_of

LOAD = "--longctx-workload=cold,interference"
PREFILL_S = 0.6


def _behaviour(**changes) -> Behaviour:  # noqa: ANN003
    settings = {
        "long_prompt_from": 1000,
        "first_token_delay_s": PREFILL_S,
        "short_first_token_delay_s": 0.02,
        "token_delay_s": 0.02,
        "prompt_tokens_details": True,
        "prefill_interference": "stall",
        "scheduler_config": {"max_num_batched_tokens": 16384, "max_num_seqs": 5},
    }
    settings.update(changes)
    return Behaviour(**settings)


def _session(pytester: pytest.Pytester, url: str, *args: str, output: str = "reports"):  # noqa: ANN202
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    root = pytester.path / output
    result = pytester.runpytest(
        *fake_session_args(url, root), "--longctx-progress=off", "-p", "no:randomly", *args
    )
    return result, records_of(root)


# -- the plan and the options (nothing started) -------------------------------------------


def test_the_plan_shows_the_interference_items_and_their_own_server(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=2Ki", LOAD,
        "--longctx-max-num-batched-tokens=1Ki",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    text = result.stdout.str()
    assert "len=1Ki-rep=0-interference" in text and "len=2Ki-rep=0-interference" in text
    study, _, loaded = text.partition("then, for the interference points, a server with room for")
    assert loaded, text
    study_line = next(line for line in study.splitlines() if "--max-model-len" in line)
    loaded_line = next(line for line in loaded.splitlines() if "--max-model-len" in line)
    assert "--max-num-seqs 1 " in study_line and "VLLM_SERVER_DEV_MODE" not in study_line
    assert "--max-num-batched-tokens" not in study_line
    assert "--max-num-seqs 5 " in loaded_line  # four background streams and the long prompt
    assert "--max-num-batched-tokens 1024" in loaded_line
    assert "VLLM_SERVER_DEV_MODE=1" in loaded_line
    assert "--enable-prompt-tokens-details" in loaded_line
    each = BACKGROUND_PROMPT_TOKENS + BACKGROUND_DECODE_TOKENS
    assert f"interference points: each length beside 4 background requests of {each} tokens" in text


def test_interference_items_are_selected_like_any_other(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)

    def items(*args: str) -> list[str]:
        result = pytester.runpytest(
            "-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=4Ki", LOAD, *args
        )
        assert result.ret == 0, result.stdout.str()
        return [line.strip() for line in result.stdout.lines if line.startswith("  len=")]

    assert items("-k", "interference", "-m", "len<=2Ki") == [
        "len=1Ki-rep=0-interference",
        "len=2Ki-rep=0-interference",
    ]
    assert items("-m", "longctx_interference and len>2Ki") == ["len=4Ki-rep=0-interference"]
    assert items("-k", "not interference") == ["len=1Ki-rep=0", "len=2Ki-rep=0", "len=4Ki-rep=0"]
    only = pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=1Ki",
        "--longctx-workload=interference",
    )  # fmt: skip
    text = only.stdout.str()
    assert "len=1Ki-rep=0-interference" in text and "  len=1Ki-rep=0\n" not in text
    # a run of the interference points alone starts their server first, and only it
    assert "then, for the interference points" not in text and "--max-num-seqs 5 " in text


def test_the_options_of_the_workload_are_checked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    for args, expected in (
        (
            [LOAD, "--longctx-background-streams=0"],
            "*--longctx-background-streams=0: expected a wh*",
        ),
        (
            ["--longctx-background-streams=4"],
            "*--longctx-background-streams=4 applies to the interference workload*",
        ),
        (
            ["--longctx-max-num-batched-tokens=2Ki"],
            "*--longctx-max-num-batched-tokens=2Ki applies to the interference workload*",
        ),
        ([LOAD, "--longctx-max-num-batched-tokens=lots"], "*=lots: expected a token count*"),
        (
            [LOAD, "--longctx-max-num-batched-tokens=2Ki", "--longctx-url=http://127.0.0.1:9"],
            "*an attached server (--longctx-url) runs with its own*",
        ),
        (["--longctx-workload=interference,hot"], "*expected a comma-separated list of cold*"),
    ):
        result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        result.stderr.fnmatch_lines([expected])


# -- sessions attached to the fake ----------------------------------------------------------


@pytest.fixture(scope="module")
def stalling_fake():  # noqa: ANN201
    with FakeVLLMProcess(_behaviour()) as fake:
        yield fake


def test_a_session_records_and_reports_what_the_prefill_cost_the_streams(
    pytester: pytest.Pytester, stalling_fake: FakeVLLMProcess
) -> None:
    result, records = _session(pytester, stalling_fake.url, "-m", "len==1Ki", LOAD, PLOTS)
    result.assert_outcomes(passed=2)
    cold, loaded = records
    assert (cold.cache_state, loaded.cache_state) == ("cold", "interference")
    assert loaded.nodeid.endswith("[len=1Ki-rep=0-interference]")
    assert loaded.background_streams == 4 and cold.background_streams == 0
    figures = loaded.figures
    # The streams' tokens stop for the prefill. Those counted in its window left the stand-in
    # before it had read the long prompt: on a loaded host it reads a request a while after
    # the client sent it (12 tokens once, 60 ms of four streams): a small share of what the
    # streams send in as long a window idle.
    during = figures["bg_tokens_during_prefill"]
    assert during < 0.25 * figures["bg_rate_idle"] * loaded.interference["windows_s"]["prefill"]
    # the stall against the streams' usual gap: their median, which one pause of a busy host
    # (it moves the p99 of a few dozen gaps) leaves where it was
    assert figures["bg_itl_prefill_max"] > 0.8 * PREFILL_S > 10 * figures["bg_itl_idle_median"]
    assert figures["bg_itl_idle_p99"] >= figures["bg_itl_idle_median"]
    assert loaded.interference["chunk"]["max_num_batched_tokens"] == 16384
    assert loaded.interference["sequence_limit"]["ran_at_once"] is True
    assert loaded.interference["server_itl"]["agreement"] == "agrees"
    assert loaded.interference["long_cached_tokens"] == 0
    folder = run_folder(pytester.path / "reports")
    report = (folder / "report.md").read_text()
    assert "## Interference: what one long prefill costs the streams beside it" in report
    row = next(line for line in report.splitlines() if line.startswith("| 1Ki | 1 | 4 |"))
    assert "16,384" in row and f" {during:,.0f}" in row
    assert ("(stalled)" in row) == (during == 0)
    # one TTFT alone (the cold point's), one under load
    assert f"{cold.figures['ttft']:,.3f}" in row and f"{figures['ttft']:,.3f}" in row
    assert "1Ki repeat 0" not in report.split("## Points that did not pass")[1]
    page = (folder / "report.html").read_text()
    assert "longctx-interference-table" in page
    assert "0 under 4 background streams" in page  # its row in pytest-html's table
    assert (folder / "interference_itl.png").is_file()
    assert (folder / "interference_ttft.png").is_file()
    benchmarks = json.loads((folder / "benchmark.json").read_text())["benchmarks"]
    groups = {b["group"].split()[0] for b in benchmarks}
    assert groups == {"longctx", "longctx-interference"}
    assert "interference: the prefill beside background streams" in result.stdout.str()
    # the cold table is the cold point's alone
    assert "| 1Ki | 1,024 | 1 |" in report


def test_a_server_that_cannot_run_the_load_is_refused_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    with FakeVLLMProcess(_behaviour(max_num_seqs=1, first_token_delay_s=0.1)) as fake:
        result, records = _session(pytester, fake.url, "-m", "len==1Ki", LOAD)
    result.assert_outcomes(passed=1, failed=1)
    loaded = records[-1]
    assert loaded.cache_state == "interference" and loaded.failure_class == "refused"
    assert "cannot run 5 requests at once" in loaded.reason
    assert "at most 1 ran at once" in loaded.reason and "--max-num-seqs 5" in loaded.reason


def test_usage_without_cached_tokens_cannot_prove_the_prompt_cold(
    pytester: pytest.Pytester,
) -> None:
    with FakeVLLMProcess(_behaviour(prompt_tokens_details=False)) as fake:
        result, records = _session(pytester, fake.url, "-m", "len==1Ki", "-k", "interference", LOAD)
    result.assert_outcomes(failed=1)
    assert "--enable-prompt-tokens-details" in records[-1].reason
    assert records[-1].figures["bg_itl_idle_median"] > 0  # its figures stay recorded


def test_a_preemption_fails_the_point(pytester: pytest.Pytester) -> None:
    with FakeVLLMProcess(_behaviour(preemptions_per_long_request=1)) as fake:
        result, records = _session(pytester, fake.url, "-m", "len==1Ki", "-k", "interference", LOAD)
    result.assert_outcomes(failed=1)
    assert records[-1].failure_class == "contract"
    assert "preempted 1 request(s)" in records[-1].reason


def test_runs_of_two_chunk_sizes_compared_and_gated(
    pytester: pytest.Pytester, stalling_fake: FakeVLLMProcess
) -> None:
    """The trade a chunk size makes: one chunk for the whole prompt stalls every stream; a
    small chunk lets them through at a slower pace. compare lays the runs side by side."""
    args = ("-m", "len==1Ki", "-k", "interference", LOAD)
    _session(pytester, stalling_fake.url, *args, output="whole")
    chunked = _behaviour(
        prefill_interference="slow",
        interference_token_delay_s=0.06,
        scheduler_config={"max_num_batched_tokens": 256, "max_num_seqs": 5},
    )
    with FakeVLLMProcess(chunked) as fake:
        _session(pytester, fake.url, *args, output="chunked")
    runs = [run_folder(pytester.path / name) for name in ("whole", "chunked")]
    out = pytester.path / "compared"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_longctx", "compare", *map(str, runs), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = (out / "compare.md").read_text()
    assert "interference chunk 16,384 tokens" in text and "interference chunk 256 tokens" in text
    assert "## TTFT under load (s)" in text
    assert "## background p99 inter-token gap during the prefill (s)" in text
    assert (out / "compare_interference.png").is_file()
    stall = text.split("## background p99 inter-token gap during the prefill (s)")[1]
    row = next(line for line in stall.splitlines() if line.startswith("| 1Ki"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # the whole prompt's stall against the small chunk's pace: ~10x on an idle host, 3x seen on
    # a host busy enough to stretch the chunked streams' gaps; the verdict below says the same
    assert float(cells[1].split()[0]) > 2 * float(cells[2].split()[0])
    baseline, current = (read_records(run / "results.jsonl").records for run in runs)
    verdict = compare_length(list(baseline), list(current), 1024, Tolerances())
    judged = {v.metric: v for v in verdict.verdicts}
    assert judged["stall"].change_pct < -50  # the small chunk's streams waited far less
    assert "ttft" not in judged  # no cold point on either side: nothing cold to judge


def test_under_xdist_the_interference_points_follow_every_cold_one(
    pytester: pytest.Pytester,
) -> None:
    """Longest first within each workload, the interference points after all cold ones: each
    worker starts the interference points' server once."""
    from pytest_longctx.session.activation import PREPARED_KEY

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-to=4Ki", LOAD)
    run = config.stash[PREPARED_KEY].run
    collection = [f"test_sweep.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    scheduler, a, b, handed_out = schedule_on_two(config, run, collection)
    while scheduler.has_pending:
        for node in (a, b):
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0])
    names = [collection[i].split("[")[-1].rstrip("]") for i in handed_out]
    assert names == [
        "len=4Ki-rep=0",
        "len=2Ki-rep=0",
        "len=1Ki-rep=0",
        "len=4Ki-rep=0-interference",
        "len=2Ki-rep=0-interference",
        "len=1Ki-rep=0-interference",
    ]


def test_gaps_the_servers_histogram_does_not_confirm_keep_the_ttft_without_a_decode_figure(
    pytester: pytest.Pytester,
) -> None:
    """A stream held back and flushed at once (a starved host): its gaps are not the server's,
    and the server's decode time counts the background requests too, so the long prompt has
    no decode figure of its own. The point passes with its TTFT, its decode figures and its
    background figures set aside (recorded, neither reported nor gated) and the reason said;
    --longctx-allow-unconfirmed keeps the background figures where the gate reads them, and
    --longctx-strict-stream fails the point."""
    args = ("-m", "len==1Ki", "-k", "interference", LOAD)
    # a faster decode than the other tests': each background request (256 tokens) is held
    # back whole, and the streams' first, the probe's and the last requests are waited out
    with FakeVLLMProcess(_behaviour(deliver_at_once=True, token_delay_s=0.005)) as fake:
        result, records = _session(pytester, fake.url, *args, output="kept")
        result.assert_outcomes(passed=1)
        (record,) = [r for r in records if r.cache_state == "interference"]
        allowed, allowed_records = _session(
            pytester, fake.url, *args, "--longctx-allow-unconfirmed", output="allowed"
        )
        strict, strict_records = _session(
            pytester, fake.url, *args, "--longctx-strict-stream", output="strict"
        )
    figures = record.figures
    assert figures["ttft"] > PREFILL_S
    assert not {"decode_throughput", "itl_median", "itl_p90", "itl_max"} & set(figures)
    assert figures["stream_decode_throughput"] > 0  # measured, kept, not the point's
    assert record.stream["decode_source"] == "none"
    assert "disagree with the server's inter-token histogram" in record.stream["decode_problem"]
    assert "this point has no decode figure" in record.stream["decode_problem"]
    # the background figures: measured and kept in the record, where nothing gates them
    assert not [name for name in figures if name.startswith("bg_")]
    gaps = record.interference["background_gaps"]
    assert gaps["verdict"] == "refuted"
    assert "disagree with the server's inter-token histogram" in gaps["why"]
    assert "--longctx-allow-unconfirmed keeps and gates them" in gaps["figures"]
    assert record.interference["unconfirmed_figures"]["bg_itl_idle_p99"] >= 0
    report = (run_folder(pytester.path / "kept") / "report.md").read_text()
    assert "Background figures set aside, out of these tables and the gate" in report
    assert "Decode figures: 1 point without a decode figure, TTFT kept" in report
    # --longctx-allow-unconfirmed: the same point, its background figures kept and gated
    allowed.assert_outcomes(passed=1)
    (kept,) = [r for r in allowed_records if r.cache_state == "interference"]
    assert kept.interference["background_gaps"]["verdict"] == "refuted"
    assert "--longctx-allow-unconfirmed" in kept.interference["background_gaps"]["figures"]
    assert kept.figures["bg_itl_idle_p99"] >= 0 and "unconfirmed_figures" not in kept.interference
    report = (run_folder(pytester.path / "allowed") / "report.md").read_text()
    assert "Background figures kept and gated although the server's own figures" in report
    # the gate: a stall set aside is not compared, and fails the length, never passes it
    stall = {v.metric: v for v in compare_length([kept], [record], 1024).verdicts}["stall"]
    assert stall.status == "insufficient", stall.message
    assert "this run set every interference point's background figures aside" in stall.message
    both = {v.metric: v for v in compare_length([record], [record], 1024).verdicts}["stall"]
    assert both.status == "insufficient", both.message
    strict.assert_outcomes(failed=1)
    assert "disagree with the server's inter-token histogram" in strict_records[-1].reason
    assert "(--longctx-strict-stream fails such points)" in strict_records[-1].reason


#: Launches the fake in place of vLLM, as the command asks: one sequence for the study's
#: server, the interference points' room, chunk and config for theirs; notes each command.
LAUNCH_FAKE_AS_ASKED = """
import json
import sys
from pytest_longctx.serving.vllm_command import ServerCommand

def pytest_longctx_server_command(config, plan, command):
    argv = list(command.argv)
    with open("commands.jsonl", "a") as out:
        out.write(json.dumps({"argv": argv, "env": dict(command.env)}) + "\\n")
    seqs = int(argv[argv.index("--max-num-seqs") + 1])
    behaviour = {"max_num_seqs": seqs, "long_prompt_from": 1000, "first_token_delay_s": 0.3,
                 "short_first_token_delay_s": 0.02, "token_delay_s": 0.02,
                 "prompt_tokens_details": "--enable-prompt-tokens-details" in argv}
    if "--max-num-batched-tokens" in argv:
        chunk = int(argv[argv.index("--max-num-batched-tokens") + 1])
        behaviour["scheduler_config"] = {"max_num_batched_tokens": chunk, "max_num_seqs": seqs}
    port = argv[argv.index("--port") + 1]
    return ServerCommand(
        (sys.executable, MAIN, "--host", "127.0.0.1", "--port", port,
         "--served-model-name", "tiny-llama", "--behaviour", json.dumps(behaviour)),
        {},
    )
"""


def test_the_cold_points_keep_the_study_server_and_the_interference_points_get_their_own(
    pytester: pytest.Pytester,
) -> None:
    """One session, two server starts: the study's one-sequence server for the cold point,
    then one with room for the load, the chunk asked for and its config readable. The
    switch is no relaunch: it happens with relaunches spent."""
    from longctx_testing import FAKE_MAIN

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(f"MAIN = {str(FAKE_MAIN)!r}\n" + LAUNCH_FAKE_AS_ASKED)
    root = pytester.path / "reports"
    # in a process of its own: a launched session prepares the embedded model (torch), which
    # an in-process session's module snapshot would drop and a second import would crash on
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--longctx-output={root}", "--longctx-progress=off",
        "--longctx-decode-tokens=8", "-m", "len==1Ki", LOAD, NO_PLOTS,
        "--longctx-max-num-batched-tokens=1024", "--longctx-max-relaunches=0",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    cold, loaded = records_of(root)
    study, theirs = [
        json.loads(line) for line in (pytester.path / "commands.jsonl").read_text().splitlines()
    ]
    argv = study["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "1"
    assert "--max-num-batched-tokens" not in argv and "VLLM_SERVER_DEV_MODE" not in study["env"]
    argv = theirs["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "5"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "1024"
    assert theirs["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert argv[argv.index("--port") + 1] == study["argv"][study["argv"].index("--port") + 1]
    assert cold.server_start["index"] == 0 and "switched" not in cold.server_start
    assert loaded.server_start["index"] == 1 and loaded.server_start["switched"] is True
    assert loaded.server_start["cause"].startswith("the interference workload: room for 4")
    assert loaded.interference["chunk"]["max_num_batched_tokens"] == 1024
    assert cold.fingerprint["workload"] == loaded.fingerprint["workload"]
    report = (run_folder(root) / "report.md").read_text()
    assert "Server starts: 2: #0 up in" in report and "after the interference workload" in report


def test_the_ini_file_sets_the_workload_and_its_streams(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeini(
        "[pytest]\nlongctx_workload = interference\nlongctx_background_streams = 2\n"
        "longctx_max_num_batched_tokens = 4Ki\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=1Ki")
    assert result.ret == 0, result.stdout.str()
    text = result.stdout.str()
    assert "--max-num-seqs 3 " in text and "--max-num-batched-tokens 4096" in text
    assert "beside 2 background streams" in text
    bad = pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", "--longctx-background-streams=two"
    )
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--longctx-background-streams=two: expected a whole number >= 1*"])
