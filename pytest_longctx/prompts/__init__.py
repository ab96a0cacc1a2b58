"""Prompts of exactly L tokens from natural text: the corpus and the exact-length builder.

Below the measurement and the embedded model builder, which both need the corpus."""

from __future__ import annotations

from .builder import (
    NONCE_TOKENS,
    LocalTokenSource,
    Prompt,
    PromptBuilder,
    PromptError,
    ServerTokenSource,
)

__all__ = [
    "NONCE_TOKENS",
    "LocalTokenSource",
    "Prompt",
    "PromptBuilder",
    "PromptError",
    "ServerTokenSource",
]
