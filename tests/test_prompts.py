"""Prompts: exact length, and a first token of their own for every point of a run."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_longctx.prompts import NONCE_TOKENS, PromptBuilder

VOCAB = 5000


class WordSource:
    """A tokenizer stand-in: one id per whitespace word (the builder's logic is under test)."""

    key = "words"

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(word.encode()) % VOCAB for word in text.split()]

    def count_as_server(self, text: str) -> int:
        return len(self.encode(text))

    def vocab_size(self) -> int | None:
        return VOCAB

    def decode(self, ids: Sequence[int]) -> str | None:
        return None


@pytest.fixture
def builder(tmp_path: Path) -> PromptBuilder:
    return PromptBuilder(WordSource(), tmp_path)


def test_every_point_of_a_run_starts_with_its_own_token(builder: PromptBuilder) -> None:
    points = 200  # 27 lengths x 7 repeats: more than any campaign plans
    firsts = [builder.nonce("run-a", index)[0] for index in range(points)]
    assert len(set(firsts)) == points
    pool = set(builder.nonce_pool())
    assert set(firsts) <= pool  # natural-text tokens, never a special one


def test_runs_differ_from_each_other(builder: PromptBuilder) -> None:
    one = [tuple(builder.nonce("run-a", index)) for index in range(30)]
    other = [tuple(builder.nonce("run-b", index)) for index in range(30)]
    assert not set(one) & set(other)
    assert all(len(nonce) == NONCE_TOKENS for nonce in one)
    assert [tuple(builder.nonce("run-a", index)) for index in range(30)] == one  # reproducible


def test_a_prompt_opens_with_its_nonce_and_has_exactly_the_length(builder: PromptBuilder) -> None:
    nonce = builder.nonce("run-a", 3)
    prompt = builder.build(2048, "Run run-a, prompt of 2048 tokens, pass 0.", nonce=nonce)
    assert len(prompt.ids) == prompt.token_count == 2048
    assert list(prompt.ids[:NONCE_TOKENS]) == list(nonce)
    tag = WordSource().encode("Run run-a, prompt of 2048 tokens, pass 0.\n")
    assert list(prompt.ids[NONCE_TOKENS : NONCE_TOKENS + len(tag)]) == tag
    assert prompt.header_tokens == NONCE_TOKENS + len(tag)


def test_two_repeats_of_a_length_share_no_first_block(builder: PromptBuilder) -> None:
    first = builder.build(1024, "tag", nonce=builder.nonce("run-a", 0))
    second = builder.build(1024, "tag", nonce=builder.nonce("run-a", 1))
    assert first.ids[0] != second.ids[0]
    assert first.ids[NONCE_TOKENS:] == second.ids[NONCE_TOKENS:]  # same body: only the start
