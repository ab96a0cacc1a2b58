"""Tiny generated models that vLLM serves like any downloaded model folder.

Nothing can be downloaded in CI, yet the sweep needs a real model behind a real server. The
embedded models are generated on first use from a seed (weights via ``transformers``, a
byte-level BPE tokenizer trained on :mod:`pytest_longctx.prompts.corpus`) and cached outside the
repository, one folder per spec hash, so a changed spec or generator rebuilds instead of
serving a stale folder. Building the same spec twice gives byte-identical files.

Importing this module does not import torch or transformers: the plugin's core runs without
them; only :func:`build_embedded_model` needs them."""

from __future__ import annotations

from pytest_longctx.profiles.embedded_models import (
    BOS_ID,
    BOS_TOKEN,
    CACHE_ENV,
    COMPLETE_MARKER,
    EMBEDDED_MODELS,
    EOS_ID,
    EOS_TOKEN,
    GENERATOR_VERSION,
    MAX_POSITION_EMBEDDINGS,
    PAD_ID,
    PAD_TOKEN,
    ROPE_THETA,
    SPECIAL_TOKENS,
    TINY_LLAMA,
    TINY_LLAMA_RANDOM,
    TINY_MLA,
    EmbeddedModelSpec,
    UnknownEmbeddedModelError,
    cache_root,
    default_models_dir,
    get_spec,
    is_complete,
)

from .build import (
    build_embedded_model,
    ensure_embedded_model,
    main,
)

__all__ = [
    "BOS_ID",
    "BOS_TOKEN",
    "CACHE_ENV",
    "COMPLETE_MARKER",
    "EMBEDDED_MODELS",
    "EOS_ID",
    "EOS_TOKEN",
    "EmbeddedModelSpec",
    "GENERATOR_VERSION",
    "MAX_POSITION_EMBEDDINGS",
    "PAD_ID",
    "PAD_TOKEN",
    "ROPE_THETA",
    "SPECIAL_TOKENS",
    "TINY_LLAMA",
    "TINY_LLAMA_RANDOM",
    "TINY_MLA",
    "UnknownEmbeddedModelError",
    "build_embedded_model",
    "cache_root",
    "default_models_dir",
    "ensure_embedded_model",
    "get_spec",
    "is_complete",
    "main",
]
