"""The fidelity probe a measured prompt carries: a needle planted at a depth, the question last.

The prompt stays exactly L tokens: the needle and the question overwrite body tokens, never
add any. Two forms, picked by the served tokenizer:

* ``tokens``: the tokenizer has the needle vocabulary (prompts/needle.py, the embedded
  models): the needle is one value token, the question one token, the answer the value's
  token.
* ``text``: any other tokenizer: a natural-language pass key (digits) that an instruct model
  repeats under greedy decoding, encoded with the model's own tokenizer.

Either way the answer is the first run of digits in the completion (:func:`parse_answer`),
read after a reasoning block (``<think>...</think>``) when the model wrote one first: a
reasoning model thinks within the point's decode length, its answer follows.

Whether the served model answers the probe at all is learned before the first point: the
warm-up requests carry it at a short length (:func:`learn`). ``auto`` judges the points'
answers only of a model that answered there; another keeps its figures, its answers recorded
as ``not_checked`` with the reason.

A prompt may hold several needles, each under its own key (a name: "the pass key of Bob"), at
depths of their own; its question names one key. The cold prompt asks the first, each warm
follow-up of its prefix another, so reuse proves the cached KV right at several depths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_longctx.core.sizes import format_size

from .needle import (
    NEEDLE_KEYS,
    NEEDLE_VALUES,
    keyed_needle_token,
    keyed_question_token,
    needle_token,
    parse_answer,
)

#: Where the needle sits, as a fraction of the span between the header and the question:
#: start, end, middle and between, in an order that gives neighbouring points other depths.
DEPTHS = (0.0, 0.5, 1.0, 0.25, 0.75, 0.125, 0.875, 0.375, 0.625)

PASS_KEY_DIGITS = 5
TEXT_NEEDLE = (
    "\nThe pass key of {name} is {value}. Remember it. {value} is the pass key of {name}.\n"
)
TEXT_QUESTION = "\nWhat is the pass key of {name}? The pass key of {name} is"

PROBE_KINDS = ("tokens", "text")


@dataclass(frozen=True)
class Needle:
    """One needle a prompt holds: its key (an index of :data:`NEEDLE_KEYS`), its value, the
    index of its first token and its text."""

    key: int
    value: str
    position: int
    text: str


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
    #: The key the question names (an index of :data:`NEEDLE_KEYS`).
    key: int = 0
    #: Every needle the prompt holds, the asked one among them; a follow-up asks another.
    planted: tuple[Needle, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "expected": self.expected,
            "depth": round(self.depth, 4),
            "key": NEEDLE_KEYS[self.key],
            "needles": len(self.planted) or 1,
            "needle": self.needle_text,
            "question": self.question_text,
        }

    def asking(self, key: int, length: int) -> Probe:
        """The same prompt's needles, the question naming the one planted under ``key`` (the
        count of needles wraps around), its depth in a prompt now ``length`` tokens long."""
        needle = self.planted[key % len(self.planted)] if self.planted else None
        if needle is None:
            return dataclasses.replace(self, depth=self.position / max(length - 1, 1))
        return dataclasses.replace(
            self,
            expected=needle.value,
            depth=needle.position / max(length - 1, 1),
            needle_text=needle.text,
            question_text=probe_texts(self.kind, needle.value, needle.key)[1],
            position=needle.position,
            key=needle.key,
        )


def probe_depth(index: int) -> float:
    """The needle's depth for the point at ``index`` of the plan."""
    return DEPTHS[index % len(DEPTHS)]


def needle_depths(depth: float, count: int) -> tuple[float, ...]:
    """The depths of a prompt's ``count`` needles: the asked one's ``depth`` first, then the
    next ones of :data:`DEPTHS` after it, so every needle of the prompt has a depth of its own."""
    start = DEPTHS.index(depth) if depth in DEPTHS else 0
    rest = [DEPTHS[(start + i) % len(DEPTHS)] for i in range(len(DEPTHS))]
    ordered = [depth, *(d for d in rest if d != depth)]
    if not 1 <= count <= len(ordered):
        raise ValueError(f"{count} needles: expected 1..{len(ordered)}")
    return tuple(ordered[:count])


def probe_value(key: str, kind: str) -> str:
    """The expected answer for ``key`` (run and point): a value token's number, or a pass key
    of :data:`PASS_KEY_DIGITS` digits without a leading zero."""
    number = int.from_bytes(hashlib.sha256(f"needle:{key}".encode()).digest()[:8], "big")
    if kind == "tokens":
        return str(number % NEEDLE_VALUES)
    low = 10 ** (PASS_KEY_DIGITS - 1)
    return str(low + number % (9 * low))


def probe_values(key: str, kind: str, count: int) -> tuple[str, ...]:
    """``count`` distinct values for one prompt's needles (the first is :func:`probe_value`'s):
    an answer read from the wrong needle is then a wrong answer."""
    values: list[str] = []
    for index in range(count):
        value = int(probe_value(key if index == 0 else f"{key}:{index}", kind))
        while str(value) in values:
            value = value + 1 if kind == "text" else (value + 1) % NEEDLE_VALUES
            if kind == "text" and value >= 10**PASS_KEY_DIGITS:
                value = 10 ** (PASS_KEY_DIGITS - 1)
        values.append(str(value))
    return tuple(values)


