"""Tiny random-weight models that vLLM serves like any downloaded model folder.

Nothing can be downloaded in CI, yet the sweep needs a real model behind a real server. The
embedded models are generated on first use from a seed (weights via ``transformers``, a
byte-level BPE tokenizer trained on :mod:`pytest_longctx.corpus`) and cached outside the
repository, one folder per spec hash, so a changed spec or generator rebuilds instead of
serving a stale folder. Building the same spec twice gives byte-identical files.

Importing this module does not import torch or transformers: the plugin's core runs without
them; only :func:`build_embedded_model` needs them.
"""

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
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_longctx.corpus import CORPUS_VERSION, generate_corpus

#: Bump whenever the files built for an unchanged spec change; part of every spec hash.
GENERATOR_VERSION = 1

#: Written last into a finished model folder: a folder without it is an interrupted build.
COMPLETE_MARKER = ".pytest-longctx-build.json"

CACHE_ENV = "PYTEST_LONGCTX_CACHE"

BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<|bos|>", "<|eos|>", "<|pad|>"
#: Special tokens take the first ids, in this order.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2

#: Long enough for every length a CPU or single-GPU sweep of these models reaches; vLLM keeps a
#: rotary table of this many rows (bf16, 64 wide: 128 MiB), so it is not set to 64Mi. Longer
#: runs raise it at serve time with ``--hf-overrides '{"max_position_embeddings": N}'``.
MAX_POSITION_EMBEDDINGS = 1024 * 1024
ROPE_THETA = 10_000_000.0


_SPEC_OWNED_KEYS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")


def _frozen(value: Any) -> Any:
    """Read-only all the way down, so one spec's nested settings cannot leak into another's."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


def _thawed(value: Any) -> Any:
    """Plain dicts and lists again: what JSON and the transformers config classes take."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thawed(item) for item in value]
    return value


@dataclass(frozen=True)
class EmbeddedModelSpec:
    """Everything that determines an embedded model's files; its hash names the cache folder."""

    name: str
    architecture: str
    config: Mapping[str, Any] = field(hash=False)
    vocab_size: int
    seed: int = 0
    corpus_chars: int = 2_000_000
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _frozen(self.config))
        if "model_type" not in self.config:
            raise ValueError(f"embedded model {self.name!r}: config needs a 'model_type' key")
        fixed_here = sorted(set(self.config) & set(_SPEC_OWNED_KEYS))
        if fixed_here:
            raise ValueError(
                f"embedded model {self.name!r}: config sets {fixed_here}, which the spec fixes "
                "itself (vocab_size field; special token ids 0, 1, 2)"
            )
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(
                f"embedded model {self.name!r}: vocab_size {self.vocab_size} leaves no room "
                f"beside the {len(SPECIAL_TOKENS)} special tokens"
            )

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "config": _thawed(self.config),
            "vocab_size": self.vocab_size,
            "seed": self.seed,
            "corpus_chars": self.corpus_chars,
        }

    @property
    def spec_hash(self) -> str:
        """Covers generator, corpus version and every field that changes the files."""
        payload = {
            "generator_version": GENERATOR_VERSION,
            "corpus_version": CORPUS_VERSION,
            "spec": self.to_json_dict(),
        }
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.spec_hash}"

    def model_config(self) -> dict[str, Any]:
        """The config keyword arguments, with the token ids and vocabulary this spec fixes."""
        return {
            **_thawed(self.config),
            "vocab_size": self.vocab_size,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        }


_ROPE = {"rope_type": "default", "rope_theta": ROPE_THETA}

TINY_LLAMA = EmbeddedModelSpec(
    name="tiny-llama",
    architecture="LlamaForCausalLM",
    config={
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": _ROPE,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
    },
    vocab_size=8192,
    description="Llama-style, 2 layers, GQA with 1 KV head of dim 64: 512 B of KV per token",
)

TINY_MLA = EmbeddedModelSpec(
    name="tiny-mla",
    architecture="DeepseekV3ForCausalLM",
    config={
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        # The CPU MLA kernel takes exactly a 512 + 64 latent.
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "head_dim": 64,
        # Every layer dense, so no experts are built; the MoE fields stay valid regardless.
        "first_k_dense_replace": 2,
        "moe_intermediate_size": 128,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": _ROPE,
        "rope_interleave": True,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "initializer_range": 0.02,
    },
    vocab_size=8192,
    description="DeepSeek-V3-style multi-head latent attention (512 + 64 latent), dense MLP",
)

EMBEDDED_MODELS: Mapping[str, EmbeddedModelSpec] = MappingProxyType(
    {spec.name: spec for spec in (TINY_LLAMA, TINY_MLA)}
)


class UnknownEmbeddedModelError(LookupError):
    """A model name that is not a key of :data:`EMBEDDED_MODELS`."""


def get_spec(name: str) -> EmbeddedModelSpec:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise UnknownEmbeddedModelError(
            f"no embedded model named {name!r}; known models: {known}"
        ) from None


def cache_root() -> Path:
    """``$PYTEST_LONGCTX_CACHE``, else ``$XDG_CACHE_HOME/pytest-longctx``, else ``~/.cache/...``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pytest-longctx"


def default_models_dir() -> Path:
    return cache_root() / "models"


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


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
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_paragraphs(spec.corpus_chars, spec.seed), trainer)
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
        description="Build an embedded random-weight model into the cache and print its path.",
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
