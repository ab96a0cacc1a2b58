"""vLLM's step limit and the grace of an abandoned step, in sessions that launch the stand-in.

The stand-in (``fake_server_main.py``) is right here: what is tested is what the session does
with a server whose engine steps are long (the environment it launches it with, and how long
it waits for a step in progress before it calls the engine stuck), not vLLM. Its steps take
seconds, so the profile's expected TTFT is what plans them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST, launch_fake_conftest, records_of, run_session

from pytest_longctx.profiles.profile import PROFILE_DIR

#: Sessions that launch the stand-in server: run beside the other sessions (make test).
pytestmark = pytest.mark.stand_in


def tiny_profile(pytester: pytest.Pytester, expected_ttft: str, executor: str = "uni") -> Path:
    """The embedded default's profile with an expected TTFT per length and an executor."""
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    text = text.replace("[sweep]\n", f"[sweep]\nexpected_ttft = {expected_ttft}\n")
    text = text.replace('executor = "uni"', f'executor = "{executor}"')
    path = pytester.path / "tiny.toml"
    path.write_text(text)
    return path


def test_a_step_longer_than_vllms_limit_is_planned_for_in_the_launchs_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multiprocessing executor whose 2Ki prompt is one prefill step that the profile
    expects to take 400 s, past vLLM's 300 s: the session launches it with the limit raised,
    and the stand-in, which enforces vLLM's rule (at a scale of seconds: 1 s where the
    variable is unset, standing for 300 s; its 2Ki step takes 1.5 s), measures every point.
    Launched with vLLM's default, its engine dies at 2Ki as vLLM's does."""
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    profile = tiny_profile(pytester, '{ "1Ki" = 100, "2Ki" = 400 }', executor="mp")
    behaviour = {"first_token_delay_s": 1.5, "long_prompt_from": 2048, "prefill_chunk_tokens": 4096}
    stand_in = (f"--behaviour={json.dumps(behaviour)}", "--step-limit-default=1")
    pytester.makeconftest(launch_fake_conftest(*stand_in, keep_env=True))
    result, output = run_session(pytester, f"--longctx-profile={profile}", "--longctx-to=2Ki")
    result.assert_outcomes(passed=2)
    records = records_of(output)
    assert [(r.length, r.outcome, r.server_start["index"]) for r in records] == [
        (1024, "passed", 0),
        (2048, "passed", 0),
    ]
    env = records[1].fingerprint["server_env"]
    assert int(env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]) >= 3 * 300


def test_a_budget_that_runs_out_mid_step_with_sampling_off_waits_out_the_planned_step(
    pytester: pytest.Pytester,
) -> None:
    """2Ki's prefill is one 18 s step (nothing moves in /metrics until it ends, as a chunk
    vLLM computes in one step), progress sampling is off and the 2 s budget runs out: the
    engine drops the request at the step's end, 16 s later. The profile's expected TTFT plans
    that step, so the grace covers it: a timeout, the server kept and 4Ki measured on it, not
    a hang judged after 5 s without a step and a relaunch."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    profile = tiny_profile(pytester, '{ "1Ki" = 4.5, "2Ki" = 18, "4Ki" = 72 }')
    once = pytester.path / "slowed"
    slow = '{"first_token_delay_s": 18, "prefill_chunk_tokens": 4096}'
    pytester.makeconftest(launch_fake_conftest("--slow-at=5", f"--slow={slow}", f"--once={once}"))
    result, output = run_session(
        pytester,
        f"--longctx-profile={profile}",
        "--longctx-to=4Ki",
        "--longctx-ttft-timeout=2",
        "--longctx-progress-interval=0",
    )
    result.assert_outcomes(passed=2, failed=1)
    records = records_of(output)
    assert [(r.outcome, r.failure_class, r.server_start["index"]) for r in records] == [
        ("passed", None, 0),
        ("failed", "timeout", 0),
        ("passed", None, 0),
    ]
    (line,) = records[1].evidence
    assert "two of the point's planned slowest step (18.0 s" in line
    assert "a slow step, not a stuck engine; the server is kept" in line
