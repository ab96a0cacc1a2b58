"""The needle vocabulary: reserved tokens a model built to retrieve answers with.

The embedded models' tokenizers carry these as ordinary added tokens (not special ones, so a
server's detokenizer keeps them in the completion text): a question token and one value token
per needle identity. A value is the number in its token's text, so one parser reads the answer
of every probe: the first run of digits in the completion.
"""

from __future__ import annotations

import re

#: Distinct needle identities: one per dimension of an attention head (64 in the embedded
#: models), which carries the identity from the needle to the question.
NEEDLE_VALUES = 64
QUESTION_TOKEN = "<|question|>"

_DIGITS = re.compile(r"\d+")


def needle_token(value: int) -> str:
    """The reserved token whose identity is ``value``."""
    if not 0 <= value < NEEDLE_VALUES:
        raise ValueError(f"needle value {value}: expected 0..{NEEDLE_VALUES - 1}")
    return f"<|needle-{value}|>"


#: Every reserved token, in the order the tokenizers add them (after the trained vocabulary).
RESERVED_TOKENS: tuple[str, ...] = (
    QUESTION_TOKEN,
    *(needle_token(value) for value in range(NEEDLE_VALUES)),
)


def parse_answer(text: str) -> str | None:
    """The first run of digits in ``text`` with leading zeros dropped; None when none."""
    found = _DIGITS.search(text)
    if found is None:
        return None
    return found.group().lstrip("0") or "0"
