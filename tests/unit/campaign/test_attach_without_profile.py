"""Attached by URL with no profile chosen: the sweep takes its settings from the server (the
model it serves, its max_model_len, its KV block) and the generic defaults, and says so in the
plan and the records; never the embedded default's (cpu-tiny: 32 decode tokens, lengths to
16Ki, its slow bands, first-token budget and gate tolerances). A profile the user names, on the
command line or in the ini file, is used as before. Against a fake server (real vLLM's own
settings: tests/e2e/test_e2e_attach_without_profile.py).
"""

from __future__ import annotations

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import SWEEP_TEST, records_of, run_folder

from pytest_longctx.profiles import load_profile

#: Unlike anything cpu-tiny says: its model, 1Ki..8Ki with 64 decode tokens (9,000 tokens hold
#: 8Ki + 64, not 16Ki), and a block of 32 tokens.
SERVED = "served-elsewhere"
MAX_MODEL_LEN = 9000
BLOCK = 32


@pytest.fixture
def server(fake_vllm: FakeVLLM) -> FakeVLLM:
    return fake_vllm.configure(model=SERVED, max_model_len=MAX_MODEL_LEN, block_size=BLOCK)


def run(pytester: pytest.Pytester, server: FakeVLLM, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--longctx-url={server.url}",
        f"--longctx-output={pytester.path / 'reports'}",
        "--longctx-plots=off",
        *args,
    )


def test_the_plan_takes_the_servers_settings_and_names_the_generic_defaults(
    pytester: pytest.Pytester, server: FakeVLLM
) -> None:
    result = run(pytester, server, "--longctx-plan")
    text = result.stdout.str()
    assert result.ret == 0, text
    assert (
        f"pytest-longctx plan: profile none (attached, no profile: settings from the server at "
        f"{server.url} (model {SERVED}, max_model_len 9,000, block size {BLOCK}): lengths up "
        "to 8Ki; generic defaults, not a profile's: lengths from 1Ki, 64 decode tokens, 3 "
        "warm-up prompts, a first-token budget of 6 h until a length is measured, the gate's "
        "built-in tolerances)"
    ) in text
    assert "4 item(s), decode 64 tokens per request" in text
    assert [line.strip() for line in text.splitlines() if line.startswith("  len=")] == [
        "len=1Ki-rep=0",
        "len=2Ki-rep=0",
        "len=4Ki-rep=0",
        "len=8Ki-rep=0",  # no slow band: cpu-tiny's marks 8Ki longctx_slow
    ]
    tokens = (16_384 - 1) * BLOCK  # the fake's num_gpu_blocks, its null block aside
    assert (
        f"capacity: the attached server's own: its KV cache holds {tokens:,} tokens "
        f"(vllm:cache_config_info: 16,384 blocks of {BLOCK} tokens)"
    ) in text
    assert "cpu-tiny" not in text
    assert load_profile("cpu-tiny").description not in text


def test_the_records_carry_the_servers_settings_and_the_generic_defaults(
    pytester: pytest.Pytester, server: FakeVLLM
) -> None:
    result = run(pytester, server, "--longctx-to=2Ki")
    result.assert_outcomes(passed=2)
    assert "longctx profile: none: attached, no profile: settings from the server" in (
        result.stdout.str()
    )
    # no profile names a model, so none is another than the served one
    assert "profile none is for" not in result.stdout.str()
    records = records_of(pytester.path / "reports")
    assert [r.length for r in records] == [1024, 2048]
    assert all(r.completion_tokens == 64 for r in records)  # cpu-tiny's: 32
    for record in records:
        fingerprint = record.fingerprint
        assert fingerprint["profile"] is None
        assert fingerprint["decode_tokens"] == 64
        assert fingerprint["settings"] == {
            "source": "attached, no profile: settings from the server",
            "server": {
                "url": server.url,
                "model": SERVED,
                "model_root": SERVED,
                "max_model_len": MAX_MODEL_LEN,
                "block_size": BLOCK,
                "cache_dtype": "auto",
                "kv_cache_tokens": (16_384 - 1) * BLOCK,
                "kv_cache_blocks": 16_384,
            },
            # --longctx-to names the range's top; the rest are the generic defaults
            "generic_defaults": {
                "from_length": 1024,
                "decode_tokens": 64,
                "warmup_prompts": 3,
                "first_token_timeout_s": 6 * 3600.0,
                "tolerance": "the gate's built-in tolerances",
            },
        }
    # the report, which reads only the records, says where the settings came from
    report = (run_folder(pytester.path / "reports") / "report.md").read_text()
    assert "none (attached, no profile: settings from the server)" in report


