"""The warm workload's contract: its arithmetic, its messages, and the plugin around it.

The cache-state arithmetic is checked on its own; the plugin against a fake server whose
cache hits are set per item, since these tests are about what the instrument makes of the
counts a server reports (real prefix caching: test_e2e_warm.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import (
    NO_PLOTS,
    PLOTS,
    SWEEP_TEST,
    fake_session_args,
    launch_fake_conftest,
    records_of,
    run_folder,
    run_session,
    schedule_on_two,
)

from pytest_longctx.core.records import Record
from pytest_longctx.measure.cache_state import ServerCache, judge_warm, required_tokens
from pytest_longctx.workloads import points_of

WARM = "--longctx-workload=cold,warm"
LABELS = {
    "block_size": "128",
    "enable_prefix_caching": "True",
    "num_gpu_blocks": "16384",
    "kv_cache_memory_bytes": str(1 << 30),
}


# -- the arithmetic ----------------------------------------------------------------------


def test_the_prefix_must_be_served_to_the_caches_alignment() -> None:
    assert required_tokens(16384, 128) == 16384
    assert required_tokens(16384, 1536) == 15360  # a hybrid aligning coarser than a block
    assert required_tokens(1000, 128) == 896
    assert required_tokens(1000, None) == 1000
    block = ServerCache.from_labels(LABELS)
    assert (block.alignment, block.alignment_source) == (128, "block_size")
    hybrid = ServerCache.from_labels({**LABELS, "cache_hit_alignment_tokens": "1536"})
    assert (hybrid.alignment, hybrid.alignment_source) == (1536, "cache_hit_alignment_tokens")
    # vLLM writes the label as "None" where the engine never resolved it: the block decides
    unset = ServerCache.from_labels({**LABELS, "cache_hit_alignment_tokens": "None"})
    assert unset.alignment == 128
    assert block.block_bytes == 65536  # 1 GiB over 16,384 blocks: 512 B a token
    assert block.resident_bytes(16384) == 16384 * 512
    assert block.resident_bytes(16385) == 16384 * 512 + 65536  # a started block is held whole


def test_resident_kv_from_the_plan_where_the_server_does_not_size_its_cache() -> None:
    """A GPU profile sizes the cache by gpu_memory_utilization: vLLM then exports
    ``kv_cache_memory_bytes="None"``, and the plan's bytes for one request of L tokens at the
    server's block size stand in, saying so."""
    from pytest_longctx.plan import capacity_check
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.workloads.warm import planned_bytes

    served = judge_warm(16384, {"prefix_cache_hits": 16384.0}, ServerCache.from_labels(LABELS), 1)
    tiny = planned_bytes(load_profile("cpu-tiny"))
    assert tiny is not None
    own = served.record(ServerCache.from_labels(LABELS), tiny)
    assert own["resident_kv_bytes"] == 16384 * 512  # the server's figure first
    assert own["resident_kv_source"] == "cache_config_info"
    unsized = ServerCache.from_labels({**LABELS, "kv_cache_memory_bytes": "None"})
    assert unsized.block_bytes is None
    assert "resident_kv_bytes" not in served.record(unsized)  # nothing to say it by
    planned = served.record(unsized, tiny)
    assert planned["resident_kv_bytes"] == 16384 * 512  # cpu-tiny: 512 B a token, 128 a block
    assert planned["resident_kv_source"] == "capacity_plan"
    assert tiny(16385, 128) == 16384 * 512 + 128 * 512  # a started block is held whole
    assert tiny(16385, 16) == 16384 * 512 + 16 * 512  # at the block size the server reports
    h200 = load_profile("kimi-linear-h200")
    assert h200.serving.kv_cache_memory is None  # gpu_memory_utilization sizes its cache
    layout = capacity_check.layout_for(h200)
    assert layout is not None
    hybrid = planned_bytes(h200)
    assert hybrid is not None
    kv, state = layout.request_bytes(16384)
    assert hybrid(16384, None) == kv + state and state > 0  # the linear layers' state too


