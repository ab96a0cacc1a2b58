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

import hashlib
import json
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
from pytest_longctx.prompts.needle import (
    NEEDLE_KEYS,
    NEEDLE_VALUES,
    keyed_needle_token,
    keyed_question_token,
    needle_token,
)
from pytest_longctx.prompts.probe import (
    Needle,
    Probe,
    needle_depths,
    probe_texts,
    probe_values,
)

CORPUS_CHARS = 1_000_000
NONCE_TOKENS = 4
CORPUS_CHUNK_CHARS = 16_000  # what one /tokenize request carries when the server tokenizes
TEXT_FIT_ATTEMPTS = 8
#: Tokens a text prompt keeps free of needles before its question: the fitting trims or
#: extends the text there by a few tokens.
TEXT_PROBE_MARGIN = 32


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


#: ``tokenizer_config.json`` keys that change nothing the ``tokenizers`` library's own file
#: does not already say: a config with any other key (``add_bos_token``, ``legacy``,
#: ``add_prefix_space``, ``auto_map``, ...) may make transformers rebuild the tokenizer on load.
PLAIN_CONFIG_KEYS = frozenset(
    {
        "backend",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "model_max_length",
        "tokenizer_class",
        "added_tokens_decoder",
    }
)
#: The classes that are the ``tokenizers`` file itself, wrapped (transformers 4 and 5 names).
PLAIN_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def plain_tokenizer_file(folder: Path) -> Path | None:
    """The folder's ``tokenizer.json`` when transformers would load it unchanged, else None.

    Such a tokenizer is read with the ``tokenizers`` library alone: the same ids, counts and
    text as ``AutoTokenizer``, without importing transformers, which imports torch (about
    7 s of CPU in every session that builds prompts)."""
    file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text())
        body = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(config, dict)
        or config.get("tokenizer_class") not in PLAIN_TOKENIZER_CLASSES
        or not set(config) <= PLAIN_CONFIG_KEYS
        or body.get("truncation") is not None
        or body.get("padding") is not None
    ):
        return None
    return file


