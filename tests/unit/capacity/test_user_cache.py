"""Answers that cost a Python importing vLLM or torch are kept in the user's cache: vLLM's
allocator's per layout and vLLM version, a config class's filled config per transformers
version. A later session reads them there instead of starting that Python again."""

from __future__ import annotations

import sys

import pytest

from pytest_longctx.capacity import class_config, oracle
from pytest_longctx.core import warm_python
from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import load_profile
from pytest_longctx.profiles.embedded_models import CACHE_ENV

pytestmark = pytest.mark.oracle

needs_vllm = pytest.mark.skipif(not oracle.available(), reason="vLLM is not installed here")


def ask(max_model_len: int) -> oracle.OracleAnswer:
    layout = capacity_check.layout_for(load_profile("cpu-tiny"))
    allocation = layout.allocation
    return oracle.ask_in_subprocess(
        layout.layers, allocation.settings, allocation.stages, layout.element_bytes, max_model_len
    )


@needs_vllm
def test_the_answer_is_kept_and_read_back_without_vllm(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    first = ask(4096)
    kept = list((tmp_path / "capacity-oracle").glob("*.json"))
    assert len(kept) == 1
    assert first.per_rank_bytes == 4096 * 512  # cpu-tiny: 512 B per token, one rank

    def not_again(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("vLLM was asked again")

    monkeypatch.setattr(warm_python, "ask", not_again)
    assert ask(4096) == first
    with pytest.raises(AssertionError, match="asked again"):
        ask(8192)  # another request: another answer


def test_another_vllm_version_is_another_answer(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    request = {"max_model_len": 4096}
    here = oracle.answer_file(request)
    monkeypatch.setattr(oracle, "vllm_version", lambda: "vllm 9.9.9")
    assert oracle.answer_file(request) != here


def test_a_filled_config_is_kept_and_read_back_without_transformers(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delitem(sys.modules, "transformers", raising=False)  # the child Python's path
    config = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512}
    class_config._filled.cache_clear()
    first = class_config.filled_config(config)
    assert "layer_types" in first and "layer_types" not in config  # the class's default
    assert len(list((tmp_path / "model-configs").glob("*.json"))) == 1

    def not_again(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the config class was run again")

    monkeypatch.setattr(warm_python, "ask", not_again)
    class_config._filled.cache_clear()
    assert class_config.filled_config(config) == first