def test_a_short_hit_says_how_much_by_every_source_and_names_an_eviction() -> None:
    view = {"usage_cached_prompt_tokens": 12288.0, "prefix_cache_hits": 12288.0}
    verdict = judge_warm(16384, view, ServerCache.from_labels(LABELS), prefix_sent_s_ago=2.5)
    assert verdict.served == 12288 and verdict.required == 16384
    assert verdict.problem is not None
    assert verdict.problem.startswith(
        "not warm: the cache served 12,288 of 16,384 prefix tokens (usage 12,288, /metrics "
        "prefix_cache_hits 12,288; all 16,384 needed, on the cache's 128-token alignment)"
    )
    assert "partly evicted (4,096 tokens) between the cold point and this follow-up" in (
        verdict.problem
    )
    assert "2.5 s earlier" in verdict.problem
    gone = judge_warm(16384, {"prefix_cache_hits": 0.0}, ServerCache.from_labels(LABELS), 1.0)
    assert "the prefix was evicted between" in (gone.problem or "")


def test_the_least_source_decides_and_all_must_reach_the_prefix() -> None:
    cache = ServerCache.from_labels(LABELS)
    lagging = {"usage_cached_prompt_tokens": 16384.0, "cached_prompt_tokens": 0.0}
    verdict = judge_warm(16384, lagging, cache, prefix_sent_s_ago=1.0)
    assert verdict.served == 0
    assert "/metrics prompt_tokens_cached 0" in (verdict.problem or "")
    warm = judge_warm(16384, {"usage_cached_prompt_tokens": 16384.0}, cache, 1.0)
    assert warm.problem is None and warm.served == 16384
    coarse = ServerCache.from_labels({**LABELS, "cache_hit_alignment_tokens": "1536"})
    aligned = judge_warm(16384, {"prefix_cache_hits": 15360.0}, coarse, 1.0)
    assert aligned.problem is None  # 15,360 is all a 1536-token alignment can serve
    short = judge_warm(16384, {"prefix_cache_hits": 13824.0}, coarse, 1.0)
    assert "at least 15,360 needed: the prefix rounded down to the cache's 1536-token" in (
        short.problem or ""
    )


def test_a_miss_on_a_server_that_never_saw_the_prefix_is_not_called_an_eviction() -> None:
    verdict = judge_warm(4096, {"prefix_cache_hits": 0.0}, ServerCache.from_labels(LABELS), None)
    assert "never sent to this server before" in (verdict.problem or "")
    assert "evicted" not in (verdict.problem or "")


def test_nothing_to_check_is_no_verdict() -> None:
    verdict = judge_warm(4096, {}, ServerCache.from_labels(None), 1.0)
    assert verdict.problem is None and verdict.served is None


# -- the plugin against the fake ---------------------------------------------------------


@dataclass
class _HitsPerItem:
    """The cache hits each item's request reports: ``warm`` for follow-ups, none for cold."""

    fake: FakeVLLM
    warm: int
    changes: dict

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        cached = self.warm if "-warm=" in item.name else 0
        self.fake.configure(cached_prompt_tokens=cached, **self.changes)


@pytest.fixture
def session(pytester: pytest.Pytester, fake_vllm: FakeVLLM):  # noqa: ANN201
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def run(*args: str, warm: int = 0, **changes):  # noqa: ANN202
        # decoded at a pace the stream check can tell from the client's own overhead; a busy
        # host still delays a stream now and then and flushes it in one burst, which keeps the
        # point with the server's decode figure: the cache is these sessions' subject
        changes.setdefault("token_delay_s", 0.004)
        result = pytester.runpytest(
            *fake_session_args(fake_vllm.url, output),
            "--longctx-progress=off",
            *args,
            plugins=[_HitsPerItem(fake_vllm, warm, changes)],
        )
        return result, records_of(output)

    return run


def _prompts(fake: FakeVLLM) -> list[list[int]]:
    return [
        r.payload["prompt"]
        for r in fake.requests
        if r.path == "/v1/completions" and isinstance(r.payload, dict)
    ]