def probe_texts(kind: str, value: str, key: int = 0) -> tuple[str, str]:
    """The needle planted under ``key`` and the question naming it, as text (what the plan
    shows and the tokenizer encodes)."""
    if kind == "tokens":
        return keyed_needle_token(key, int(value)), keyed_question_token(key)
    name = NEEDLE_KEYS[key]
    return TEXT_NEEDLE.format(value=value, name=name), TEXT_QUESTION.format(name=name)


def judge_answer(
    expected: str, completion: str | None, kind: str = "text"
) -> tuple[str, str | None]:
    """``(verdict, answer)``: ``correct`` or ``wrong`` from the completion's first digits
    (``completion`` is the text after any reasoning block: :func:`after_reasoning`).

    A ``tokens`` probe is stricter: its answer is the value token the completion opens with
    (None when it opens with anything else), so a model that happens to write the number in
    ordinary text (the value space is small), or names it only after another token, does not
    pass."""
    text = completion or ""
    if kind == "tokens":
        opening = _VALUE_TOKEN.match(text.lstrip())
        answer = None if opening is None else parse_answer(opening.group())
    else:
        answer = parse_answer(text)
    return ("correct" if answer == expected else "wrong"), answer


#: The blocks a reasoning model writes before its answer, as (opening, closing) words
#: (DeepSeek-R1, QwQ and Qwen3 write ``<think>``): the answer is read after the last one closed.
REASONING_BLOCKS = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
)


def after_reasoning(completion: str) -> tuple[str | None, int]:
    """``(answer text, characters of reasoning before it)``: the completion after the last
    reasoning block it closed (the whole completion when it wrote none). The text is None when
    a block opened and had not closed by the completion's end: the model was still thinking
    when its decode length ran out, and there is no answer to judge."""
    start = 0
    for _, closing in REASONING_BLOCKS:
        end = completion.rfind(closing)
        if end >= 0:
            start = max(start, end + len(closing))
    rest = completion[start:]
    opened = [at for at in (rest.find(opening) for opening, _ in REASONING_BLOCKS) if at >= 0]
    if not opened:
        return rest, start
    if rest[: min(opened)].strip():  # an answer, then more thinking: the answer counts
        return rest[: min(opened)], start
    return None, len(completion)


#: A value token (:func:`needle_token`) at the start of a completion.
_VALUE_TOKEN = re.compile(re.escape(needle_token(0)).replace("0", r"\d+"))

#: ``--longctx-fidelity``: what a wrong answer does.
FIDELITY_MODES = ("auto", "check", "record", "off")
FIDELITY_HELP = (
    "what a wrong answer to the probe each measured prompt carries does: 'check' fails the "
    "point, 'record' keeps it passed, 'auto' (default) checks lengths within the model's "
    "advertised context and records beyond, when the served model answered the probe in the "
    "warm-ups (else its answers are recorded, not checked), 'off' plants no probe"
)


def judgement(mode: str, length: int, advertised: int | None) -> str:
    """``check``, ``record`` or ``off`` for a point of ``length`` prompt tokens: ``auto``
    checks within the model's advertised context (its ``max_position_embeddings``; unknown:
    checked) and records beyond it, where a model is not claimed to answer."""
    if mode != "auto":
        return mode
    return "check" if advertised is None or length <= advertised else "record"


@dataclass(frozen=True)
class ProbeLesson:
    """Whether the served model answers the probe, as the warm-ups showed it before the first
    point (:func:`learn`): ``auto`` judges the points' answers only when it does, whatever
    order the points then run in."""

    #: The served model answered the probe there: its points' answers are judged.
    follows: bool
    #: The warm-ups' prompt length, and how many asked the probe and were answered right.
    length: int
    asked: int
    correct: int
    #: The served model's name, as the server gives it.
    model: str = ""
    #: The first answer there that was not right, in words ('' when none was wrong).
    shown: str = ""

    @property
    def reason(self) -> str:
        """Why a model that does not follow the probe has its answers recorded, not judged."""
        if self.follows:
            return ""
        named = f"the served model {self.model}" if self.model else "the served model"
        unjudged = (
            "its answers are recorded, not checked (--longctx-fidelity=check checks them)"
        )
        if not self.asked:
            return (
                f"no warm-up asked the probe (--longctx-warmup-prompts=0): whether {named} "
                f"answers it is not known, so {unjudged}"
            )
        shown = f"; {self.shown}" if self.shown else ""
        return (
            f"{named} did not answer the fidelity probe in the warm-up at "
            f"{format_size(self.length)} tokens ({self.correct} of {self.asked} right{shown}): "
            f"{unjudged}"
        )