def test_a_profile_the_ini_file_names_is_used_for_an_attach(
    pytester: pytest.Pytester, server: FakeVLLM
) -> None:
    """The user chose one: the attach measures with it, as with --longctx-profile."""
    pytester.makeini("[pytest]\nlongctx_profile = cpu-tiny\n")
    result = run(pytester, server, "--longctx-plan")
    text = result.stdout.str()
    assert result.ret == 0, text
    assert f"pytest-longctx plan: profile cpu-tiny ({load_profile('cpu-tiny').description})" in text
    assert "decode 32 tokens per request" in text
    assert "settings from the server" not in text


def test_a_server_too_short_for_any_length_is_a_usage_error(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """1,000 tokens hold no prompt of 1Ki: said before anything is sent, with what to do."""
    fake_vllm.configure(max_model_len=1000)
    result = run(pytester, fake_vllm, "--longctx-plan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --longctx-url={fake_vllm.url} (no profile): the server serves at most 1,000 "
            "tokens (max_model_len), which holds no prompt of 1Ki or more with 64 tokens after "
            "it; serve it with a larger --max-model-len, or give --longctx-from/--longctx-to or "
            "a profile (--longctx-profile)"
        ]
    )


def test_a_server_that_does_not_answer_at_plan_time_leaves_the_generic_range(
    pytester: pytest.Pytester,
) -> None:
    """Nothing to take from a server that is not up yet: the plan says so, keeps the generic
    defaults, and its points fail as the server's absence makes them (not a usage error)."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-url=http://127.0.0.1:9",
        "--longctx-to=2Ki",
        "--longctx-plan",
    )
    text = result.stdout.str()
    assert result.ret == 0, text
    assert (
        "pytest-longctx plan: profile none (attached, no profile: the server at "
        "http://127.0.0.1:9 did not answer /v1/models when the plan was made"
    ) in text
    assert "generic defaults, not a profile's: lengths from 1Ki, 64 decode tokens" in text
    assert "2 item(s), decode 64 tokens per request" in text
    assert "cpu-tiny" not in text


def test_xdist_workers_plan_from_the_controllers_answer(
    pytester: pytest.Pytester, server: FakeVLLM
) -> None:
    """Each pytest-xdist worker plans from what the server told the controller: asked again,
    a worker whose question timed out on a busy host would collect another range, which
    pytest-xdist refuses. A worker given the controller's answer asks nothing (the address
    here answers nothing), and a session under xdist measures with it."""
    from longctx_testing import plan_settings

    from pytest_longctx.campaign.attached_settings import session_profile
    from pytest_longctx.profiles import ServerSettings

    told = ServerSettings("http://127.0.0.1:9", model=SERVED, max_model_len=MAX_MODEL_LEN)
    import dataclasses

    settings = plan_settings(profile=None, urls=("http://127.0.0.1:9",))  # nothing listens
    profile = session_profile(settings, dataclasses.asdict(told))
    assert profile.from_server.max_model_len == MAX_MODEL_LEN  # not asked again
    assert profile.sweep.to_length == 8 * 1024

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-n",
        "1",  # a worker per endpoint: one server, one worker
        f"--longctx-url={server.url}",
        f"--longctx-output={pytester.path / 'reports'}",
        "--longctx-plots=off",
        "--longctx-to=2Ki",
    )
    result.assert_outcomes(passed=2)
    records = records_of(pytester.path / "reports")
    assert {r.fingerprint["settings"]["server"]["max_model_len"] for r in records} == {
        MAX_MODEL_LEN
    }