def test_follow_ups_reuse_the_cold_prompt_exactly_and_pass_when_it_was_served(
    session, fake_vllm: FakeVLLM, pytester: pytest.Pytester
) -> None:  # noqa: ANN001
    result, records = session(
        "-m", "len==1Ki", WARM, "--longctx-warm-questions=2", PLOTS, warm=1024
    )
    result.assert_outcomes(passed=3)
    assert [(r.cache_state, r.question, r.prompt_tokens) for r in records] == [
        ("cold", 0, 1024),
        ("warm", 1, 1280),
        ("warm", 2, 1280),
    ]
    assert records[1].nodeid.endswith("[len=1Ki-rep=0-warm=1]")
    assert records[1].cache["served"] == records[1].cache["required"] == 1024
    assert records[1].cache["sources"] == {
        "usage": 1024,
        "/metrics prompt_tokens_cached": 1024,
        "/metrics prefix_cache_hits": 1024,
    }
    assert records[1].cache["tier"] == "device"
    assert records[1].cache["served_by"] == {"device": 1024}
    cold, first, second = _prompts(fake_vllm)[-3:]
    assert first[:1024] == cold and second[:1024] == cold  # the prefix, token for token
    assert first[1024] != second[1024]  # each question opens with its own nonce
    assert first[1024:] != second[1024:]
    # Each follow-up asks the needle of a key of its own, planted at another depth of the
    # prefix, and is judged like the cold point.
    asked = [(r.fidelity["key"], r.fidelity["verdict"], r.fidelity["needles"]) for r in records]
    assert asked == [("Alice", "correct", 3), ("Bob", "correct", 3), ("Carol", "correct", 3)]
    positions = [r.fidelity["depth"] * (r.prompt_tokens - 1) for r in records]
    assert len({round(p) for p in positions}) == 3 and all(p < 1024 for p in positions)
    assert len({r.fidelity["expected"] for r in records}) == 3
    folder = run_folder(pytester.path / "reports")
    report = (folder / "report.md").read_text()
    assert "## Reuse: questions on a cached prefix" in report
    assert "| 1Ki | 256 | 2 |" in report  # the warm row: its suffix and follow-ups
    assert "| 1Ki | 2 |" in report  # the TTFT per question over 1..2 questions
    page = (folder / "report.html").read_text()
    assert "Reuse: questions on a cached prefix" in page
    assert "--&gt;0 warm 1&lt;" in page  # pytest-html's row of the follow-up says it is warm
    assert (folder / "reuse.png").is_file()
    benchmarks = json.loads((folder / "benchmark.json").read_text())["benchmarks"]
    groups = {b["group"].split()[0]: len(b["stats"]["data"]) for b in benchmarks}
    assert groups == {"longctx": 1, "longctx-warm": 2}  # the two questions: the warm rounds
    assert "reuse: questions on a cached prefix" in result.stdout.str()