@dataclass
class LocalTokenSource:
    """The model's tokenizer from a local folder or the Hub, at its pinned revision: a plain
    ``tokenizer.json`` (:func:`plain_tokenizer_file`) through the ``tokenizers`` library,
    anything else through ``AutoTokenizer``."""

    name_or_path: str
    revision: str | None = None
    trust_remote_code: bool = False
    _tokenizer: object = field(default=None, repr=False)
    _plain: object = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.name_or_path}@{self.revision or 'local'}"

    @property
    def plain(self):  # noqa: ANN201 - tokenizers' type
        """The ``tokenizers.Tokenizer`` of a plain local tokenizer, else None."""
        if self._plain is None:
            folder = Path(self.name_or_path)
            file = plain_tokenizer_file(folder) if self.revision is None else None
            if file is None:
                self._plain = False
            else:
                from tokenizers import Tokenizer

                self._plain = Tokenizer.from_file(str(file))
        return self._plain or None

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
        if self.plain is not None:
            return list(self.plain.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_as_server(self, text: str) -> int:
        if self.plain is not None:
            return len(self.plain.encode(text).ids)
        return len(self.tokenizer(text)["input_ids"])

    def vocab_size(self) -> int | None:
        if self.plain is not None:
            return int(self.plain.get_vocab_size(with_added_tokens=True))
        return len(self.tokenizer)

    def decode(self, ids: Sequence[int]) -> str | None:
        if self.plain is not None:
            return str(self.plain.decode(list(ids), skip_special_tokens=False))
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
    """One measured prompt: exactly ``length`` token ids of text, its nonce and tag first."""

    length: int
    ids: array  # array('I') of exactly ``length`` token ids
    header_tokens: int  # the nonce's and the readable tag's tokens, before the body
    build_s: float  # seconds it took to build
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
        needles: int = 1,
    ) -> Prompt:
        """``nonce``, then ``tag``, then the body: exactly ``length`` tokens.

        With ``probe_key``, ``needles`` needles are planted, each under its own key, the first
        at ``depth`` of the body and the others at depths of their own; the question, naming
        the first, ends it. A text prompt is fitted to its length before the question, which
        is appended as text, so the fitting never cuts it.
        """
        started = time.perf_counter()
        header = array("I", nonce) + array("I", self.source.encode(f"{tag}\n"))
        if len(header) >= length:
            raise PromptError(f"the header alone is {len(header)} tokens, at least {length}")
        ids = self.body(length)[:]  # a copy: the cached body stays pristine
        ids[: len(header)] = header
        probe = None
        if probe_key is not None:
            depths = needle_depths(depth, needles)
            margin = TEXT_PROBE_MARGIN if text else 0
            probe = self.plant(ids, len(header), probe_key, depths, margin)
        self.verify(ids, length)
        prompt_text = self._fit_text(ids, length, probe) if text else None
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
            last_key, last_value = len(NEEDLE_KEYS) - 1, NEEDLE_VALUES - 1
            reserved = (
                needle_token(0),
                needle_token(last_value),
                keyed_question_token(0),
                keyed_needle_token(0, 0),
                keyed_needle_token(last_key, last_value),
            )
            single = all(len(self.source.encode(token)) == 1 for token in reserved)
            self._probe_kind = "tokens" if single else "text"
        return self._probe_kind

    def plant(
        self, ids: array, start: int, key: str, depths: Sequence[float], margin: int = 0
    ) -> Probe:
        """Overwrite ``ids`` (in place, its length kept) with a needle per depth, each under
        its own key, in the span after ``start``, and the question naming the first at its
        end; the probe says what was planted. The needles never overlap: each sits at its
        depth of the span the needles leave free, after those above it; ``margin`` tokens
        before the question stay free of them."""
        kind = self.probe_kind()
        count = min(len(depths), len(NEEDLE_KEYS))
        values = probe_values(key, kind, count)
        texts = [probe_texts(kind, values[k], k) for k in range(count)]
        encoded = [array("I", self.source.encode(needle)) for needle, _ in texts]
        question = array("I", self.source.encode(texts[0][1]))
        span = len(ids) - start - sum(map(len, encoded)) - len(question) - margin
        if span < 0:
            raise PromptError(
                f"a prompt of {len(ids)} tokens has no room for the probe: the header, "
                f"{count} needle(s) and question take {len(ids) - span}"
            )
        planted: dict[int, Needle] = {}
        offset = 0
        for k in sorted(range(count), key=lambda k: min(max(depths[k], 0.0), 1.0)):
            at = start + round(min(max(depths[k], 0.0), 1.0) * span) + offset
            ids[at : at + len(encoded[k])] = encoded[k]
            offset += len(encoded[k])
            planted[k] = Needle(k, values[k], at, texts[k][0])
        ids[len(ids) - len(question) :] = question
        needles = tuple(planted[k] for k in range(count))
        first = needles[0]
        return Probe(
            kind,
            first.value,
            first.position / max(len(ids) - 1, 1),
            first.text,
            texts[0][1],
            first.position,
            first.key,
            needles,
        )

    def extend(
        self, prompt: Prompt, suffix_tokens: int, tag: str, nonce: Sequence[int], ask: int = 0
    ) -> Prompt:
        """``prompt``'s ids exactly, then ``suffix_tokens`` new ones: ``nonce``, ``tag``, text.

        A warm follow-up: its prefix is token for token the cold prompt (ids, never text,
        so nothing re-tokenizes across the join), and its suffix opens with its own nonce, so
        two follow-ups of one prefix share nothing after it. A probed prefix's follow-up ends
        with the question naming its needle ``ask`` (counted round the needles it holds).
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
            # A question at the suffix's end: the answer is read through the prefix's cached
            # KV, from a needle at another depth, so a follow-up proves the resident cache
            # right, not only fast.
            probe = probe.asking(ask, prompt.length + suffix_tokens)
            question = array("I", self.source.encode(probe.question_text))
            if len(header) + len(question) >= suffix_tokens:
                raise PromptError(
                    f"a suffix of {suffix_tokens} tokens has no room for its header and question"
                )
            suffix[suffix_tokens - len(question) :] = question
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

    def _fit_text(self, ids: array, length: int, probe: Probe | None = None) -> str:
        """Text that the served tokenizer reads as exactly ``length`` tokens, ending with the
        probe's question when there is one.

        Decoding natural-text ids and re-encoding them gives the same ids except where the
        cut and the header meet the text, and the server adds its special tokens: a few
        rounds of trimming or extending the id span close the gap. The question is appended
        as text after the span, and every needle must still be in the text.
        """

        def decode(span: Sequence[int]) -> str:
            text = self.source.decode(span)
            if text is None:
                raise PromptError(
                    "--longctx-prompt-format=text needs a tokenizer that decodes ids: the "
                    "served model's locally, or the server's /detokenize; expected "
                    "--longctx-prompt-format=ids"
                )
            return text

        decode(ids[:1])
        question = "" if probe is None else probe.question_text
        body = ids[: len(ids) - len(self.source.encode(question))] if question else ids
        source = body + self.body(2 * length)[: length // 2 + 64]
        take, count = len(body), -1
        for _ in range(TEXT_FIT_ATTEMPTS):
            text = decode(source[:take]) + question
            count = self.source.count_as_server(text)
            if count == length:
                # a needle in words is known by its value: the decoded text may space it anew
                lost = (
                    []
                    if probe is None
                    else [
                        n.text
                        for n in probe.planted
                        if (n.text if probe.kind == "tokens" else n.value) not in text
                    ]
                )
                if lost:
                    raise PromptError(f"the text of {length} tokens lost its needle(s) {lost}")
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
