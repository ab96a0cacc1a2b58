"""Building an embedded model folder from its spec: weights, tokenizer and marker. The specs
and their cache folders are :mod:`pytest_longctx.profiles.embedded_models`.

Nothing can be downloaded in CI, yet the sweep needs a real model behind a real server. The
embedded models are generated on first use from a seed (weights via ``transformers``, a
byte-level BPE tokenizer trained on :mod:`pytest_longctx.prompts.corpus`) and cached outside the
repository, one folder per spec hash, so a changed spec or generator rebuilds instead of
serving a stale folder. Building the same spec twice gives byte-identical files.

Importing this module does not import torch or transformers: the plugin's core runs without
them; only :func:`build_embedded_model` needs them."""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.profiles.embedded_models import (
    BOS_ID,
    BOS_TOKEN,
    COMPLETE_MARKER,
    EMBEDDED_MODELS,
    EOS_ID,
    EOS_TOKEN,
    GENERATOR_VERSION,
    MAX_POSITION_EMBEDDINGS,
    PAD_ID,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    EmbeddedModelSpec,
    default_models_dir,
    get_spec,
    is_complete,
)
from pytest_longctx.prompts.corpus import CORPUS_VERSION, generate_corpus
from pytest_longctx.prompts.needle import RESERVED_TOKENS

from .retrieval import plant_retrieval


def ensure_embedded_model(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached folder for ``name``, building it first if no complete build exists.

    ``cache_dir`` holds the model folders (default :func:`default_models_dir`). The build goes
    into a temporary folder beside the final one and is renamed into place after its marker
    file is written, so a crash or a concurrent builder never leaves a folder that looks done.
    """
    spec = get_spec(name)
    models_dir = Path(cache_dir) if cache_dir is not None else default_models_dir()
    final = models_dir / spec.folder_name
    if is_complete(final):
        return final
    models_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models_dir / f".{spec.folder_name}.lock"):
        if is_complete(final):
            return final
        if final.exists():
            _remove_aside(final)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.folder_name}.building-", dir=models_dir))
        try:
            build_embedded_model(spec, staging)
            _make_readable(staging)
            try:
                os.replace(staging, final)
            except OSError:
                # Without a lock (non-POSIX) another builder may have won; its files are equal.
                if not is_complete(final):
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return final


def build_embedded_model(spec: EmbeddedModelSpec, destination: str | os.PathLike[str]) -> Path:
    """Write the model, tokenizer and marker of ``spec`` into ``destination`` (made if absent)."""
    folder = Path(destination)
    folder.mkdir(parents=True, exist_ok=True)
    with _offline():
        import torch
        import transformers
        from transformers.utils import logging as transformers_logging

        tokenizer = _train_tokenizer(spec)
        _save_tokenizer(tokenizer, folder)

        config = transformers.AutoConfig.for_model(**spec.model_config())
        config.architectures = [spec.architecture]
        with _torch_seed(torch, spec.seed):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if spec.weights == "retrieval":
            plant_retrieval(model, tokenizer)
        model = model.to(torch.bfloat16)
        with _no_progress_bars(transformers_logging):
            model.save_pretrained(folder, safe_serialization=True)
        _normalise_config_json(folder / "config.json")

        marker = {
            "spec": spec.to_json_dict(),
            "spec_hash": spec.spec_hash,
            "generator_version": GENERATOR_VERSION,
            "corpus_version": CORPUS_VERSION,
            "files": _file_digests(folder),
            "versions": {
                "torch": torch.__version__.split("+")[0],
                "transformers": transformers.__version__,
                "tokenizers": _tokenizers_version(),
            },
        }
        # Last, so its presence means every other file is complete.
        _write_json(folder / COMPLETE_MARKER, marker)
    return folder


def _train_tokenizer(spec: EmbeddedModelSpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(RESERVED_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_paragraphs(spec.corpus_chars, spec.seed), trainer)
    # The needle vocabulary last, as plain added tokens: detokenizers keep them in the text.
    tokenizer.add_tokens(list(RESERVED_TOKENS))
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(
            f"embedded model {spec.name!r}: the tokenizer reached {tokenizer.get_vocab_size()} "
            f"tokens, not vocab_size {spec.vocab_size}; raise corpus_chars ({spec.corpus_chars})"
        )
    for token, expected in zip(SPECIAL_TOKENS, (BOS_ID, EOS_ID, PAD_ID), strict=True):
        if tokenizer.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token} got id {tokenizer.token_to_id(token)}")
    # Text prompts start with BOS, as Llama-family tokenizers do.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return tokenizer


@functools.lru_cache(maxsize=1)
def _training_paragraphs(n_chars: int, seed: int) -> tuple[str, ...]:
    """Both embedded models train on the same text; generating it once per process is enough."""
    return tuple(generate_corpus(n_chars, seed).split("\n\n"))


def _save_tokenizer(tokenizer: Any, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_POSITION_EMBEDDINGS,
    )
    wrapped.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    # The class name every transformers release resolves, not only the one that wrote it.
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(config_path, tokenizer_config)


def _normalise_config_json(path: Path) -> None:
    """Add the pre-5.0 spellings of dtype and rope theta so older readers load the same model."""
    config = json.loads(path.read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    config["dtype"] = config["torch_dtype"] = dtype
    rope = config.get("rope_parameters")
    if isinstance(rope, Mapping) and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    _write_json(path, config)


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _file_digests(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != COMPLETE_MARKER
    }


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


@contextlib.contextmanager
def _torch_seed(torch: Any, seed: int) -> Iterator[None]:
    """Seeds torch for the build without disturbing the caller's random stream."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


@contextlib.contextmanager
def _no_progress_bars(transformers_logging: Any) -> Iterator[None]:
    """A one-shard save is instant; its progress bar only clutters test and CLI output."""
    were_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            transformers_logging.enable_progress_bar()


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """The build only ever writes locally; make any accidental hub lookup fail fast."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Serialises builders of one folder; without ``fcntl`` the atomic rename still holds."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _make_readable(folder: Path) -> None:
    """``mkdtemp`` makes a private folder; a model cache is ordinary readable data."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644)


def _remove_aside(folder: Path) -> None:
    """An unmarked folder is a leftover; rename it first so removal is never half-visible."""
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.stale-", dir=folder.parent))
    os.replace(folder, trash / folder.name)
    shutil.rmtree(trash, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``build-model NAME``: build (or find) an embedded model and print its folder."""
    parser = argparse.ArgumentParser(
        prog="pytest_longctx build-model",
        description="Build an embedded model into the cache and print its path.",
    )
    parser.add_argument("name", nargs="?", choices=sorted(EMBEDDED_MODELS), help="model to build")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help=f"folder holding model folders (default: {default_models_dir()})",
    )
    parser.add_argument("--list", action="store_true", help="list the embedded models and exit")
    args = parser.parse_args(argv)
    if args.list:
        for spec in EMBEDDED_MODELS.values():
            print(f"{spec.name}\t{spec.architecture}\t{spec.spec_hash}\t{spec.description}")
        return 0
    if args.name is None:
        parser.error("a model name is required (or --list)")
    print(ensure_embedded_model(args.name, cache_dir=args.cache_dir))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
