"""Published config.json files, as their checkpoints ship them, sized as vLLM sizes them.

A published file often leaves out what its transformers config class fills in (Gemma 3's five
local layers to one global, Gemma 2's alternation); vLLM loads the file through that class. On
vLLM's side here the file goes through vLLM's own config loader (``get_config`` on a model
folder, then ``get_hf_text_config``), each layer's spec is built from that config as vLLM's
model code builds it (``tests/unit/capacity/test_layer_kinds.py``), and vLLM's allocator gives
one 64Mi request's memory on one rank at TP=8. The plan reads the same file with
``load_model_config``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from longctx_testing import deferred_import

from pytest_longctx.capacity import GIB, ModelConfigError, cache_layout, load_model_config

torch = deferred_import("torch")
transformers = deferred_import("transformers")
vllm_config = deferred_import("vllm.transformers_utils.config")

from public_configs import PUBLISHED, PUBLISHED_DIR, VLLM_GIB_AT_64MI_TP8  # noqa: E402
from test_layer_kinds import IN_FLIGHT, MI, TP, vllm_bytes, vllm_specs  # noqa: E402

#: vLLM's own code, imported here: run by the shared servers' session, not the rest's, where
#: vLLM, torch and transformers would stay in the process and every in-process session
#: after them would pay pytest's garbage collections over their heap (5x the CPU a session).
pytestmark = pytest.mark.oracle


def vllm_text_config(key: str, folder: Path):  # noqa: ANN201
    """The language model's config as vLLM loads the published file from a model folder."""
    shutil.copyfile(PUBLISHED[key].file, folder / "config.json")
    hf = vllm_config.get_config(str(folder), trust_remote_code=False)
    return vllm_config.get_hf_text_config(hf)


def by_layer_types(hf) -> list[str]:  # noqa: ANN001
    # vLLM's gemma2.py:155 and gemma3.py:153: config.layer_types[layer_idx]
    return ["sliding" if t == "sliding_attention" else "full" for t in hf.layer_types]


def by_index(hf) -> list[str]:  # noqa: ANN001
    # vLLM's gpt_oss.py:176: sliding_window if layer_idx % 2 == 0, whatever layer_types says.
    return ["sliding" if i % 2 == 0 else "full" for i in range(hf.num_hidden_layers)]


def all_full(hf) -> list[str]:  # noqa: ANN001
    return ["full"] * hf.num_hidden_layers


CASES = [
    ("gemma-3-27b-it", "auto", by_layer_types),
    ("gemma-2-9b-it", "fp8", by_layer_types),
    ("Llama-3.1-70B-Instruct", "auto", all_full),
    ("gpt-oss-20b", "auto", by_index),
]


@pytest.mark.parametrize(("key", "cache_dtype", "pattern_of"), CASES)
def test_the_plan_reads_a_published_config_as_vllm_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, cache_dtype: str, pattern_of
) -> None:  # noqa: ANN001
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = vllm_text_config(key, tmp_path)
    kv_dtype = torch.float8_e4m3fn if cache_dtype == "fp8" else torch.bfloat16
    specs = vllm_specs(hf, pattern_of(hf), kv_dtype=kv_dtype, block=16)
    vllm = vllm_bytes(specs, 64 * MI)
    layout = cache_layout(
        load_model_config(PUBLISHED[key].file),
        tensor_parallel=TP,
        in_flight_tokens=IN_FLIGHT,
        cache_dtype=cache_dtype,
    )
    plan = sum(layout.request_bytes(64 * MI))
    assert plan == vllm, f"plan {plan / GIB:,.2f} GiB, vLLM {vllm / GIB:,.2f} GiB"
    if key == "gemma-3-27b-it":  # the figure the plan's session tests hold it to
        assert vllm / GIB == pytest.approx(VLLM_GIB_AT_64MI_TP8["gemma-3-27b"], abs=0.005)


