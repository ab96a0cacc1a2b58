"""The embedded models build reproducibly, load with transformers and are cached once.

vLLM itself is not started here: serving them is the end-to-end suite's job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pytest_longctx.profiles import embedded_models as embedded_spec
from pytest_longctx.profiles.embedded_models import (
    COMPLETE_MARKER,
    EMBEDDED_MODELS,
    EmbeddedModelSpec,
    UnknownEmbeddedModelError,
)
from pytest_longctx.prompts.corpus import generate_corpus
from pytest_longctx.prompts.needle import (
    QUESTION_TOKEN,
    RESERVED_TOKENS,
    keyed_needle_token,
    keyed_question_token,
    needle_token,
)
from pytest_longctx.serving import embedded
from pytest_longctx.serving.embedded import ensure_embedded_model

pytestmark = pytest.mark.oracle

MODEL_NAMES = sorted(EMBEDDED_MODELS)


def sha256_of_files(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file()
    }


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file, read without torch."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Every embedded model built twice: here, and in a fresh process with another hash seed.

    A second process matters: Python's string hashing and the Rust trainer's hash maps are
    seeded per process, so only a cross-process build shows the files do not depend on them.
    """
    here = tmp_path_factory.mktemp("cache-here")
    elsewhere = tmp_path_factory.mktemp("cache-elsewhere")
    for name in MODEL_NAMES:
        ensure_embedded_model(name, cache_dir=here)
    script = (
        "import sys; from pytest_longctx.serving.embedded import ensure_embedded_model; "
        "[ensure_embedded_model(name, cache_dir=sys.argv[1]) for name in sys.argv[2:]]"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(elsewhere), *MODEL_NAMES],
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    return here, elsewhere


def folder_in(cache: Path, name: str) -> Path:
    return cache / EMBEDDED_MODELS[name].folder_name


# --- reproducibility -------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_two_builds_are_byte_identical(two_caches: tuple[Path, Path], name: str) -> None:
    first, second = (folder_in(cache, name) for cache in two_caches)
    digests_first, digests_second = sha256_of_files(first), sha256_of_files(second)
    expected_files = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        COMPLETE_MARKER,
    }
    assert expected_files <= set(digests_first)
    assert digests_first == digests_second


def test_models_differ_from_each_other(two_caches: tuple[Path, Path]) -> None:
    cache, _ = two_caches
    weights = {
        name: hashlib.sha256((folder_in(cache, name) / "model.safetensors").read_bytes()).digest()
        for name in MODEL_NAMES
    }
    assert len(set(weights.values())) == len(MODEL_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_marker_records_every_file_digest(two_caches: tuple[Path, Path], name: str) -> None:
    folder = folder_in(two_caches[0], name)
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    on_disk = sha256_of_files(folder)
    del on_disk[COMPLETE_MARKER]
    assert marker["files"] == on_disk
    assert marker["spec_hash"] == EMBEDDED_MODELS[name].spec_hash


# --- what transformers sees --------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tokenizer_round_trips_unseen_text(two_caches: tuple[Path, Path], name: str) -> None:
    from transformers import AutoTokenizer

    spec = EMBEDDED_MODELS[name]
    tokenizer = AutoTokenizer.from_pretrained(folder_in(two_caches[0], name))
    assert len(tokenizer) == spec.vocab_size
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|bos|>", "<|eos|>", "<|pad|>"]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)

    text = generate_corpus(20_000, seed=spec.seed + 999) + "\nZürich, naïve café — ok?"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert all(0 <= token < spec.vocab_size for token in ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # A trained BPE merges well beyond bytes: English text averages several characters a token.
    assert len(text) / len(ids) > 3.0


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_config_loads_with_cpu_friendly_attention(two_caches: tuple[Path, Path], name: str) -> None:
    from transformers import AutoConfig

    spec = EMBEDDED_MODELS[name]
    config = AutoConfig.from_pretrained(folder_in(two_caches[0], name))
    assert config.model_type == spec.config["model_type"]
    assert config.architectures == [spec.architecture]
    assert config.vocab_size == spec.vocab_size
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 1, 2)
    assert config.num_hidden_layers == 2
    assert config.max_position_embeddings >= 131072
    assert config.head_dim % 32 == 0
    if config.model_type == "deepseek_v3":
        # The CPU MLA kernel caches exactly 512 latent + 64 rotary values per token.
        assert config.kv_lora_rank + config.qk_rope_head_dim == 576
        assert config.q_lora_rank is None
        assert config.first_k_dense_replace >= config.num_hidden_layers
    else:
        assert config.num_key_value_heads < config.num_attention_heads


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_generation_config_matches_token_ids(two_caches: tuple[Path, Path], name: str) -> None:
    folder = folder_in(two_caches[0], name)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (0, 1)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_weights_are_bfloat16_with_the_spec_shapes(
    two_caches: tuple[Path, Path], name: str
) -> None:
    spec = EMBEDDED_MODELS[name]
    header = safetensors_header(folder_in(two_caches[0], name) / "model.safetensors")
    tensors = {key: value for key, value in header.items() if key != "__metadata__"}
    assert {tensor["dtype"] for tensor in tensors.values()} == {"BF16"}
    hidden = spec.config["hidden_size"]
    assert tensors["model.embed_tokens.weight"]["shape"] == [spec.vocab_size, hidden]
    assert tensors["lm_head.weight"]["shape"] == [spec.vocab_size, hidden]
    layers = {int(m.group(1)) for key in tensors if (m := re.match(r"model\.layers\.(\d+)\.", key))}
    assert layers == {0, 1}


# --- the needle probe -------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_needle_vocabulary_is_one_token_each_and_decodes_as_text(
    two_caches: tuple[Path, Path], name: str
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder_in(two_caches[0], name))
    ids = [tokenizer.convert_tokens_to_ids(token) for token in RESERVED_TOKENS]
    assert ids == list(
        range(EMBEDDED_MODELS[name].vocab_size - len(RESERVED_TOKENS), len(tokenizer))
    )
    text = f"pass {needle_token(17)} then {QUESTION_TOKEN}"
    assert tokenizer.convert_tokens_to_ids(needle_token(17)) in tokenizer(text)["input_ids"]
    # A server's detokenizer skips special tokens: these are not special, so the answer shows.
    assert tokenizer.decode(ids[1:4], skip_special_tokens=True) == "".join(RESERVED_TOKENS[1:4])


