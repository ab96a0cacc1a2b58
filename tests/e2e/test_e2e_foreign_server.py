"""Against a server unlike the embedded one: another architecture, a tokenizer that splits text
finely, and a KV block of 32 tokens (a GPU's default is 16), attached by URL.

Cold: every point is a cold prefill on that block size. Alone: a point another client's
request shared the server with fails. True: the records describe the model that was served,
not the profile's. Wrong: its weights are random, so it answers the fidelity probe (its
tokenizer has the needle vocabulary) wrongly at every point, the probe's negative control:
the default mode learns that from the warm-up and keeps every point, ``check`` fails them all.
"""

from __future__ import annotations

import json

import httpx
import pytest
from longctx_testing import PLOTS, fine_grained_qwen_spec, records_of, run_folder, run_session

from pytest_longctx.profiles.embedded_models import default_models_dir

pytestmark = pytest.mark.vllm

#: The model's weights are random: its answers to the fidelity probe are recorded, not checked.
RECORD_ANSWERS = "--longctx-fidelity=record"

#: The readable tag every prompt of a run used to open with.
OLD_HEADER = "Run 20261130T120000Z-0a1b2c, prompt of 1024 tokens, pass 0.\n"

#: Another client's request between the /metrics reads around each measured one.
SECOND_CLIENT = """
import httpx
from pytest_longctx import client
measure = client.CompletionClient.measure

def measure_beside_another_client(self, request, *args, **kwargs):
    if request.decode_tokens == 32:  # the measured points, not the warm-up
        httpx.post(
            self.base_url + "/v1/completions",
            json={"model": request.model, "prompt": [5, 6, 7, 8], "max_tokens": 2},
            timeout=120,
        ).raise_for_status()
    return measure(self, request, *args, **kwargs)

client.CompletionClient.measure = measure_beside_another_client
"""


def test_every_point_is_cold_on_a_32_token_block(
    sweep_dir: pytest.Pytester, foreign_model_url: str
) -> None:
    # The premise: with this tokenizer the run-wide words alone fill a 32-token block.
    tokens = httpx.post(
        f"{foreign_model_url}/tokenize",
        json={"prompt": OLD_HEADER, "add_special_tokens": False},
        timeout=60,
    ).json()["tokens"]
    assert len(tokens) > 32

    result, output = run_session(
        sweep_dir, "--longctx-to=4Ki", "--longctx-repeats=2", RECORD_ANSWERS, url=foreign_model_url
    )
    result.assert_outcomes(passed=6)
    records = records_of(output)
    for record in records:
        assert record.server_metrics["prefix_cache_hits"] == 0, record
        assert record.server_metrics["prefix_cache_queries"] >= record.length
        assert record.server_metrics["requests"] == 1
    # The negative control: random weights pass the probe nowhere, at six depths.
    verdicts = [(r.fidelity["verdict"], r.fidelity["kind"], r.fidelity["mode"]) for r in records]
    assert verdicts == [("wrong", "tokens", "record")] * 6, [r.fidelity for r in records]
    assert len({r.fidelity["depth"] for r in records}) == 6


def test_another_clients_request_during_a_point_fails_it(
    sweep_dir: pytest.Pytester, foreign_model_url: str
) -> None:
    sweep_dir.makeconftest(SECOND_CLIENT)
    result, output = run_session(
        sweep_dir, "--longctx-to=2Ki", RECORD_ANSWERS, url=foreign_model_url
    )
    result.assert_outcomes(failed=2)
    for record in records_of(output):
        assert "the server served 2 requests during this point" in record.reason
        assert record.figures["ttft"] > 0  # the figures are kept with the failure


