"""The concurrency workload in a session: its items, options and server in the plan, its
records, and an attached server that cannot run a level at once refused with the reason.
Against a fake server of known timing (the real server: test_e2e_concurrency.py)."""

from __future__ import annotations

import json

import pytest
from fake_vllm import Behaviour, FakeVLLMProcess
from longctx_testing import PLOTS, SWEEP_TEST, fake_session_args, records_of, run_folder

WORKLOAD = "--longctx-workload=concurrency"


def _plan(pytester: pytest.Pytester, *args: str):  # noqa: ANN202
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", *args)


def test_the_plan_shows_the_levels_the_fit_per_length_and_the_servers_room(
    pytester: pytest.Pytester,
) -> None:
    result = _plan(
        pytester, "--longctx-from=4Ki", "--longctx-to=8Ki", "--longctx-workload=cold,concurrency",
        "--longctx-max-concurrency=4",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    text = result.stdout.str()
    for level in (1, 2, 4):
        assert f"len=8Ki-rep=0-conc={level}" in text and f"len=4Ki-rep=0-conc={level}" in text
    assert "len=8Ki-rep=0-conc=8" not in text
    assert "concurrency points: requests of each length and 32 decode tokens" in text
    assert "blocks/request" in text
    study, _, room = text.partition("then, for the concurrency points, a server with room for 4")
    assert room, text
    assert "--max-num-seqs 1 " in next(line for line in study.splitlines() if "--port" in line)
    assert "--max-num-seqs 4 " in next(line for line in room.splitlines() if "--port" in line)


def test_concurrency_items_are_selected_by_their_mark(pytester: pytest.Pytester) -> None:
    result = _plan(
        pytester, "--longctx-to=1Ki", "--longctx-workload=cold,concurrency",
        "--longctx-max-concurrency=2", "-m", "longctx_concurrency", "-v",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    text = result.stdout.str()
    assert "len=1Ki-rep=0-conc=1" in text and "len=1Ki-rep=0-conc=2" in text
    assert "len=1Ki-rep=0]" not in text, text


def test_the_options_of_the_workload_are_checked(pytester: pytest.Pytester) -> None:
    for args, expected in (
        (
            [WORKLOAD, "--longctx-max-concurrency=0"],
            "*--longctx-max-concurrency=0: expected a whole number >= 1*",
        ),
        (
            [WORKLOAD, "--longctx-max-concurrency=many"],
            "*--longctx-max-concurrency=many: expected a whole number >= 1*",
        ),
        (
            ["--longctx-max-concurrency=4"],
            "*--longctx-max-concurrency=4 applies to the concurrency workload*",
        ),
        (["--longctx-workload=concurrent"], "*expected a comma-separated list of cold*"),
    ):
        result = _plan(pytester, *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        result.stderr.fnmatch_lines([expected])


def test_the_ini_file_sets_the_workload_and_its_highest_level(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nlongctx_workload = concurrency\nlongctx_max_concurrency = 2\n")
    result = _plan(pytester, "--longctx-to=1Ki")
    assert result.ret == 0, result.stdout.str()
    text = result.stdout.str()
    assert "len=1Ki-rep=0-conc=2" in text and "conc=4" not in text
    assert "--max-num-seqs 2 " in text
    pytester.makeini("[pytest]\nlongctx_workload = concurrency\nlongctx_max_concurrency = -1\n")
    bad = _plan(pytester, "--longctx-to=1Ki")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--longctx-max-concurrency=-1: expected a whole number >= 1*"])


def _session(pytester: pytest.Pytester, url: str, *args: str):  # noqa: ANN202
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    root = pytester.path / "reports"
    # The planned fit needs a model's cache layout: cpu-tiny's, one group of full attention
    # like the fake's cache (attached without a profile, a session plans no fit of its own).
    result = pytester.runpytest(
        *fake_session_args(url, root),
        "--longctx-profile=cpu-tiny",
        "--longctx-progress=off",
        "-p",
        "no:randomly",
        *args,
    )
    return result, records_of(root)


def _behaviour(**changes) -> Behaviour:  # noqa: ANN003
    settings = {
        "first_token_delay_s": 0.1,
        "short_first_token_delay_s": 0.02,
        "long_prompt_from": 1000,
        "token_delay_s": 0.02,
        "prompt_tokens_details": True,
    }
    return Behaviour(**{**settings, **changes})


def test_a_session_records_each_level_and_the_lengths_fit(pytester: pytest.Pytester) -> None:
    # Whether the level ran at once is the server's running gauge, read every 50 ms: each
    # request decodes for 0.6 s here, which a loaded host's poll still sees (at 0.16 s a poll
    # once missed both running together)
    with FakeVLLMProcess(_behaviour(token_delay_s=0.08)) as fake:
        result, records = _session(
            pytester, fake.url, "-m", "len==1Ki", WORKLOAD, "--longctx-max-concurrency=2", PLOTS
        )
    result.assert_outcomes(passed=2)
    one, two = records
    assert (one.cache_state, two.cache_state) == ("concurrency", "concurrency")
    assert (one.concurrency_level, two.concurrency_level) == (1, 2)
    assert two.nodeid.endswith("[len=1Ki-rep=0-conc=2]")
    assert two.concurrency["ran_at_once"] is True
    assert len(two.concurrency["requests"]) == 2
    assert two.concurrency["stream_agreement"]["agrees"] is True
    # (how much faster two streams decode together than one alone is for the benchmarks: a
    # busy host delivers a lone stream in a burst, and its rate is the burst's)
    assert two.figures["aggregate_decode_throughput"] > 0
    requests = two.concurrency["requests"]
    assert all(r["completion_tokens"] == requests[0]["completion_tokens"] for r in requests)
    # the fake's cache: 16,384 blocks of 128 tokens, 9 per request of 1Ki + 8 decode
    assert two.concurrency["fit_planned"] == (16_384 - 1) // 9
    assert two.concurrency["fit_vllm"] == pytest.approx(16_384 / 9, rel=1e-3)
    assert two.concurrency["fit_measured_at_least"] == 2
    assert two.concurrency["verdict"].startswith("consistent")
    # each request carried the probe and each answer was judged
    assert (one.fidelity["requests"], two.fidelity["requests"]) == (1, 2)
    assert two.fidelity["verdict"] == "correct" and two.fidelity["correct_requests"] == 2
    folder = run_folder(pytester.path / "reports")
    report = (folder / "report.md").read_text()
    assert "## Concurrency: how many long requests fit at once" in report
    row = next(line for line in report.splitlines() if line.startswith("| 1Ki | 2 | 1 |"))
    assert f"{two.figures['aggregate_decode_throughput']:,.1f}" in row and row.endswith("yes |")
    assert "| 1Ki | 1, 2 | >= 2 |" in report  # nothing failed: the fit is only bounded below
    assert (folder / "concurrency_decode.png").is_file()
    benchmarks = json.loads((folder / "benchmark.json").read_text())["benchmarks"]
    names = {b["param"]: b["group"] for b in benchmarks}
    assert names["len=1Ki-conc=2-aggregate_decode"].startswith("longctx-concurrency ")
    assert names["len=1Ki-conc=1-ttft"].startswith("longctx-concurrency ")
    assert not any(name.startswith("len=1Ki-ttft") for name in names)  # no cold point here
    assert "concurrency: how many long requests fit at once" in result.stdout.str()


def test_an_attached_server_that_cannot_run_a_level_at_once_is_refused(
    pytester: pytest.Pytester,
) -> None:
    with FakeVLLMProcess(_behaviour(max_num_seqs=1)) as fake:
        result, records = _session(
            pytester, fake.url, "-m", "len==1Ki", WORKLOAD, "--longctx-max-concurrency=2"
        )
    result.assert_outcomes(passed=1, failed=1)
    refused = records[-1]
    assert refused.concurrency_level == 2 and refused.failure_class == "refused"
    assert "cannot run 2 requests at once" in refused.reason
    assert "at most 1 ran at once" in refused.reason and "--max-num-seqs 2" in refused.reason


def test_every_request_of_a_level_is_judged_and_a_wrong_one_fails_the_level(
    pytester: pytest.Pytester,
) -> None:
    """The server answers another needle at 2Ki: each of that length's levels fails with
    ``wrong_answer`` and names how many of its requests were wrong; 1Ki's answers are right."""
    with FakeVLLMProcess(_behaviour(wrong_at_lengths=(2048,))) as fake:
        result, records = _session(
            pytester, fake.url, "--longctx-to=2Ki", WORKLOAD, "--longctx-max-concurrency=2"
        )
    result.assert_outcomes(passed=2, failed=2)
    by_point = {(r.length, r.concurrency_level): r for r in records}
    for level in (1, 2):
        right, wrong = by_point[(1024, level)], by_point[(2048, level)]
        assert right.outcome == "passed" and right.fidelity["verdict"] == "correct"
        assert right.fidelity["correct_requests"] == level
        assert wrong.outcome == "failed" and wrong.failure_class == "wrong_answer"
        assert wrong.fidelity["verdict"] == "wrong"
        assert wrong.fidelity["wrong_requests"] == list(range(level))
        assert wrong.fidelity["answer"] != wrong.fidelity["expected"]
        assert wrong.figures["aggregate_decode_throughput"] > 0  # measured all the same
    assert "(2 of 2 requests sent at once; the first, request 0, shown)" in (
        by_point[(2048, 2)].reason
    )


def test_each_request_of_a_level_carries_the_servers_own_timing_in_its_record(
    pytester: pytest.Pytester,
) -> None:
    """A server that times each request: the level's record holds every request's own
    figures beside the client's, its streams are judged request by request, and the report
    sets the level's client and server TTFT side by side."""
    with FakeVLLMProcess(_behaviour(per_request_metrics=True)) as fake:
        result, records = _session(
            pytester, fake.url, "-m", "len==1Ki", WORKLOAD, "--longctx-max-concurrency=2"
        )
    result.assert_outcomes(passed=2)
    two = records[-1]
    timing = two.server_timing
    assert timing["source"] == "per_request"
    assert [entry["index"] for entry in timing["requests"]] == [0, 1]
    client_ttfts = [request["ttft_s"] for request in two.concurrency["requests"]]
    assert [entry["client_ttft_s"] for entry in timing["requests"]] == client_ttfts
    assert all(entry["front_end_s"] > 0 and entry["ttft_s"] >= 0.02 for entry in timing["requests"])
    assert two.concurrency["stream_agreement"]["by"] == "request"
    report = (run_folder(pytester.path / "reports") / "report.md").read_text()
    section = report.split("## Client and server TTFT", 1)[1].split("\n## ", 1)[0]
    assert "| 1Ki concurrency 1 | 1 |" in section and "| 1Ki concurrency 2 | 2 |" in section