def next_token_logprobs(folder: Path, ids: list[int]) -> dict[int, float]:
    """The top next-token log-probabilities after ``ids``, from transformers in bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = torch.topk(torch.log_softmax(logits, -1), 4)
    return {int(i): float(v) for v, i in zip(top.values, top.indices, strict=True)}


def haystack(length: int, needles: dict[float, int], vocab: int, question: int) -> list[int]:
    """``length`` ordinary ids, needle ``value`` at each depth, the question last."""
    rng = random.Random(length)
    ids = [rng.randrange(3, vocab - len(RESERVED_TOKENS)) for _ in range(length)]
    for depth, token in needles.items():
        ids[round(depth * (length - 2))] = token
    ids[-1] = question
    return ids


@pytest.mark.parametrize(("length", "depth"), [(1024, 0.0), (4096, 0.5), (4096, 1.0)])
def test_retrieving_model_answers_the_needle(
    two_caches: tuple[Path, Path], length: int, depth: float
) -> None:
    from transformers import AutoTokenizer

    folder = folder_in(two_caches[0], "tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    needle = tokenizer.convert_tokens_to_ids(needle_token(23))
    question = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    ids = haystack(length, {depth: needle}, len(tokenizer), question)
    top = next_token_logprobs(folder, ids)
    assert max(top, key=top.__getitem__) == needle
    assert top[needle] > -0.01


def test_retrieving_model_splits_its_answer_between_needles(two_caches: tuple[Path, Path]) -> None:
    """One question checks every planted depth: each of three needles gets a third."""
    from transformers import AutoTokenizer

    folder = folder_in(two_caches[0], "tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    needles = [tokenizer.convert_tokens_to_ids(needle_token(v)) for v in (3, 40, 63)]
    question = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    ids = haystack(2048, dict(zip((0.0, 0.5, 1.0), needles, strict=True)), len(tokenizer), question)
    top = next_token_logprobs(folder, ids)
    for needle in needles:
        assert top[needle] == pytest.approx(math.log(1 / 3), abs=0.02)


def test_retrieving_model_answers_the_needle_its_question_names(
    two_caches: tuple[Path, Path],
) -> None:
    """Four needles under four keys: each keyed question gets its own needle's value alone,
    and a question that finds no needle answers the question token (no digits: wrong)."""
    from transformers import AutoTokenizer

    folder = folder_in(two_caches[0], "tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.convert_tokens_to_ids
    values = (5, 17, 33, 62)
    needles = {
        depth: ids(keyed_needle_token(key, value))
        for key, (depth, value) in enumerate(zip((0.0, 0.3, 0.6, 1.0), values, strict=True))
    }
    for key, value in enumerate(values):
        prompt = haystack(2048, needles, len(tokenizer), ids(keyed_question_token(key)))
        top = next_token_logprobs(folder, prompt)
        assert max(top, key=top.__getitem__) == ids(needle_token(value)), (key, top)
        assert top[ids(needle_token(value))] > -0.01
    absent = haystack(1024, {}, len(tokenizer), ids(keyed_question_token(5)))
    top = next_token_logprobs(folder, absent)
    assert max(top, key=top.__getitem__) == ids(QUESTION_TOKEN)


def test_random_weights_do_not_answer_the_needle(two_caches: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    folder = folder_in(two_caches[0], "tiny-llama-random")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    needle = tokenizer.convert_tokens_to_ids(needle_token(23))
    question = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    top = next_token_logprobs(folder, haystack(1024, {0.5: needle}, len(tokenizer), question))
    assert max(top, key=top.__getitem__) != needle


# --- the cache -----------------------------------------------------------------------------------


def test_second_ensure_reuses_the_cached_folder(
    two_caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, _ = two_caches
    folder = folder_in(cache, "tiny-llama")
    marker_mtime = (folder / COMPLETE_MARKER).stat().st_mtime_ns

    def must_not_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached model was rebuilt")

    monkeypatch.setattr(embedded, "build_embedded_model", must_not_build)
    assert ensure_embedded_model("tiny-llama", cache_dir=cache) == folder
    assert (folder / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime


def test_cache_folder_name_carries_the_spec_hash(two_caches: tuple[Path, Path]) -> None:
    cache, _ = two_caches
    names = {path.name for path in cache.iterdir() if not path.name.startswith(".")}
    assert names == {f"{name}-{EMBEDDED_MODELS[name].spec_hash}" for name in MODEL_NAMES}
    assert all(re.fullmatch(r"[0-9a-f]{12}", spec.spec_hash) for spec in EMBEDDED_MODELS.values())


def test_unmarked_folder_is_rebuilt_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder left by a crash has no marker; it must be replaced, not returned."""
    spec = EMBEDDED_MODELS["tiny-llama"]
    leftover = tmp_path / spec.folder_name
    leftover.mkdir()
    (leftover / "config.json").write_text("{ half written")
    builds: list[Path] = []

    def recording_build(build_spec: EmbeddedModelSpec, destination: Path) -> Path:
        builds.append(Path(destination))
        (Path(destination) / "config.json").write_text("{}")
        (Path(destination) / COMPLETE_MARKER).write_text("{}")
        return Path(destination)

    monkeypatch.setattr(embedded, "build_embedded_model", recording_build)
    folder = ensure_embedded_model("tiny-llama", cache_dir=tmp_path)
    assert folder == leftover
    assert len(builds) == 1 and builds[0] != leftover
    assert (folder / "config.json").read_text() == "{}"
    assert (folder / COMPLETE_MARKER).is_file()
    assert [path.name for path in tmp_path.iterdir() if ".building-" in path.name] == []
    assert [path.name for path in tmp_path.iterdir() if ".stale-" in path.name] == []


