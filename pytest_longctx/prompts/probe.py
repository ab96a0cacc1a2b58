"""The fidelity probe a measured prompt carries: a needle planted at a depth, the question last.

The prompt stays exactly L tokens: the needle and the question overwrite body tokens, never
add any. Two forms, picked by the served tokenizer:

* ``tokens``: the tokenizer has the needle vocabulary (prompts/needle.py, the embedded
  models): the needle is one value token, the question one token, the answer the value's
  token.
* ``text``: any other tokenizer: a natural-language pass key (digits) that an instruct model
  repeats under greedy decoding, encoded with the model's own tokenizer.

Either way the answer is the first run of digits in the completion (:func:`parse_answer`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .needle import NEEDLE_VALUES, QUESTION_TOKEN, needle_token, parse_answer

#: Where the needle sits, as a fraction of the span between the header and the question:
#: start, end, middle and between, in an order that gives neighbouring points other depths.
DEPTHS = (0.0, 0.5, 1.0, 0.25, 0.75, 0.125, 0.875, 0.375, 0.625)

PASS_KEY_DIGITS = 5
TEXT_NEEDLE = "\nThe pass key is {value}. Remember it. {value} is the pass key.\n"
TEXT_QUESTION = "\nWhat is the pass key? The pass key is"

PROBE_KINDS = ("tokens", "text")


@dataclass(frozen=True)
class Probe:
    """What a prompt asks and where: the expected answer, the needle's depth and form."""

    kind: str
    expected: str
    #: The needle's first token as a fraction of the prompt (0: first token, 1: last).
    depth: float
    needle_text: str
    question_text: str
    #: The needle's first token's index in the prompt.
    position: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "expected": self.expected,
            "depth": round(self.depth, 4),
            "needle": self.needle_text,
            "question": self.question_text,
        }


def probe_depth(index: int) -> float:
    """The needle's depth for the point at ``index`` of the plan."""
    return DEPTHS[index % len(DEPTHS)]


def probe_value(key: str, kind: str) -> str:
    """The expected answer for ``key`` (run and point): a value token's number, or a pass key
    of :data:`PASS_KEY_DIGITS` digits without a leading zero."""
    number = int.from_bytes(hashlib.sha256(f"needle:{key}".encode()).digest()[:8], "big")
    if kind == "tokens":
        return str(number % NEEDLE_VALUES)
    low = 10 ** (PASS_KEY_DIGITS - 1)
    return str(low + number % (9 * low))


def probe_texts(kind: str, value: str) -> tuple[str, str]:
    """The needle and the question, as text (what the plan shows and the tokenizer encodes)."""
    if kind == "tokens":
        return needle_token(int(value)), QUESTION_TOKEN
    return TEXT_NEEDLE.format(value=value), TEXT_QUESTION


def judge_answer(
    expected: str, completion: str | None, kind: str = "text"
) -> tuple[str, str | None]:
    """``(verdict, answer)``: ``correct`` or ``wrong`` from the completion's first digits.

    A ``tokens`` probe is stricter: the completion must open with the needle's own token, so
    a model that happens to write the number in ordinary text (the value space is small)
    does not pass."""
    answer = parse_answer(completion or "")
    right = answer == expected
    if kind == "tokens":
        right = (completion or "").lstrip().startswith(needle_token(int(expected)))
    return ("correct" if right else "wrong"), answer


#: ``--longctx-fidelity``: what a wrong answer does.
FIDELITY_MODES = ("auto", "check", "record", "off")
FIDELITY_HELP = (
    "what a wrong answer to the probe each measured prompt carries does: 'check' fails the "
    "point, 'record' keeps it passed, 'auto' (default) checks lengths within the model's "
    "advertised context and records beyond, 'off' plants no probe"
)


def judgement(mode: str, length: int, advertised: int | None) -> str:
    """``check``, ``record`` or ``off`` for a point of ``length`` prompt tokens: ``auto``
    checks within the model's advertised context (its ``max_position_embeddings``; unknown:
    checked) and records beyond it, where a model is not claimed to answer."""
    if mode != "auto":
        return mode
    return "check" if advertised is None or length <= advertised else "record"


def fidelity_verdict(
    probe: Probe | None, completion: str | None, how: str, why_unprobed: str = ""
) -> dict[str, Any]:
    """The record's ``fidelity``: what was asked, what came back and whether it is right.

    ``how`` is :func:`judgement`'s word for the point; ``completion`` the head of the
    completion text (None when none was read)."""
    if how == "off":
        return {"verdict": "not_checked", "reason": "--longctx-fidelity=off"}
    if probe is None:
        return {"verdict": "not_checked", "reason": why_unprobed or "the prompt carries no probe"}
    entry: dict[str, Any] = {
        "expected": probe.expected,
        "depth": round(probe.depth, 4),
        "kind": probe.kind,
        "mode": how,
    }
    if completion is None:
        return {**entry, "answer": None, "verdict": "not_checked", "reason": "no completion text"}
    verdict, answer = judge_answer(probe.expected, completion, probe.kind)
    return {
        **entry,
        "answer": answer,
        "completion": completion[:80],
        "verdict": verdict,
        "judged_by": "the first digits of the completion"
        + (
            ", opening with the needle's value token"
            if probe.kind == "tokens"
            else " (the pass key)"
        ),
    }