def test_gemma3_published_leaves_the_interleave_to_the_class() -> None:
    """What makes the published Gemma 3 file a test: it names no local/global pattern, and
    read through its class, 10 of its 62 layers attend globally."""
    raw = PUBLISHED["gemma-3-27b-it"].config()
    text = raw["text_config"]
    assert not {"layer_types", "sliding_window_pattern"} & set(text)
    read = load_model_config(PUBLISHED["gemma-3-27b-it"].file)
    assert read["layer_types"].count("full_attention") == 10
    assert read["architectures"] == ["Gemma3ForConditionalGeneration"]
    layout = cache_layout(read, tensor_parallel=TP)
    assert sum(1 for layer in layout.layers if layer.kind == "full") == 10


def test_every_published_file_names_its_source() -> None:
    files = {path.name for path in PUBLISHED_DIR.glob("*.json")} - {"SOURCES.json"}
    assert files == {published.file.name for published in PUBLISHED.values()}
    for published in PUBLISHED.values():
        assert len(published.commit) == 40 and published.repo.count("/") == 1, published
        assert isinstance(json.loads(published.file.read_text()), dict)


def test_a_remote_code_model_type_is_read_as_written(tmp_path: Path) -> None:
    """A ``model_type`` no transformers class knows (remote code) keeps the file's fields."""
    config = {**PUBLISHED["Llama-3.1-70B-Instruct"].config(), "model_type": "unknown_remote"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert load_model_config(path) == config


def test_a_config_its_class_rejects_is_an_error_naming_the_file(tmp_path: Path) -> None:
    """vLLM would refuse to load it; the plan says so rather than sizing what it guessed."""
    config = {**PUBLISHED["gemma-2-9b-it"].config(), "layer_types": ["full_attention"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=r"config\.json: transformers' Gemma2Config rejects"):
        load_model_config(path)


def test_a_process_without_transformers_reads_the_same_without_importing_it() -> None:
    """Where transformers is not imported yet, its class runs in a Python of its own: the
    plan's process does not pay for torch, and reads what this one reads."""
    path = PUBLISHED["gemma-3-27b-it"].file
    code = (
        "import json, sys\n"
        "from pytest_longctx.capacity import load_model_config\n"
        f"config = load_model_config({str(path)!r})\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
        "print(json.dumps(config))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == load_model_config(path)


def test_minimax_m1_is_refused_naming_the_versions_that_refuse_it() -> None:
    """MiniMax-M1 (and MiniMax-Text-01) left vLLM after 0.23.0: every supported version refuses
    the architecture, so the plan says so in one line instead of sizing 80 layers it guessed."""
    from pytest_longctx.capacity import UnservedModelError

    config = load_model_config(PUBLISHED["MiniMax-M1"].file)
    assert config["architectures"] == ["MiniMaxM1ForCausalLM"]
    with pytest.raises(UnservedModelError) as refused:
        cache_layout(config, tensor_parallel=8)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith("MiniMaxM1ForCausalLM is not served by vLLM after 0.23.0: ")
    assert "every supported release (vLLM 0.25.1 to 0.34.0) refuses it" in said


def test_the_refused_architectures_are_the_ones_vllm_refuses() -> None:
    """Checked against the installed vLLM's registry: each one listed as served until its
    version and served no more, and transformers has no class of that name that vLLM's
    Transformers backend could take instead."""
    import vllm
    from vllm import ModelRegistry
    from vllm.model_executor.models.registry import _PREVIOUSLY_SUPPORTED_MODELS

    from pytest_longctx.capacity.layout import CHECKED_VLLM_VERSIONS, UNSERVED_ARCHITECTURES

    assert vllm.__version__.split("+")[0] in CHECKED_VLLM_VERSIONS
    supported = set(ModelRegistry.get_supported_archs())
    for architecture, last in UNSERVED_ARCHITECTURES.items():
        assert _PREVIOUSLY_SUPPORTED_MODELS[architecture] == last, architecture
        assert architecture not in supported
        assert getattr(transformers, architecture, None) is None, architecture
    # The -hf conversion's architecture has a transformers class vLLM can serve: not refused.
    assert transformers.MiniMaxForCausalLM.is_backend_compatible()
    assert "MiniMaxForCausalLM" not in UNSERVED_ARCHITECTURES
