"""The needle vocabulary: reserved tokens a model built to retrieve answers with.

The embedded models' tokenizers carry these as ordinary added tokens (not special ones, so a
server's detokenizer keeps them in the completion text): a question token and one value token
per needle identity, and for each of :data:`NEEDLE_KEYS` keys a question token that asks that
key alone and a needle token per value planted under it. One prompt can so hold several needles
and a question that names the one it wants. The answer is always the plain value token: its
number is the first run of digits in the completion, so one parser reads every probe.
"""

from __future__ import annotations

import re

#: Distinct needle identities: one per dimension of an attention head (64 in the embedded
#: models), which carries the identity from the needle to the question.
NEEDLE_VALUES = 64
QUESTION_TOKEN = "<|question|>"
#: The names needles are planted under, one per key: the text form says them ("the pass key of
#: Alice"), the token form uses their initials (no digit: only the value's number is read).
NEEDLE_KEYS = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")

_DIGITS = re.compile(r"\d+")


def needle_token(value: int) -> str:
    """The reserved token whose identity is ``value``."""
    if not 0 <= value < NEEDLE_VALUES:
        raise ValueError(f"needle value {value}: expected 0..{NEEDLE_VALUES - 1}")
    return f"<|needle-{value}|>"


def _initial(key: int) -> str:
    if not 0 <= key < len(NEEDLE_KEYS):
        raise ValueError(f"needle key {key}: expected 0..{len(NEEDLE_KEYS) - 1}")
    return NEEDLE_KEYS[key][0].lower()


def keyed_question_token(key: int) -> str:
    """The question token that asks for the needle planted under ``key`` alone."""
    return f"<|question-{_initial(key)}|>"


def keyed_needle_token(key: int, value: int) -> str:
    """The token that plants ``value`` under ``key``; answered by ``needle_token(value)``."""
    needle_token(value)  # the value's range is checked there
    return f"<|needle-{_initial(key)}-{value}|>"


#: Every reserved token, in the order the tokenizers add them (after the trained vocabulary).
RESERVED_TOKENS: tuple[str, ...] = (
    QUESTION_TOKEN,
    *(needle_token(value) for value in range(NEEDLE_VALUES)),
    *(keyed_question_token(key) for key in range(len(NEEDLE_KEYS))),
    *(
        keyed_needle_token(key, value)
        for key in range(len(NEEDLE_KEYS))
        for value in range(NEEDLE_VALUES)
    ),
)


def parse_answer(text: str) -> str | None:
    """The first run of digits in ``text`` with leading zeros dropped; None when none."""
    found = _DIGITS.search(text)
    if found is None:
        return None
    return found.group().lstrip("0") or "0"
