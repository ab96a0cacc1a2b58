"""Prompts of exactly L tokens of natural text, unique per (run, length, repeat).

A prompt is token ids taken from the tokenized corpus (cycled from a seeded offset), never
text decoded and re-encoded: at 64Mi that is minutes and gigabytes, and random ids decoded to
text re-tokenize to another length. It opens with a nonce: a few tokens drawn for this run and
point, the first of them different for every point of the run. vLLM's prefix cache matches
whole blocks, chained from the first, and a GPU block is 16 tokens: a prompt that differs from
its very first token shares no block with any earlier prompt, so every measured prefill is
cold on any block size. A readable tag naming the run, length and repeat follows. The body
(the costly part) is cached on disk keyed by tokenizer, revision, length and seed; the header
is spliced in per point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pytest_longctx.core.files import write_atomically
from pytest_longctx.prompts.corpus import generate_corpus
from pytest_longctx.prompts.needle import NEEDLE_VALUES, QUESTION_TOKEN, needle_token
from pytest_longctx.prompts.probe import Probe, probe_texts, probe_value

CORPUS_CHARS = 1_000_000
NONCE_TOKENS = 4
CORPUS_CHUNK_CHARS = 16_000  # what one /tokenize request carries when the server tokenizes
TEXT_FIT_ATTEMPTS = 8


class PromptError(RuntimeError):
    """A prompt that is not exactly the length it must be."""


class TokenSource(Protocol):
    """The served model's tokenizer, local or behind the server's ``/tokenize``."""

    key: str  # identity for the disk cache: tokenizer name and revision

    def encode(self, text: str) -> list[int]: ...

    def count_as_server(self, text: str) -> int:
        """Tokens the server reads for a text prompt (special tokens such as BOS included)."""
        ...

    def vocab_size(self) -> int | None: ...

    def decode(self, ids: Sequence[int]) -> str | None: ...


@dataclass
class LocalTokenSource:
    """``AutoTokenizer`` for the profile's model at its pinned revision."""

    name_or_path: str
    revision: str | None = None
    trust_remote_code: bool = False
    _tokenizer: object = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.name_or_path}@{self.revision or 'local'}"

    @property
    def tokenizer(self):  # noqa: ANN201 - transformers' type
        if self._tokenizer is None:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self.name_or_path, revision=self.revision, trust_remote_code=self.trust_remote_code
            )
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_as_server(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def vocab_size(self) -> int | None:
        return len(self.tokenizer)

    def decode(self, ids: Sequence[int]) -> str | None:
        return self.tokenizer.decode(list(ids))


@dataclass
class ServerTokenSource:
    """The server's own ``/tokenize`` and ``/detokenize``, for a model with no local copy."""

    model_name: str
    #: ``tokenize(text, add_special_tokens)`` through the server's ``/tokenize``.
    tokenize: Callable[[str, bool], list[int]]
    #: ``detokenize(ids)`` through the server's ``/detokenize``; None: text prompts refused.
    detokenize: Callable[[Sequence[int]], str] | None = None

    @property
    def key(self) -> str:
        return f"server:{self.model_name}"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for start in range(0, len(text), CORPUS_CHUNK_CHARS):
            ids.extend(self.tokenize(text[start : start + CORPUS_CHUNK_CHARS], False))
        return ids

    def count_as_server(self, text: str) -> int:
        return len(self.tokenize(text, True))

    def vocab_size(self) -> int | None:
        return None

    def decode(self, ids: Sequence[int]) -> str | None:
        return None if self.detokenize is None else self.detokenize(ids)


@dataclass(frozen=True, eq=False)
class Prompt:
    length: int
    ids: array  # array('I') of exactly ``length`` token ids
    header_tokens: int
    build_s: float
    text: str | None = None  # only for text prompts
    text_tokens: int | None = None  # what the served tokenizer counted in ``text``
    #: The needle planted in it and the question it ends with; None when it carries none.
    probe: Probe | None = None

    @property
    def token_count(self) -> int:
        """Tokens the server will read: the ids, or the text as its tokenizer counts it."""
        return len(self.ids) if self.text is None else (self.text_tokens or 0)


def _safe(key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-._" else "_" for c in key)[-48:]
    return f"{readable}-{digest}"


class PromptBuilder:
    def __init__(self, source: TokenSource, cache_dir: Path, seed: int = 0):
        self.source = source
        self.seed = seed
        self.cache_dir = Path(cache_dir) / _safe(source.key)
        self._corpus: array | None = None
        self._nonce_pool: tuple[int, ...] | None = None
        self._probe_kind: str | None = None

    def corpus_ids(self) -> array:
        if self._corpus is None:
            path = self.cache_dir / f"corpus-{self.seed}.u32"
            cached = _read_ids(path)
            if cached is None:
                ids = array("I", self.source.encode(generate_corpus(CORPUS_CHARS, self.seed)))
                if len(ids) < 1024:
                    raise PromptError(f"the corpus tokenized to only {len(ids)} tokens")
                _write_ids(path, ids)
                cached = ids
            self._corpus = cached
        return self._corpus

    def body(self, length: int) -> array:
        """``length`` ids of corpus text from a seeded offset; cached on disk."""
        path = self.cache_dir / f"body-{self.seed}-{length}.u32"
        cached = _read_ids(path)
        if cached is not None and len(cached) == length:
            return cached
        corpus = self.corpus_ids()
        offset = random.Random(f"{self.seed}:{length}").randrange(len(corpus))
        rotated = corpus[offset:] + corpus[:offset]
        ids = rotated * (length // len(rotated) + 1)
        del ids[length:]
        _write_ids(path, ids)
        return ids

    def nonce_pool(self) -> tuple[int, ...]:
        """Ids that occur in natural text (no special tokens), in id order."""
        if self._nonce_pool is None:
            self._nonce_pool = tuple(sorted(set(self.corpus_ids())))
        return self._nonce_pool

    def nonce(self, run_key: str, index: int) -> array:
        """``NONCE_TOKENS`` ids for point ``index`` of run ``run_key``.

        The first id is the pool's entry at a run-seeded offset plus ``index``, so every point
        of a run (indices below the pool's size) starts with its own token; the others are
        drawn from the run key and index, so runs differ from each other as well.
        """
        return nonce_ids(self.nonce_pool(), run_key, index)

    def build(
        self,
        length: int,
        tag: str,
        text: bool = False,
        nonce: Sequence[int] = (),
        probe_key: str | None = None,
        depth: float = 0.0,
    ) -> Prompt:
        """``nonce``, then ``tag``, then the body: exactly ``length`` tokens.

        With ``probe_key`` (ids prompts only: a text prompt is re-fitted at its end, where the
        question sits) a needle is planted at ``depth`` of the body and the question ends it.
        """
        started = time.perf_counter()
        header = array("I", nonce) + array("I", self.source.encode(f"{tag}\n"))
        if len(header) >= length:
            raise PromptError(f"the header alone is {len(header)} tokens, at least {length}")
        ids = self.body(length)[:]  # a copy: the cached body stays pristine
        ids[: len(header)] = header
        probe = None
        if probe_key is not None and not text:
            probe = self.plant(ids, len(header), probe_key, depth)
        self.verify(ids, length)
        prompt_text = self._fit_text(ids, length) if text else None
        return Prompt(
            length,
            ids,
            len(header),
            time.perf_counter() - started,
            prompt_text,
            self.source.count_as_server(prompt_text) if prompt_text is not None else None,
            probe,
        )

    def probe_kind(self) -> str:
        """``tokens`` when the tokenizer has the needle vocabulary as single tokens, else
        ``text`` (a natural-language pass key)."""
        if self._probe_kind is None:
            reserved = (QUESTION_TOKEN, needle_token(0), needle_token(NEEDLE_VALUES - 1))
            single = all(len(self.source.encode(token)) == 1 for token in reserved)
            self._probe_kind = "tokens" if single else "text"
        return self._probe_kind

    def plant(self, ids: array, start: int, key: str, depth: float) -> Probe:
        """Overwrite ``ids`` (in place, its length kept) with a needle at ``depth`` of the
        span after ``start`` and the question at its end; the probe says what was planted."""
        kind = self.probe_kind()
        expected = probe_value(key, kind)
        needle_text, question_text = probe_texts(kind, expected)
        needle = array("I", self.source.encode(needle_text))
        question = array("I", self.source.encode(question_text))
        span = len(ids) - start - len(needle) - len(question)
        if span < 0:
            raise PromptError(
                f"a prompt of {len(ids)} tokens has no room for the probe: the header, needle "
                f"and question take {start + len(needle) + len(question)}"
            )
        at = start + round(min(max(depth, 0.0), 1.0) * span)
        ids[at : at + len(needle)] = needle
        ids[len(ids) - len(question) :] = question
        return Probe(kind, expected, at / max(len(ids) - 1, 1), needle_text, question_text, at)

    def extend(self, prompt: Prompt, suffix_tokens: int, tag: str, nonce: Sequence[int]) -> Prompt:
        """``prompt``'s ids exactly, then ``suffix_tokens`` new ones: ``nonce``, ``tag``, text.

        A warm follow-up: its prefix is token for token the cold prompt (ids, never text,
        so nothing re-tokenizes across the join), and its suffix opens with its own nonce, so
        two follow-ups of one prefix share nothing after it.
        """
        if prompt.text is not None:
            raise PromptError("a follow-up extends token ids; text prompts would re-tokenize")
        started = time.perf_counter()
        header = array("I", nonce) + array("I", self.source.encode(f"\n{tag}\n"))
        if len(header) >= suffix_tokens:
            raise PromptError(
                f"the suffix's header alone is {len(header)} tokens, at least {suffix_tokens}"
            )
        suffix = self.body(suffix_tokens)[:]
        suffix[: len(header)] = header
        probe = prompt.probe
        if probe is not None:
            # The question again at the suffix's end: the answer is read through the prefix's
            # cached KV, so a follow-up proves the resident cache right, not only fast.
            question = array("I", self.source.encode(probe.question_text))
            if len(header) + len(question) >= suffix_tokens:
                raise PromptError(
                    f"a suffix of {suffix_tokens} tokens has no room for its header and question"
                )
            suffix[suffix_tokens - len(question) :] = question
            total = prompt.length + suffix_tokens
            probe = dataclasses.replace(probe, depth=probe.position / (total - 1))
        ids = prompt.ids + suffix
        self.verify(ids, prompt.length + suffix_tokens)
        return Prompt(
            prompt.length + suffix_tokens,
            ids,
            prompt.header_tokens,
            prompt.build_s + time.perf_counter() - started,
            probe=probe,
        )

    def verify(self, ids: Sequence[int], length: int) -> None:
        """Before timing: exactly ``length`` ids, all inside the tokenizer's vocabulary."""
        if len(ids) != length:
            raise PromptError(f"prompt has {len(ids)} tokens, the point needs {length}")
        limit = self.source.vocab_size()
        if limit is not None and max(ids) >= limit:
            raise PromptError(
                f"prompt holds token id {max(ids)}, outside the vocabulary of {limit}"
            )

    def check_text_prompts(self) -> None:
        """Raise :class:`PromptError` unless ids can be decoded to text (text prompts)."""
        try:
            decoded = self.source.decode(self.corpus_ids()[:8])
        except Exception as exc:  # noqa: BLE001 - whatever the server said, it cannot decode
            decoded, why = None, f" ({type(exc).__name__}: {exc})"
        else:
            why = ""
        if decoded is None:
            raise PromptError(
                "--longctx-prompt-format=text needs a tokenizer that decodes ids: the served "
                f"model's locally, or the server's /detokenize{why}; expected "
                "--longctx-prompt-format=ids"
            )

    def _fit_text(self, ids: array, length: int) -> str:
        """Text that the served tokenizer reads as exactly ``length`` tokens.

        Decoding natural-text ids and re-encoding them gives the same ids except where the
        cut and the header meet the text, and the server adds its special tokens: a few
        rounds of trimming or extending the id span close the gap.
        """
        if self.source.decode(ids[:1]) is None:
            raise PromptError(
                "--longctx-prompt-format=text needs a tokenizer that decodes ids: the served "
                "model's locally, or the server's /detokenize; expected "
                "--longctx-prompt-format=ids"
            )
        source = ids + self.body(2 * length)[: length // 2 + 64]
        take, count = length, -1
        for _ in range(TEXT_FIT_ATTEMPTS):
            text = self.source.decode(source[:take])
            count = self.source.count_as_server(text)
            if count == length:
                return text
            take = max(1, min(len(source), take + length - count))
        raise PromptError(
            f"could not make text of exactly {length} tokens in {TEXT_FIT_ATTEMPTS} attempts "
            f"(last: {count})"
        )


def nonce_ids(pool: Sequence[int], run_key: str, index: int) -> array:
    """``NONCE_TOKENS`` ids from ``pool`` for ``index`` under ``run_key``: the first is the
    pool's entry at a key-seeded offset plus ``index`` (so indices below the pool's size each
    start with their own token), the others drawn from the key and index. Pure, so another
    process (the background streams) draws the same nonces from the same pool."""
    digest = hashlib.sha256(f"{run_key}:{index}".encode()).digest()
    offset = int.from_bytes(hashlib.sha256(run_key.encode()).digest()[:8], "big")
    ids = [pool[(offset + index) % len(pool)]]
    for k in range(1, NONCE_TOKENS):
        ids.append(pool[int.from_bytes(digest[4 * k : 4 * k + 4], "big") % len(pool)])
    return array("I", ids)


def _read_ids(path: Path) -> array | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    ids = array("I")
    ids.frombytes(data)
    return ids


def _write_ids(path: Path, ids: array) -> None:
    write_atomically(path, ids.tobytes())