def learn(verdicts: Sequence[Mapping[str, Any]], length: int, model: str = "") -> ProbeLesson:
    """What the warm-ups' ``verdicts`` (:func:`fidelity_verdict` of each, at ``length``
    tokens) teach: the model follows the probe when at least one warm-up was answered right
    and no more were answered wrong or not at all than right."""
    correct = sum(verdict.get("verdict") == "correct" for verdict in verdicts)
    missed = [verdict for verdict in verdicts if verdict.get("verdict") != "correct"]
    shown = ""
    if missed:
        first = missed[0]
        if first.get("verdict") == "wrong":
            shown = f"expected {first.get('expected')}, answered {first.get('answer')}"
        else:
            shown = str(first.get("reason") or "no answer")
        if first.get("completion") is not None:
            shown += f" (completion {str(first['completion'])[:40]!r})"
    return ProbeLesson(
        follows=correct >= 1 and correct >= len(missed),
        length=length,
        asked=len(verdicts),
        correct=correct,
        model=model,
        shown=shown,
    )


def fidelity_verdict(
    probe: Probe | None,
    completion: str | None,
    how: str,
    why_unprobed: str = "",
    unjudged: str = "",
) -> dict[str, Any]:
    """The record's ``fidelity``: what was asked, what came back and whether it is right.

    ``how`` is :func:`judgement`'s word for the point; ``completion`` the head of the
    completion text (None when none was read); ``unjudged``, why the answer is recorded but
    not judged (``auto`` on a model that did not answer the probe in the warm-ups)."""
    if how == "off":
        return {"verdict": "not_checked", "reason": "--longctx-fidelity=off"}
    if probe is None:
        return {"verdict": "not_checked", "reason": why_unprobed or "the prompt carries no probe"}
    entry: dict[str, Any] = {
        "expected": probe.expected,
        "depth": round(probe.depth, 4),
        "key": NEEDLE_KEYS[probe.key],
        "needles": len(probe.planted) or 1,
        "kind": probe.kind,
        "mode": how,
    }
    answered = answer_verdict(entry, probe, completion)
    return unjudged_verdict(answered, unjudged) if unjudged else answered


def answer_verdict(entry: dict[str, Any], probe: Probe, completion: str | None) -> dict[str, Any]:
    """``entry`` (what was asked) with what came back and its verdict."""
    if completion is None:
        return {**entry, "answer": None, "verdict": "not_checked", "reason": "no completion text"}
    answer_text, reasoning = after_reasoning(completion)
    if reasoning:
        entry = {**entry, "reasoning_chars": reasoning}
    if answer_text is None:
        return {
            **entry,
            "answer": None,
            "completion": completion[:80],
            "verdict": "not_checked",
            "reason": (
                "still reasoning when the completion ended (a block it opened never closed): "
                "no answer to judge within the decode length"
            ),
        }
    verdict, answer = judge_answer(probe.expected, answer_text, probe.kind)
    return {
        **entry,
        "answer": answer,
        "completion": answer_text[:80],
        "verdict": verdict,
        "judged_by": (
            "the value token the completion opens with"
            if probe.kind == "tokens"
            else "the first digits of the completion (the pass key)"
        )
        + (" after its reasoning block" if reasoning else ""),
    }


def unjudged_verdict(entry: dict[str, Any], why: str) -> dict[str, Any]:
    """An ``entry`` whose prompt carried the probe, recorded but not judged, for ``why``:
    ``not_checked``, what it would have been kept as ``answered``. An entry without a probe
    keeps its own reason."""
    if "expected" not in entry:
        return entry
    kept = {key: value for key, value in entry.items() if key not in ("judged_by", "reason")}
    return {**kept, "answered": entry["verdict"], "verdict": "not_checked", "reason": why}


def requests_verdict(
    probe: Probe | None,
    heads: Sequence[str | None],
    how: str,
    why_unprobed: str = "",
    unjudged: str = "",
) -> dict[str, Any]:
    """A concurrency level's ``fidelity``: each request carries the level's probe and each
    answer is judged. The level is wrong when any request is (the first wrong one is shown),
    correct when every one is; with ``unjudged``, recorded so but not judged."""
    each = [fidelity_verdict(probe, head, how, why_unprobed) for head in heads]
    wrong = [index for index, entry in enumerate(each) if entry["verdict"] == "wrong"]
    correct = sum(entry["verdict"] == "correct" for entry in each)
    unread = [index for index, entry in enumerate(each) if entry["verdict"] == "not_checked"]
    shown = dict(each[wrong[0] if wrong else (unread[0] if unread else 0)])
    verdict = "wrong" if wrong else ("correct" if correct == len(each) else "not_checked")
    shown.update(verdict=verdict, requests=len(each), correct_requests=correct)
    if wrong:
        shown["wrong_requests"] = wrong
    if verdict == "not_checked" and probe is not None and how != "off":
        shown["reason"] = f"request {unread[0]}: {shown.get('reason', '')}"
    return unjudged_verdict(shown, unjudged) if unjudged else shown
