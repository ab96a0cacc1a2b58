"""Profiles' parallel layouts: strict keys, DCP, and the layouts vLLM refuses (no GPU needed)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST

from pytest_longctx.capacity import GIB, ParallelLayoutError, capacity_table
from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import ProfileError, load_profile
from pytest_longctx.profiles.extra_args import MAMBA_DTYPES, cache_flags
from pytest_longctx.serving.vllm_command import build_server_command

pytestmark = pytest.mark.oracle

MI = 1024**2
H200 = Path(load_profile("kimi-linear-h200").path)


def variant(tmp_path: Path, old: str, new: str, source: Path = H200) -> Path:
    text = source.read_text()
    assert old in text, old
    path = tmp_path / "mine.toml"
    path.write_text(text.replace(old, new, 1))
    # The shipped config copy is looked up beside the profile, then in the package's data.
    return path


@pytest.mark.parametrize(
    ("old", "new", "table", "key", "hint"),
    [
        (
            "tensor_parallel_size = 8",
            "tensor_paralel_size = 8",
            "[serving]",
            "tensor_paralel_size",
            "tensor_parallel_size",
        ),
        ("[sweep]\nfrom", "[sweep]\nfrm", "[sweep]", "frm", "from"),
        ("[hardware]", "[hardwar]", "top level: table", "hardwar", "hardware"),
        (
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
            'VLLM_ALLOW_LONG_MAX_MODEL_LEN = "1"\n[serving.envv]\nX',
            "[serving]",
            "envv",
            "env",
        ),
    ],
)
def test_unknown_keys_are_refused_with_the_closest_known_one(
    tmp_path: Path, old: str, new: str, table: str, key: str, hint: str
) -> None:
    path = variant(tmp_path, old, new)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert str(path) in message
    assert f"{table} {key!r} is not a known key" in message
    assert f"did you mean `{hint}`?" in message


def test_free_form_tables_take_any_key(tmp_path: Path) -> None:
    path = variant(tmp_path, "[serving.env]", '[serving.env]\nANY_NAME_AT_ALL = "1"')
    assert load_profile(str(path)).serving.env["ANY_NAME_AT_ALL"] == "1"


def test_dcp_reaches_vllms_command_line() -> None:
    profile = load_profile("kimi-linear-h200-dcp8")
    assert profile.serving.decode_context_parallel_size == 8
    argv = build_server_command(
        profile, model_path="m", tokenizer_path=None, max_model_len=64 * MI + 1024, port=1
    ).argv
    assert argv[argv.index("--decode-context-parallel-size") + 1] == "8"
    assert "--no-enable-prefix-caching" in argv
    # Without DCP no flag is written: vLLM's default applies.
    plain = build_server_command(
        load_profile("kimi-linear-h200"),
        model_path="m",
        tokenizer_path=None,
        max_model_len=1024,
        port=1,
    ).argv
    assert "--decode-context-parallel-size" not in plain


def test_dcp_profile_command_parses_with_vllms_parser() -> None:
    import subprocess

    profile = load_profile("kimi-linear-h200-dcp8")
    argv = build_server_command(
        profile,
        model_path="m",
        tokenizer_path=None,
        max_model_len=64 * MI + 1024,
        port=1,
        entry=(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
    ).argv[3:]
    code = (
        "import sys, json\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "ns = parser.parse_args(sys.argv[1:])\n"
        "spelt = parser.parse_args(['--tensor_parallel_size', '3', '--block_size=32'])\n"
        "cut = parser.parse_args(['--tensor-parallel', '5'])\n"
        "print(json.dumps([ns.decode_context_parallel_size, ns.tensor_parallel_size,"
        " ns.enable_prefix_caching, spelt.tensor_parallel_size, spelt.block_size,"
        " cut.tensor_parallel_size,"
        " parser._option_string_actions['--mamba-ssm-cache-dtype'].choices,"
        " parser._option_string_actions['--mamba-cache-dtype'].choices]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dcp, tp, prefix, spelt_tp, spelt_block, cut_tp, ssm, conv = json.loads(
        done.stdout.splitlines()[-1]
    )
    assert (dcp, tp, prefix) == (8, 8, False)
    # vLLM's parser reads underscores as dashes and takes a flag's leading part for the
    # flag: the reasons extra_args reads and refuses those spellings too.
    assert (spelt_tp, spelt_block, cut_tp) == (3, 32, 5)
    assert sorted(ssm) == sorted(conv) == sorted(MAMBA_DTYPES)


def test_the_dcp_profile_reaches_64mi_on_one_h200_node() -> None:
    profile = load_profile("kimi-linear-h200-dcp8")
    assert (profile.sweep.to_length, profile.hardware.devices, profile.hardware.nodes) == (
        64 * MI,
        8,
        1,
    )
    layout = capacity_check.layout_for(profile)
    rows = capacity_table(layout, capacity_check.hardware_for(profile), [32 * MI, 64 * MI], 1024)
    assert all(row.fits for row in rows)
    # 7 MLA layers x 576 B over 8 DCP ranks: 504 B per token per rank, 31.5 GiB at 64Mi.
    assert rows[-1].kv_bytes / GIB == pytest.approx(31.5, abs=0.01)


def test_the_tp_only_h200_profile_names_dcp_for_64mi(tmp_path: Path) -> None:
    """The suggestion is one the plan accepts: a hybrid under DCP needs prefix caching off,
    so the suggestion says so, and the profile it describes fits 64Mi with the need it said."""
    profile = load_profile("kimi-linear-h200")
    layout = capacity_check.layout_for(profile)
    (row,) = capacity_table(layout, capacity_check.hardware_for(profile), [64 * MI], 1024)
    assert not row.fits
    said = re.fullmatch(
        r"decode_context_parallel_size = (\d+) with (--no-enable-prefix-caching) \(the KV "
        r"cache sharded over \1 ranks\) would need ([\d.]+) GiB of [\d.]+ GiB per rank "
        r"\(= 8: ([\d.]+) GiB\)",
        row.suggestion,
    )
    assert said, row.suggestion
    dcp, flag, need, widest = said.groups()
    assert (dcp, widest) == ("4", "42.16")
    followed = variant(
        tmp_path,
        "max_num_seqs = 1",
        f'max_num_seqs = 1\ndecode_context_parallel_size = {dcp}\nextra_args = ["{flag}"]',
    )
    mine = load_profile(str(followed))
    layout = capacity_check.layout_for(mine)
    (row,) = capacity_table(layout, capacity_check.hardware_for(mine), [64 * MI], 1024)
    assert row.fits
    assert f"{row.need_gib:.2f}" == need


@pytest.mark.parametrize(
    ("flag", "key"),
    [
        ("--tensor-parallel-size", "tensor_parallel_size"),
        ("-dcp", "decode_context_parallel_size"),
        ("--kv-cache-dtype", "kv_cache_dtype"),
    ],
)
def test_parallel_flags_in_extra_args_are_refused(tmp_path: Path, flag: str, key: str) -> None:
    path = variant(tmp_path, "max_num_seqs = 1", f'max_num_seqs = 1\nextra_args = ["{flag}", "4"]')
    profile = load_profile(str(path))
    with pytest.raises(ProfileError, match=f"set \\[serving\\] {key} instead"):
        build_server_command(profile, model_path="m", tokenizer_path=None, max_model_len=1, port=1)
    with pytest.raises(ProfileError, match=str(path)):
        capacity_check.layout_for(profile)


def test_cache_flags_in_extra_args_are_read_by_the_plan(tmp_path: Path) -> None:
    path = variant(
        tmp_path,
        "max_num_seqs = 1",
        'max_num_seqs = 1\nextra_args = ["--block-size=128", "--no-enable-prefix-caching"]',
    )
    profile = load_profile(str(path))
    flags = cache_flags(profile.serving)
    assert (flags.block_size, flags.prefix_caching) == (128, False)
    layout = capacity_check.layout_for(profile)
    assert layout.allocation.settings.mamba_cache_mode == "none"
    # Kimi's state page still needs 512-token blocks at FP8: the flag only sets the floor.
    assert layout.allocation.block_size == 512


def test_a_hybrid_under_dcp_needs_prefix_caching_off(tmp_path: Path) -> None:
    path = variant(
        tmp_path,
        "tensor_parallel_size = 8",
        "tensor_parallel_size = 8\ndecode_context_parallel_size = 8",
    )
    with pytest.raises(ParallelLayoutError, match="--no-enable-prefix-caching"):
        capacity_check.layout_for(load_profile(str(path)))


def test_a_reserve_per_device_counts_against_every_point(tmp_path: Path) -> None:
    """64Mi on the DCP=8 profile needs 42.16 GiB of 133.38; a 100 GiB reserve leaves 91.2."""
    from pytest_longctx.plan.points import SweepPlan

    path = variant(
        tmp_path,
        "memory_per_device = 150_754_820_096",
        'memory_per_device = 150_754_820_096\nreserve_per_device = "100Gi"',
        Path(load_profile("kimi-linear-h200-dcp8").path),
    )
    profile = load_profile(str(path))
    assert profile.hardware.reserve_per_device == 100 * GIB
    plan = SweepPlan((32 * MI, 64 * MI), 1, "pass", profile, 1024)
    verdicts = capacity_check.check_points(plan, [32 * MI, 64 * MI])
    assert verdicts[32 * MI].fits
    assert verdicts[32 * MI].overhead_bytes == 100 * GIB
    assert not verdicts[64 * MI].fits
    assert verdicts[64 * MI].slack_bytes / GIB == pytest.approx(133.38 - 142.16, abs=0.01)
    table = capacity_check.render_table(plan, [32 * MI, 64 * MI])
    assert "reserve: 100.00 GiB per device" in table
    # The KV capacity vLLM will report is what is left once weights and the reserve are in.
    hardware = capacity_check.hardware_for(profile)
    layout = capacity_check.layout_for(profile)
    budget = hardware.usable_per_device_bytes - hardware.weights_on_rank(8, 8) - 100 * GIB
    tokens = layout.allocation.token_capacity(budget, 64 * MI + 1024)
    predicted = next(line for line in table.splitlines() if line.startswith("predicted KV"))
    assert predicted.startswith(f"predicted KV capacity: {tokens:,} tokens")
    assert predicted.endswith(
        "(an estimate: the memory budget less the weights and the 100.00 GiB reserve per device)"
    )


def test_more_ranks_than_devices_is_refused(tmp_path: Path) -> None:
    """vLLM gives every rank of every data-parallel replica a device of its own."""
    path = variant(tmp_path, "data_parallel_size = 1", "data_parallel_size = 2")
    with pytest.raises(ParallelLayoutError, match=r"data_parallel_size 2 = 16 ranks"):
        capacity_check.layout_for(load_profile(str(path)))


def plan_session(pytester: pytest.Pytester, profile: Path) -> pytest.RunResult:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester.runpytest(
        "-p", "no:cacheprovider", "--longctx-plan", f"--longctx-profile={profile}"
    )


def test_a_tp_that_does_not_shard_the_model_is_a_usage_error(pytester: pytest.Pytester) -> None:
    profile = variant(pytester.path, "tensor_parallel_size = 8", "tensor_parallel_size = 3")
    result = plan_session(pytester, profile)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: profile mine: tensor_parallel_size = 3 does not divide the model's 32 "
            "attention heads*; choose one of 1, 2, 4, 8, 16, 32"
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        (
            '["--tensor_parallel_size", "4"]',
            "*extra_args passes --tensor_parallel_size; set [[]serving] tensor_parallel_size "
            "instead*",
        ),
        (
            '["--tensor-parallel", "4"]',
            "*extra_args passes --tensor-parallel, the start of --tensor-parallel-size; vLLM's "
            "parser would take it for that flag: write the flag in full",
        ),
        (
            '["--mamba-ssm-cache-dtype", "fp8"]',
            "*extra_args --mamba-ssm-cache-dtype 'fp8' is not one of vLLM's choices for it: "
            "auto, float32, float16, bfloat16",
        ),
        (
            '["--mamba_cache_dtype=int8"]',
            "*extra_args --mamba_cache_dtype 'int8' is not one of vLLM's choices for it: "
            "auto, float32, float16, bfloat16",
        ),
    ],
)
def test_bad_extra_args_are_a_usage_error(
    pytester: pytest.Pytester, extra_args: str, message: str
) -> None:
    profile = variant(
        pytester.path, "max_num_seqs = 1", f"max_num_seqs = 1\nextra_args = {extra_args}"
    )
    result = plan_session(pytester, profile)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_flags_spelt_with_underscores_are_read_as_vllm_reads_them(tmp_path: Path) -> None:
    args = '["--block_size=128", "--no_enable_prefix_caching", "--max_num_batched_tokens", "4096"]'
    path = variant(tmp_path, "max_num_seqs = 1", f"max_num_seqs = 1\nextra_args = {args}")
    flags = cache_flags(load_profile(str(path)).serving)
    assert (flags.block_size, flags.prefix_caching, flags.max_num_batched_tokens) == (
        128,
        False,
        4096,
    )
    argv = build_server_command(
        load_profile(str(path)),
        model_path="m",
        tokenizer_path=None,
        max_model_len=1,
        port=1,
        max_num_batched_tokens=2048,
    ).argv
    # The interference server's chunk replaces the profile's, however it was spelt.
    assert "--max_num_batched_tokens" not in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "2048"