def test_the_records_describe_the_served_model_not_the_profile(
    sweep_dir: pytest.Pytester, foreign_model_url: str
) -> None:
    """Attached with cpu-tiny's profile (a Llama) to a Qwen2 server."""
    folder = default_models_dir() / fine_grained_qwen_spec().folder_name
    result, output = run_session(
        sweep_dir, "-m", "len==1Ki", RECORD_ANSWERS, PLOTS, url=foreign_model_url
    )
    result.assert_outcomes(passed=1)
    (record,) = records_of(output)
    fingerprint = record.fingerprint
    assert fingerprint["profile"] == "cpu-tiny"
    assert fingerprint["served_model_name"] == "tiny-qwen-fine"
    assert fingerprint["model"] == str(folder)
    assert fingerprint["model_described_by"] == "the server's model folder"
    assert fingerprint["revision"] == folder.name  # the generated folder is named by its spec
    assert fingerprint["architecture"] == "Qwen2ForCausalLM"
    assert fingerprint["kv_plot"]["config"]["model_type"] == "qwen2"
    assert fingerprint["kv_plot"]["cache_dtype"] == "auto"
    assert fingerprint["vllm_version"]
    assert fingerprint["max_model_len"] == 40_000
    run_dir = run_folder(output)
    assert (run_dir / "kv_cache.png").is_file()
    assert "llama" not in json.dumps(fingerprint).lower()


def test_the_default_mode_keeps_every_point_of_a_model_that_does_not_answer_the_probe(
    sweep_dir: pytest.Pytester, foreign_model_url: str
) -> None:
    """A random-weight model attached by URL with the default options (the issue's case on
    a shared server rather than a random tiny-llama of its own: the same needle vocabulary and
    the same '▁is▁is▁is' for an answer). Its warm-up shows it does not answer the probe, so
    every point passes with its figures, its answers not checked, the reason said once."""
    result, output = run_session(
        sweep_dir,
        "--longctx-to=2Ki",
        "--longctx-repeats=2",
        url=foreign_model_url,
        shared_profile=False,  # no profile: the server's settings
    )
    result.assert_outcomes(passed=4)
    records = records_of(output)
    assert {r.fingerprint["profile"] for r in records} == {None}
    assert "profile none is for" not in result.stdout.str()  # no profile names a model
    assert {r.fidelity["verdict"] for r in records} == {"not_checked"}, records[0].fidelity
    assert {r.fidelity["answered"] for r in records} == {"wrong"}
    assert all(r.figures["ttft"] > 0 and r.figures["decode_throughput"] > 0 for r in records)
    (reason,) = {r.fidelity["reason"] for r in records}
    assert reason.startswith(
        "the served model tiny-qwen-fine did not answer the fidelity probe in the warm-up at "
        "1Ki tokens (0 of 1 right; expected "
    ), reason
    output_text = result.stdout.str()
    assert output_text.count(reason) == 1
    assert f"fidelity not checked at 4 point(s): {reason}" in output_text
    report = (run_folder(output) / "report.md").read_text()
    assert f"- Not checked at 4 point(s): {reason}" in report


def test_check_fails_every_point_of_a_model_that_does_not_answer_the_probe(
    sweep_dir: pytest.Pytester, foreign_model_url: str
) -> None:
    """The same server with ``check``, and a profile for another model (cpu-tiny, whose model
    is tiny-llama) named: the session says the models differ, its records describe the served
    one, and every wrong answer fails its point with the figures kept."""
    result, output = run_session(
        sweep_dir,
        "--longctx-to=2Ki",
        "--longctx-profile=cpu-tiny",
        "--longctx-fidelity=check",
        url=foreign_model_url,
    )
    result.assert_outcomes(failed=2)
    records = records_of(output)
    assert {r.failure_class for r in records} == {"wrong_answer"}
    assert all(r.figures["ttft"] > 0 for r in records)
    assert {r.fingerprint["model_described_by"] for r in records} == {"the server's model folder"}
    result.stdout.fnmatch_lines(
        ["pytest-longctx: profile cpu-tiny is for tiny-llama; the server serves tiny-qwen-fine *"]
    )