def test_a_follow_up_the_cache_served_in_part_fails_with_the_numbers(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", WARM, "--longctx-warm-questions=1", warm=768)
    result.assert_outcomes(passed=1, failed=1)
    reason = records[1].reason
    assert "not warm: the cache served 768 of 1,024 prefix tokens" in reason
    assert "partly evicted (256 tokens) between the cold point and this follow-up" in reason
    assert records[1].figures["ttft"] > 0  # what was measured is kept with the failure
    assert records[1].cache["served"] == 768


@dataclass
class _ConnectorHits:
    """Follow-ups whose prefix the device's cache serves ``device`` tokens of and vLLM's CPU
    offloading (a KV connector, host memory) the rest; cold points served by neither."""

    fake: FakeVLLM
    device: int

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        warm = "-warm=" in item.name
        self.fake.configure(
            kv_connector="host",
            cached_prompt_tokens=self.device if warm else 0,
            external_cached_prompt_tokens=1024 - self.device if warm else 0,
            token_delay_s=0.004,
        )


@pytest.mark.parametrize(
    ("device", "served_by"), [(0, {"host": 1024}), (512, {"device": 512, "host": 512})]
)
def test_a_follow_up_served_from_host_memory_is_warm_and_says_so(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM, device: int, served_by: dict
) -> None:
    """The device's cache evicted the prefix, the host tier kept it: vLLM's
    ``prefix_cache_hits`` counts the device's part only, its connector's counters the rest."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    result = pytester.runpytest(
        *fake_session_args(fake_vllm.url, output),
        "--longctx-progress=off",
        "-m",
        "len==1Ki",
        WARM,
        "--longctx-warm-questions=1",
        plugins=[_ConnectorHits(fake_vllm, device)],
    )
    result.assert_outcomes(passed=2)
    cold, warm = records_of(output)
    assert "tier" not in cold.cache  # nothing served it
    assert warm.cache["served"] == warm.cache["required"] == 1024
    assert warm.cache["tier"] == "host"
    assert warm.cache["served_by"] == served_by
    assert warm.cache["tier_counter"] == "vllm:prompt_tokens_cached_by_source"
    assert warm.cache["sources"]["/metrics prefix_cache_hits + external_prefix_cache_hits"] == 1024
    assert warm.server_metrics["prefix_cache_hits"] == device
    report = (run_folder(output) / "report.md").read_text()
    assert "| 1,024 of 1,024 | host |" in report  # the reuse table's Tier column


def test_a_hit_that_only_usage_reports_is_not_proven(session) -> None:  # noqa: ANN001
    result, records = session(
        "-m", "len==1Ki", WARM, "--longctx-warm-questions=1", warm=1024,
        cached_tokens_in_metrics=False,
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    assert "/metrics prompt_tokens_cached 0" in records[1].reason


def test_a_server_with_prefix_caching_off_refuses_the_follow_ups(session) -> None:  # noqa: ANN001
    result, records = session(
        "-m", "len==1Ki", WARM, "--longctx-warm-questions=2", prefix_caching=False
    )
    result.assert_outcomes(passed=1, failed=2)
    for record in records[1:]:
        assert "not warm: the server's prefix caching is off" in record.reason
        assert "enable_prefix_caching=False" in record.reason


def test_follow_ups_selected_alone_send_their_prefix_first(session, fake_vllm) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", "-k", "warm", WARM, warm=1024)
    result.assert_outcomes(passed=3, deselected=18)  # the other lengths, and cold 1Ki
    assert [r.question for r in records] == [1, 2, 3]
    assert records[0].cache["prefix_sent_by"] == "follow-up"
    assert "prefix_sent_by" not in records[1].cache  # sent once, for the first
    prompts = _prompts(fake_vllm)
    assert [len(p) for p in prompts[-4:]] == [1024, 1280, 1280, 1280]
    assert prompts[-3][:1024] == prompts[-4]


def test_a_follow_up_after_a_relaunch_sends_its_prefix_to_the_new_server(
    pytester: pytest.Pytester,
) -> None:
    """The stand-in caches prefixes as vLLM does and dies during the first follow-up (its
    fifth completion, after three warm-ups and the cold point): the relaunched server holds no
    prefix, so the next follow-up sends it first and is warm, not an eviction."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    stand_in = ("--die-at=5", "--exit-code=-9", f"--once={pytester.path / 'died'}")
    behaviour = json.dumps({"prefix_cache": True, "token_delay_s": 0.004})
    pytester.makeconftest(launch_fake_conftest(*stand_in, f"--behaviour={behaviour}"))
    result, output = run_session(
        pytester, "-m", "len==1Ki", WARM, "--longctx-warm-questions=2", "--longctx-progress=off"
    )
    result.assert_outcomes(passed=2, failed=1)
    records = records_of(output)
    points = [(r.outcome, r.failure_class, r.server_start["index"]) for r in records]
    assert points == [("passed", None, 0), ("failed", "engine_died", 0), ("passed", None, 1)]
    assert [r.question for r in records] == [0, 1, 2]
    after = records[2]
    assert after.cache["prefix_sent_by"] == "follow-up"  # the new server had none of it
    assert after.cache["served"] == after.cache["required"] == 1024
    # the stand-in, like a GPU server, does not export its cache's size: the plan's figure
    assert after.cache["resident_kv_bytes"] == 1024 * 512
    assert after.cache["resident_kv_source"] == "capacity_plan"


def test_resume_measures_the_cold_point_again_before_its_missing_follow_ups(
    session,  # noqa: ANN001
) -> None:
    result, records = session("-m", "len==1Ki", WARM, "--longctx-warm-questions=1", warm=0)
    result.assert_outcomes(passed=1, failed=1)
    result, records = session(
        "-m", "len==1Ki", WARM, "--longctx-warm-questions=1", "--longctx-resume", warm=1024
    )
    result.assert_outcomes(passed=2)
    assert [(r.question, r.outcome) for r in records] == [
        (0, "passed"),
        (1, "failed"),
        (0, "passed"),  # measured again: the new server's cache needs its prefix
        (1, "passed"),
    ]
    assert "prefix_sent_by" not in records[-1].cache


def test_options_of_the_workload_are_checked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    for args, expected in (
        (["--longctx-workload=warm"], "*--longctx-workload=warm: expected a comma-sep*(warm ne*"),
        (["--longctx-workload=hot"], "*--longctx-workload=hot: expected a comma-separated list*"),
        ([WARM, "--longctx-prompt-format=text"], "*needs --longctx-prompt-format=ids*"),
        ([WARM, "--longctx-warm-suffix=8"], "*--longctx-warm-suffix=8: expected a size of at*"),
        ([WARM, "--longctx-warm-questions=0"], "*--longctx-warm-questions=0: expected a whole*"),
        (
            ["--longctx-warm-questions=2"],
            "*--longctx-warm-questions=2 applies to the warm workload, which this session does "
            "not measure: add warm to --longctx-workload (e.g. --longctx-workload=cold,warm*",
        ),
        (
            ["--longctx-workload=cold,interference", "--longctx-warm-suffix=512"],
            "*--longctx-warm-suffix=512 applies to the warm workload*",
        ),
    ):
        result = pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        result.stderr.fnmatch_lines([expected])


def test_the_ini_files_warm_keys_need_a_warm_workload_somewhere(
    pytester: pytest.Pytester,
) -> None:
    """Keys of the warm workload in an ini file that measures no warm points are a mistake;
    with the workload in the ini file they hold, and a command line that measures another
    workload for one session leaves them unused; a command line that adds warm uses them."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    collect = ("-p", "no:cacheprovider", "--collect-only", "-q", "--longctx-to=1Ki")

    def items(*args: str) -> list[str]:
        result = pytester.runpytest(*collect, *args)
        assert result.ret == 0, result.stderr.str()
        return [line.split("[")[-1] for line in result.stdout.lines if "::" in line]

    pytester.makeini("[pytest]\nlongctx_warm_questions = 2\n")
    alone = pytester.runpytest(*collect)
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    expected = "*longctx_warm_questions = 2 (ini file) applies to the warm workload, which this "
    alone.stderr.fnmatch_lines([expected + "session does not measure: add warm to --longctx-wo*"])
    two = ["len=1Ki-rep=0]", "len=1Ki-rep=0-warm=1]", "len=1Ki-rep=0-warm=2]"]
    assert items(WARM) == two  # the command line adds the workload the keys are for
    pytester.makeini(
        "[pytest]\nlongctx_workload = cold,warm\nlongctx_warm_questions = 2\n"
        "longctx_warm_suffix = 512\n"
    )
    assert items() == two
    assert items("--longctx-workload=cold") == ["len=1Ki-rep=0]"]  # one cold session
    overridden = pytester.runpytest(*collect, "--longctx-workload=cold", "--longctx-warm-suffix=64")
    assert overridden.ret == pytest.ExitCode.USAGE_ERROR  # given here, for a cold session
    overridden.stderr.fnmatch_lines(["*--longctx-warm-suffix=64 applies to the warm workload*"])


def test_the_plan_shows_the_warm_items_and_a_cold_run_is_unchanged(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    cold = pytester.runpytest("-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=2Ki")
    assert cold.ret == 0
    text = cold.stdout.str()
    assert "--max-model-len 2080 " in text  # 2Ki + 32 decode, as before
    assert "--enable-prompt-tokens-details" not in text
    assert "-warm=" not in text and "workload" not in text
    assert "fidelity probe (tokens)" in text and "more needle" not in text
    warm = pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=2Ki", WARM,
        "--longctx-warm-questions=2", "--longctx-warm-suffix=512", "-m", "len<=1Ki or rep==0",
    )  # fmt: skip
    assert warm.ret == 0
    warm.stdout.fnmatch_lines(
        [
            "6 item(s)*",
            "workload cold,warm: 2 follow-up(s) after each cold point, each its prompt exactly "
            "+ 512 new tokens*",
            "  len=1Ki-rep=0",
            "  len=1Ki-rep=0-warm=1",
            "  len=1Ki-rep=0-warm=2",
            "  len=2Ki-rep=0",
            "  len=2Ki-rep=0-warm=1",
            "  len=2Ki-rep=0-warm=2",
            "*--max-model-len 2592 *--enable-prompt-tokens-details*",  # 2Ki + 512 + 32
            "2Ki * 2,592 *",  # the capacity plan counts the suffix
        ]
    )
    assert (
        "a cold prompt holds 2 more needle(s) under other keys (Bob, Carol) at other depths, "
        "each asked by a warm follow-up" in warm.stdout.str()
    )
    only_cold = pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", "--longctx-to=2Ki", WARM, "-k", "not warm"
    )
    only_cold.stdout.fnmatch_lines(
        [
            "2 item(s)*",
            "workload cold,warm: *; no follow-up selected: the server and the capacity plan are "
            "a cold run's",
            "*--max-model-len 2080 *",  # no follow-up selected: a cold run's server
            "2Ki * 2,080 *",
        ]
    )
    assert "--enable-prompt-tokens-details" not in only_cold.stdout.str()


#: Each launching session notes the vLLM command it built (before the stand-in replaces it).
NOTE_COMMAND = """
import json as _json, os as _os
_launch_stand_in = pytest_longctx_server_command

def pytest_longctx_server_command(config, plan, command):
    name = _os.environ.get("PYTEST_XDIST_WORKER", "serial")
    with open({folder!r} + f"/command-{{name}}.json", "w") as out:
        _json.dump(list(command.argv), out)
    return _launch_stand_in(config, plan, command)
"""


def test_workers_that_measure_no_follow_up_launch_a_cold_runs_server(
    pytester: pytest.Pytester,
) -> None:
    """``-k "not warm"`` under pytest-xdist: every worker sizes the server it launches from
    the selected points, so none asks for the suffix's room or the usage details."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    notes = pytester.path / "commands"
    notes.mkdir()
    pytester.makeconftest(launch_fake_conftest() + NOTE_COMMAND.format(folder=str(notes)))
    result, output = run_session(
        pytester, "-n", "2", "--longctx-to=2Ki", WARM, "-k", "not warm", "--longctx-progress=off"
    )
    result.assert_outcomes(passed=2)
    assert sorted(r.length for r in records_of(output)) == [1024, 2048]
    commands = {path.stem: json.loads(path.read_text()) for path in notes.iterdir()}
    assert sorted(commands) == ["command-gw0", "command-gw1"]
    for argv in commands.values():
        assert argv[argv.index("--max-model-len") + 1] == "2080"  # 2Ki + 32 decode
        assert "--enable-prompt-tokens-details" not in argv


def test_a_cold_point_and_its_follow_ups_go_to_one_worker_together(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-to=4Ki", WARM)
    from pytest_longctx.session.activation import PREPARED_KEY

    run = config.stash[PREPARED_KEY].run
    collection = [f"test_sweep.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    scheduler, a, b, handed_out = schedule_on_two(config, run, collection)

    def names(indices: list[int]) -> list[str]:
        return [collection[i].split("[")[-1].rstrip("]") for i in indices]

    four = ["len=4Ki-rep=0", *(f"len=4Ki-rep=0-warm={q}" for q in (1, 2, 3))]
    assert names(a.sent) == four + [
        "len=1Ki-rep=0",
        *(f"len=1Ki-rep=0-warm={q}" for q in (1, 2, 3)),
    ]
    assert names(b.sent) == ["len=2Ki-rep=0", *(f"len=2Ki-rep=0-warm={q}" for q in (1, 2, 3))]
    while scheduler.has_pending or any(scheduler.node2pending.values()):
        for node in (a, b):
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0])
    assert sorted(handed_out) == list(range(len(collection)))


# -- the gate ----------------------------------------------------------------------------


def _record(run_id: str, repeat: int, ttft: float, question: int = 0) -> Record:
    warm = {"cache_state": "warm", "cache": {"question": question, "suffix_tokens": 256}}
    return Record(
        run_id=run_id,
        nodeid=f"t[len=4Ki-rep={repeat}" + (f"-warm={question}]" if question else "]"),
        length=4096,
        repeat=repeat,
        outcome="passed",
        figures={"ttft": ttft},
        **(warm if question else {}),
    )


def _session(run_id: str, cold: float, warm: float) -> list[Record]:
    records = []
    for repeat, jitter in enumerate((0.99, 1.01)):
        records.append(_record(run_id, repeat, cold * jitter))
        records += [_record(run_id, repeat, warm * jitter, q) for q in (1, 2)]
    return records


def test_the_gate_compares_warm_points_with_warm_baseline_points_only() -> None:
    from pytest_longctx.gate import compare

    baseline = _session("base", cold=1.0, warm=0.1)
    slower_warm = compare(baseline, _session("now", cold=1.0, warm=0.2)).for_length(4096)
    assert slower_warm is not None and slower_warm.status == "regressed"
    verdicts = {v.metric: v for v in slower_warm.verdicts}
    assert verdicts["ttft"].status == "ok"  # the cold figure alone: warm ones never mix in
    assert verdicts["ttft"].current is not None and verdicts["ttft"].current.n == 2
    assert verdicts["warm_ttft"].status == "regressed"
    assert verdicts["warm_ttft"].message.startswith("warm TTFT at 4Ki regressed")
    assert verdicts["warm_ttft"].current is not None and verdicts["warm_ttft"].current.n == 4
    # a warm run against a cold-only baseline gates its cold points, and no warm against cold
    cold_only = [r for r in baseline if not r.warm]
    against_cold = compare(cold_only, _session("now", cold=1.0, warm=0.9)).for_length(4096)
    assert against_cold is not None and against_cold.status == "ok"
    assert {v.metric for v in against_cold.verdicts} == {"ttft"}


def test_compare_lays_warm_ttft_beside_and_apart_from_the_cold(tmp_path) -> None:  # noqa: ANN001
    """Two runs whose cold prefills match and whose follow-ups take twice as long in the
    second: compare's warm table says so, and its cold table reads the cold points alone."""
    from fabricated_runs import write_records

    from pytest_longctx.reporting.run_comparison import ComparedRun, compare_runs, write_comparison

    runs = []
    for run_id, warm in (("warm-fast", 0.1), ("warm-slow", 0.2)):
        runs.append(tmp_path / run_id)
        write_records(runs[-1] / "results.jsonl", _session(run_id, cold=1.0, warm=warm))
    write_comparison(runs, tmp_path / "compared")
    markdown = (tmp_path / "compared" / "compare.md").read_text()
    cold_part, warm_part = markdown.split("## warm TTFT (s)")
    assert "1. `warm-fast` (6 passed points)" in cold_part

    def row(section: str) -> list[str]:
        line = next(line for line in section.splitlines() if line.startswith("| 4Ki |"))
        return [cell.strip() for cell in line.strip("|").split("|")]

    ttft = row(cold_part.split("## TTFT (s)")[1])
    assert ttft[1].startswith("1.0000 ± ") and ttft[1].endswith("(n=2)") and ttft[3] == "x1.000"
    warm = row(warm_part)
    assert warm[1].startswith("0.1000 ± ") and warm[1].endswith("(n=4)")  # 2 questions x 2
    assert warm[2].startswith("0.2000 ± ")
    assert warm[3] == "x2.000" and warm[4].startswith("worse (p=")
    assert "warm TTFT" in (tmp_path / "compared" / "compare.html").read_text()
    cold = [ComparedRun(i, tuple(r for r in _session(i, 1.0, 0.1) if not r.warm)) for i in "ab"]
    assert "warm_ttft" not in compare_runs(cold).cells  # no warm table for cold-only runs


def test_the_gate_section_shows_warm_ttft_only_for_runs_with_warm_points() -> None:
    from pytest_longctx.reporting import gate_report

    baseline = _session("base", cold=1.0, warm=0.1)
    view = gate_report.build_view(baseline, _session("now", cold=1.0, warm=0.2))
    assert view.metric_names == ("ttft", "decode", "itl", "warm_ttft")
    row = view.rows[0]
    assert row.metrics["ttft"].current is not None and row.metrics["ttft"].current.n == 2
    assert row.metrics["warm_ttft"].current is not None
    assert row.metrics["warm_ttft"].current.mean == pytest.approx(0.2)
    assert "Warm TTFT now (s)" in gate_report.table_header(view)
    cold = [r for r in baseline if not r.warm]
    assert gate_report.build_view(cold, cold).metric_names == ("ttft", "decode", "itl")


def test_an_attached_servers_limit_counts_the_suffix(session, fake_vllm) -> None:  # noqa: ANN001
    fake_vllm.configure(max_model_len=1100)  # /v1/models says so from the start
    # the range given: from this limit alone, no length holds a follow-up (a usage error)
    result, records = session("--longctx-to=1Ki", WARM, "--longctx-warm-questions=1", warm=1024)
    result.assert_outcomes(passed=1, failed=1)
    assert (
        "serves at most 1100 tokens (max_model_len); this point needs 1024 + 256 suffix + 8 "
        "decode" in records[1].reason
    )


def test_the_progress_line_says_a_point_is_warm() -> None:
    from pytest_longctx.progress.state import PREFILL, ProgressState

    state = ProgressState(
        "run", PREFILL, length=16384, repeat=0, question=2, index=7, of=8, elapsed_s=0.2
    )
    line = state.line()
    assert line.startswith("longctx 16Ki rep 0 warm 2 [7/8] | ")
    assert "warm: prefix cached, prefilling the new tokens" in line
    assert "prefilled" not in line  # the cold point's KV-gauge count does not apply
    cold = ProgressState("run", PREFILL, length=16384, repeat=0, prefilled=4096, elapsed_s=1.0)
    assert "warm" not in cold.line() and "4,096/16,384 prefilled" in cold.line()


def test_under_xdist_each_follow_up_runs_on_its_cold_points_server(
    pytester: pytest.Pytester,
) -> None:
    """Two servers that cache prefixes as vLLM does: a follow-up sent to the other server
    would find nothing cached there and have to send its prefix itself."""
    from fake_vllm import Behaviour

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"
    behaviour = Behaviour(prefix_cache=True, token_delay_s=0.004)
    with FakeVLLM(behaviour) as one, FakeVLLM(behaviour) as two:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-n", "2", f"--longctx-url={one.url},{two.url}",
            f"--longctx-output={output}", "--longctx-decode-tokens=8", "--longctx-to=4Ki",
            WARM, "--longctx-warm-questions=2", "--longctx-progress=off", NO_PLOTS,
        )  # fmt: skip
    result.assert_outcomes(passed=9)
    records = records_of(output)
    server = {(r.length, r.question): r.fingerprint["server"]["endpoint"] for r in records}
    assert len(set(server.values())) == 2  # both servers measured
    for record in records:
        assert server[(record.length, record.question)] == server[(record.length, 0)]
        if record.warm:
            assert "prefix_sent_by" not in record.cache  # its cold point's prefix was there
            assert record.cache["served"] == record.length
