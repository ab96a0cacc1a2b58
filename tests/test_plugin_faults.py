"""The whole plugin against a server with exactly known timings and injected faults.

A fake server is right here: these tests are about the instrument itself (what the client and
the plugin make of exact delays, broken streams and dishonest counts), not about vLLM. The
fault is switched on when the first item runs, after the session's warm-up prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import SWEEP_TEST, records_of


@pytest.fixture
def session(pytester: pytest.Pytester, fake_vllm: FakeVLLM):  # noqa: ANN201
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def run(*args: str, **changes: Any):  # noqa: ANN202
        # the warm-up prompts (sent after "ready") see the faultless server
        plugin = _WarmUpFirst(fake_vllm, changes)
        result = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            f"--longctx-url={fake_vllm.url}",
            f"--longctx-output={output}",
            "--longctx-decode-tokens=8",
            *args,
            plugins=[plugin],
        )
        return result, records_of(output)

    return run


@dataclass
class _WarmUpFirst:
    """Switches the fault on after the warm-up requests (the first three completions)."""

    fake: FakeVLLM
    changes: dict[str, Any]

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self.fake.configure(**self.changes)


def test_reported_figures_match_the_injected_timing(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", first_token_delay_s=0.3, token_delay_s=0.02)
    result.assert_outcomes(passed=1)
    (record,) = records
    # TTFT = 0.3 s injected + request handling; decode = 1 / 0.02 s = 50 tok/s
    assert 0.3 <= record.figures["ttft"] < 0.45, record.figures
    assert record.figures["decode_throughput"] == pytest.approx(50, rel=0.15)
    assert record.figures["itl_median"] == pytest.approx(0.02, rel=0.25)
    assert (record.prompt_tokens, record.completion_tokens) == (1024, 8)


def test_first_token_timeout_fails_the_item_and_the_session_goes_on(session) -> None:  # noqa: ANN001
    result, records = session(
        "--longctx-to=2Ki", "--longctx-ttft-timeout=0.5", fault="hang_after_headers"
    )
    result.assert_outcomes(failed=2)
    assert [r.outcome for r in records] == ["failed", "failed"]
    assert all("FirstTokenTimeoutError" in r.reason for r in records)
    assert "--longctx-ttft-timeout" in records[0].reason


def test_error_frame_inside_a_200_stream(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", fault="error_frame", fault_after_tokens=2)
    result.assert_outcomes(failed=1)
    assert "ErrorFrameError" in records[0].reason


def test_truncated_stream(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", fault="truncate", fault_after_tokens=3)
    result.assert_outcomes(failed=1)
    assert "TruncatedStreamError" in records[0].reason


def test_clamped_completion_is_caught(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", tokens=3)
    result.assert_outcomes(failed=1)
    assert "CompletionCountError" in records[0].reason
    assert "asked for 8" in records[0].reason


def test_prompt_longer_than_the_servers_limit(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==2Ki", max_model_len=1500)
    result.assert_outcomes(failed=1)
    assert "PromptTooLongError" in records[0].reason
    assert "1500" in records[0].reason


def test_a_prefix_cache_hit_is_not_a_cold_measurement(session) -> None:  # noqa: ANN001
    result, records = session("-m", "len==1Ki", cached_prompt_tokens=512)
    result.assert_outcomes(failed=1)
    assert "prefix cache served 512 of 1024 prompt tokens" in records[0].reason
    assert records[0].figures["ttft"] > 0  # what was measured is kept with the failure


def test_the_api_key_is_sent_and_never_shown(session, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("FAKE_KEY", "sk-fake-4242")
    result, records = session(
        "-m",
        "len==1Ki",
        "--longctx-api-key-env=FAKE_KEY",
        api_key="sk-fake-4242",
        fault="reject_echoing_auth",
    )
    result.assert_outcomes(failed=1)
    assert "sk-fake-4242" not in result.stdout.str()
    assert "sk-fake-4242" not in records[0].reason
