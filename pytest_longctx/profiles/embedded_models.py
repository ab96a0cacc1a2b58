"""What an embedded model is (its spec: architecture, config, tokenizer size) and its cache."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_longctx.prompts.corpus import CORPUS_VERSION
from pytest_longctx.prompts.needle import RESERVED_TOKENS

#: Bump whenever the files built for an unchanged spec change; part of every spec hash.
#: 2: the tokenizers end with the needle vocabulary (prompts/needle.py).
#: 3: keyed needles and questions (several needles per prompt, each asked by name).
GENERATOR_VERSION = 3

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
#: The retrieving model's base: its slowest rotary pair turns by under 1e-4 rad across 16Mi
#: positions, so a needle's key matches the question's query at any distance.
RETRIEVAL_ROPE_THETA = 1e12

#: How the weights are made: seeded random numbers, or built to retrieve a needle
#: (serving/retrieval.py).
WEIGHT_KINDS = ("random", "retrieval")


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
    weights: str = "random"

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
        if self.weights not in WEIGHT_KINDS:
            raise ValueError(
                f"embedded model {self.name!r}: weights {self.weights!r}, expected one of "
                f"{', '.join(WEIGHT_KINDS)}"
            )
        if self.vocab_size <= len(SPECIAL_TOKENS) + len(RESERVED_TOKENS):
            raise ValueError(
                f"embedded model {self.name!r}: vocab_size {self.vocab_size} leaves no room "
                f"beside the {len(SPECIAL_TOKENS)} special and "
                f"{len(RESERVED_TOKENS)} needle tokens"
            )

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "config": _thawed(self.config),
            "vocab_size": self.vocab_size,
            "seed": self.seed,
            "corpus_chars": self.corpus_chars,
            "weights": self.weights,
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

_TINY_LLAMA_CONFIG: Mapping[str, Any] = MappingProxyType(
    {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": {"rope_type": "default", "rope_theta": RETRIEVAL_ROPE_THETA},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
    }
)

TINY_LLAMA = EmbeddedModelSpec(
    name="tiny-llama",
    architecture="LlamaForCausalLM",
    config=_TINY_LLAMA_CONFIG,
    vocab_size=8192,
    weights="retrieval",
    description=(
        "Llama-style, 2 layers, GQA with 1 KV head of dim 64: 512 B of KV per token; "
        "weights built to answer the needle probe"
    ),
)

#: The same shapes and tokenizer with random weights: a model that cannot retrieve anything,
#: the probe's negative control.
TINY_LLAMA_RANDOM = EmbeddedModelSpec(
    name="tiny-llama-random",
    architecture="LlamaForCausalLM",
    config=_TINY_LLAMA_CONFIG,
    vocab_size=8192,
    description="tiny-llama's shapes with seeded random weights: answers no needle",
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
    {spec.name: spec for spec in (TINY_LLAMA, TINY_LLAMA_RANDOM, TINY_MLA)}
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