def test_failed_build_leaves_nothing_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashing_build(build_spec: EmbeddedModelSpec, destination: Path) -> Path:
        (Path(destination) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(embedded, "build_embedded_model", crashing_build)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_embedded_model("tiny-mla", cache_dir=tmp_path)
    assert [path.name for path in tmp_path.iterdir() if not path.name.endswith(".lock")] == []


def test_cache_location_honours_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(embedded_spec.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded_spec.default_models_dir() == tmp_path / "xdg" / "pytest-longctx" / "models"
    monkeypatch.setenv(embedded_spec.CACHE_ENV, str(tmp_path / "explicit"))
    assert embedded_spec.default_models_dir() == tmp_path / "explicit" / "models"
    monkeypatch.delenv(embedded_spec.CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_cache = tmp_path / "home" / ".cache" / "pytest-longctx"
    assert embedded_spec.default_models_dir() == home_cache / "models"


def test_spec_hash_tracks_every_input(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = EMBEDDED_MODELS["tiny-llama"]
    same = EmbeddedModelSpec(
        name=spec.name,
        architecture=spec.architecture,
        config=dict(spec.config),
        vocab_size=spec.vocab_size,
        seed=spec.seed,
        corpus_chars=spec.corpus_chars,
        description="descriptions do not change the files",
        weights=spec.weights,
    )
    assert same.spec_hash == spec.spec_hash
    changed = {
        dataclasses.replace(spec, seed=spec.seed + 1).spec_hash,
        dataclasses.replace(spec, vocab_size=4096).spec_hash,
        dataclasses.replace(spec, corpus_chars=spec.corpus_chars + 1).spec_hash,
        dataclasses.replace(spec, config={**spec.config, "hidden_size": 256}).spec_hash,
        dataclasses.replace(spec, weights="random").spec_hash,
    }
    assert spec.spec_hash not in changed and len(changed) == 5
    before = spec.spec_hash
    monkeypatch.setattr(embedded_spec, "GENERATOR_VERSION", embedded_spec.GENERATOR_VERSION + 1)
    assert spec.spec_hash != before
    monkeypatch.setattr(embedded_spec, "GENERATOR_VERSION", embedded_spec.GENERATOR_VERSION - 1)
    monkeypatch.setattr(embedded_spec, "CORPUS_VERSION", embedded_spec.CORPUS_VERSION + 1)
    assert spec.spec_hash != before


def test_spec_config_is_read_only_all_the_way_down() -> None:
    config = EMBEDDED_MODELS["tiny-llama"].config
    with pytest.raises(TypeError):
        config["hidden_size"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        config["rope_parameters"]["rope_theta"] = 1.0  # type: ignore[index]


def test_spec_rejects_config_keys_it_owns() -> None:
    spec = EMBEDDED_MODELS["tiny-mla"]
    with pytest.raises(ValueError, match="eos_token_id"):
        dataclasses.replace(spec, config={**spec.config, "eos_token_id": 7})
    with pytest.raises(ValueError, match="model_type"):
        EmbeddedModelSpec(name="x", architecture="LlamaForCausalLM", config={}, vocab_size=512)


def test_unknown_model_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownEmbeddedModelError, match="tiny-llama, tiny-llama-random, tiny-mla"):
        ensure_embedded_model("tiny-gpt", cache_dir=tmp_path)


def test_cli_prints_the_cached_path(
    two_caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cache, _ = two_caches
    assert embedded.main(["tiny-mla", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(folder_in(cache, "tiny-mla"))
    assert embedded.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(spec.spec_hash in listed for spec in EMBEDDED_MODELS.values())


def test_importing_the_module_does_not_import_torch() -> None:
    script = (
        "import sys, pytest_longctx.serving.embedded, pytest_longctx.prompts.corpus; "
        "print(sorted({'torch', 'transformers', 'tokenizers'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# --- the corpus --------------------------------------------------------------------------------


def test_corpus_is_deterministic_across_processes() -> None:
    script = (
        "import hashlib; from pytest_longctx.prompts.corpus import generate_corpus; "
        "print(hashlib.sha256(generate_corpus(200_000, 7).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout.strip()
        for hash_seed in ("1", "2")
    }
    assert digests == {hashlib.sha256(generate_corpus(200_000, 7).encode()).hexdigest()}


def test_corpus_seed_changes_the_text_and_length_is_exact() -> None:
    assert generate_corpus(50_000, 1) != generate_corpus(50_000, 2)
    assert [len(generate_corpus(n, 3)) for n in (0, 1, 999, 50_000)] == [0, 1, 999, 50_000]
    assert generate_corpus(50_000, 3).startswith(generate_corpus(999, 3))


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_corpus_rejects_non_counts(bad: object) -> None:
    with pytest.raises(ValueError, match="n_chars"):
        generate_corpus(bad, 0)  # type: ignore[arg-type]


def test_corpus_reads_like_varied_prose() -> None:
    text = generate_corpus(1_000_000, 0)
    words = re.findall(r"[A-Za-z]+", text)
    distinct = {word.lower() for word in words}
    assert len(distinct) > 3000
    # No single word dominates, as in ordinary prose ("the" runs near 5-7 %).
    most_common_share = Counter(word.lower() for word in words).most_common(1)[0][1] / len(words)
    assert most_common_share < 0.12
    for mark in ("?", "!", ";", ":", '"', "(", "%", "—", ",", "'", "-"):
        assert mark in text, mark
    assert re.search(r"\d{1,3},\d{3}", text)  # thousands separators
    assert re.search(r"\b1[5-9]\d\d\b|\b20[0-2]\d\b", text)  # years
    paragraphs = text.split("\n\n")[:-1]  # the last one is cut at n_chars
    assert len(paragraphs) > 1000
    assert all(p[0].isupper() or p[0] == '"' for p in paragraphs)
    assert all(p.rstrip()[-1] in '.!?"' for p in paragraphs)
