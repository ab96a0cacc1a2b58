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
from .probe import (
    FIDELITY_MODES,
    Probe,
    ProbeLesson,
    fidelity_verdict,
    judgement,
    learn,
    requests_verdict,
)

__all__ = [
    "FIDELITY_MODES",
    "Probe",
    "ProbeLesson",
    "fidelity_verdict",
    "judgement",
    "learn",
    "requests_verdict",
    "NONCE_TOKENS",
    "LocalTokenSource",
    "Prompt",
    "PromptBuilder",
    "PromptError",
    "ServerTokenSource",
]
