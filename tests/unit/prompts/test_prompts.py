"""Prompts: exact length, and a first token of their own for every point of a run."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_longctx.prompts import (
    NONCE_TOKENS,
    Probe,
    PromptBuilder,
    fidelity_verdict,
    judgement,
    learn,
    requests_verdict,
)
from pytest_longctx.prompts.needle import (
    NEEDLE_KEYS,
    keyed_needle_token,
    keyed_question_token,
    parse_answer,
)
from pytest_longctx.prompts.probe import DEPTHS, after_reasoning, probe_depth

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


# --- the fidelity probe ------------------------------------------------------------------------


class CharSource(WordSource):
    """A tokenizer without the needle vocabulary: one id per character."""

    key = "chars"

    def encode(self, text: str) -> list[int]:
        return [ord(char) % VOCAB for char in text]


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_probed_prompt_keeps_its_length_and_nonce_and_ends_with_the_question(
    builder: PromptBuilder, depth: float
) -> None:
    nonce = builder.nonce("run-a", 5)
    plain = builder.build(1024, "tag", nonce=nonce)
    prompt = builder.build(1024, "tag", nonce=nonce, probe_key="run-a:5", depth=depth)
    probe = prompt.probe
    assert probe is not None and probe.kind == "tokens"
    assert len(prompt.ids) == 1024 and list(prompt.ids[:NONCE_TOKENS]) == list(nonce)
    source = WordSource()
    assert prompt.ids[-1] == source.encode(keyed_question_token(0))[0]
    needle = source.encode(keyed_needle_token(0, int(probe.expected)))[0]
    assert prompt.ids[probe.position] == needle
    first, last = plain.header_tokens, 1024 - 2  # right after the header, right before the end
    assert abs(probe.position - (first + depth * (last - first))) <= 1
    assert probe.depth == pytest.approx(probe.position / 1023)
    # Only the needle and the question differ from the prompt without a probe.
    differing = [i for i in range(1024) if prompt.ids[i] != plain.ids[i]]
    assert set(differing) <= {probe.position, 1023}


def test_the_probe_changes_with_the_point(builder: PromptBuilder) -> None:
    probes = [
        builder.build(
            512,
            "tag",
            nonce=builder.nonce("run-a", i),
            probe_key=f"run-a:{i}",
            depth=probe_depth(i),
        ).probe
        for i in range(9)
    ]
    assert len({probe.depth for probe in probes}) == 9
    assert len({probe.expected for probe in probes}) > 3


def test_a_tokenizer_without_the_needle_vocabulary_gets_a_pass_key_in_words(
    tmp_path: Path,
) -> None:
    builder = PromptBuilder(CharSource(), tmp_path)
    prompt = builder.build(2048, "tag", nonce=builder.nonce("r", 0), probe_key="r:0", depth=0.5)
    probe = prompt.probe
    assert probe is not None and probe.kind == "text"
    assert len(probe.expected) == 5 and probe.expected in probe.needle_text
    needle = CharSource().encode(probe.needle_text)
    question = CharSource().encode(probe.question_text)
    assert len(prompt.ids) == 2048
    assert list(prompt.ids[probe.position : probe.position + len(needle)]) == needle
    assert list(prompt.ids[-len(question) :]) == question


def test_a_follow_up_asks_again_at_its_end(builder: PromptBuilder) -> None:
    cold = builder.build(1024, "tag", nonce=builder.nonce("r", 0), probe_key="r:0", depth=0.25)
    warm = builder.extend(cold, 64, "question 1", builder.nonce("r", 9))
    assert warm.probe is not None and cold.probe is not None
    assert list(warm.ids[:1024]) == list(cold.ids)  # the prefix, token for token
    assert warm.ids[-1] == cold.ids[-1]  # the question, now at the end of the suffix
    assert warm.probe.expected == cold.probe.expected
    assert warm.probe.position == cold.probe.position
    assert warm.probe.depth == pytest.approx(cold.probe.position / (1024 + 64 - 1))


def test_a_prompt_holds_a_needle_per_key_at_depths_of_their_own(builder: PromptBuilder) -> None:
    nonce = builder.nonce("r", 2)
    plain = builder.build(1024, "tag", nonce=nonce)
    prompt = builder.build(1024, "tag", nonce=nonce, probe_key="r:2", depth=1.0, needles=4)
    probe = prompt.probe
    assert probe is not None and len(prompt.ids) == 1024
    assert [needle.key for needle in probe.planted] == [0, 1, 2, 3]
    assert len({needle.value for needle in probe.planted}) == 4  # a wrong needle is wrong
    source = WordSource()
    for needle in probe.planted:
        assert (
            prompt.ids[needle.position]
            == source.encode(keyed_needle_token(needle.key, int(needle.value)))[0]
        )
    # The asked needle at its depth (the end), the others at the next depths of the cycle.
    depths = [needle.position / 1023 for needle in probe.planted]
    assert depths[0] > 0.99 and depths[1] == pytest.approx(DEPTHS[3], abs=0.01)
    assert depths[2] == pytest.approx(DEPTHS[4], abs=0.01)
    assert (probe.key, probe.expected, probe.position) == (0, *_first(probe))
    assert prompt.ids[-1] == source.encode(keyed_question_token(0))[0]
    differing = {i for i in range(1024) if prompt.ids[i] != plain.ids[i]}
    assert differing <= {needle.position for needle in probe.planted} | {1023}


def _first(probe: Probe) -> tuple[str, int]:
    return probe.planted[0].value, probe.planted[0].position


def test_each_follow_up_asks_the_needle_of_its_own_key(builder: PromptBuilder) -> None:
    cold = builder.build(
        2048, "tag", nonce=builder.nonce("r", 0), probe_key="r:0", depth=0.0, needles=4
    )
    assert cold.probe is not None
    source = WordSource()
    for question in (1, 2, 3, 5):
        warm = builder.extend(cold, 64, f"question {question}", builder.nonce("r", 9), question)
        probe = warm.probe
        assert probe is not None and list(warm.ids[:2048]) == list(cold.ids)
        needle = cold.probe.planted[question % 4]
        assert (probe.key, probe.expected, probe.position) == (
            needle.key,
            needle.value,
            needle.position,
        )
        assert probe.depth == pytest.approx(needle.position / (2048 + 64 - 1))
        assert warm.ids[-1] == source.encode(keyed_question_token(needle.key))[0]
        assert probe.to_json()["key"] == NEEDLE_KEYS[needle.key]
    depths = {builder.extend(cold, 64, "q", (), q).probe.depth for q in range(1, 4)}
    assert len(depths) == 3 and cold.probe.depth not in depths


def test_text_needles_are_pass_keys_of_named_people(tmp_path: Path) -> None:
    builder = PromptBuilder(CharSource(), tmp_path)
    cold = builder.build(4096, "tag", nonce=(), probe_key="r:0", depth=0.5, needles=3)
    warm = builder.extend(cold, 128, "question 2", (), 2)
    assert cold.probe is not None and warm.probe is not None
    assert "The pass key of Alice is" in cold.probe.needle_text
    assert "What is the pass key of Carol?" in warm.probe.question_text
    assert warm.probe.expected in warm.probe.needle_text and "Carol" in warm.probe.needle_text
    text = "".join(chr(i) for i in warm.ids)  # CharSource keeps ASCII as it is
    assert text.count("Remember it.") == 3 and text.endswith(warm.probe.question_text)


def test_an_unprobed_build_carries_no_probe(builder: PromptBuilder) -> None:
    assert builder.build(512, "tag", nonce=builder.nonce("r", 0)).probe is None


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_text_prompt_carries_the_probe_and_ends_with_its_question(
    tmp_path: Path, depth: float
) -> None:
    """Text read by the embedded tokenizer as exactly the length, every needle in it, the
    question last (the server reads it as the ids prompt would end)."""
    from server_pool import embedded_model

    from pytest_longctx.prompts import LocalTokenSource

    source = LocalTokenSource(str(embedded_model("tiny-llama")))
    builder = PromptBuilder(source, tmp_path)
    prompt = builder.build(
        2048, "tag", text=True, nonce=builder.nonce("r", 1), probe_key="r:1", depth=depth, needles=3
    )
    assert prompt.text is not None and prompt.probe is not None
    assert source.count_as_server(prompt.text) == 2048 == prompt.text_tokens
    assert prompt.text.endswith(prompt.probe.question_text)
    assert len(prompt.probe.planted) == 3
    for needle in prompt.probe.planted:
        assert prompt.text.count(needle.text) == 1


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("<|needle-7|><|needle-7|>", "7"),
        (" 48213. The pass key is 48213.", "48213"),
        ("The pass key is **048213**", "48213"),
        ("I do not know.", None),
        ("", None),
    ],
)
def test_the_answer_is_the_first_digits(completion: str, answer: str | None) -> None:
    assert parse_answer(completion) == answer


def test_verdicts() -> None:
    probe = Probe("tokens", "7", 0.5, keyed_needle_token(0, 7), keyed_question_token(0), 512)
    right = fidelity_verdict(probe, "<|needle-7|><|needle-7|>", "check")
    assert right["verdict"] == "correct" and right["answer"] == "7" and right["expected"] == "7"
    assert right["depth"] == 0.5 and right["mode"] == "check" and right["judged_by"]
    # The number in ordinary text is not the needle's token: a random model's lucky digits.
    lucky = fidelity_verdict(probe, " 7 apples", "check")
    assert (lucky["verdict"], lucky["answer"]) == ("wrong", None)
    # Nor a needle named only after another token (a lost needle's "not found", then a guess).
    late = fidelity_verdict(probe, "<|question|><|needle-7|>", "check")
    assert (late["verdict"], late["answer"]) == ("wrong", None)
    wrong = fidelity_verdict(probe, "<|needle-17|>", "record")
    assert (wrong["verdict"], wrong["answer"], wrong["mode"]) == ("wrong", "17", "record")
    assert fidelity_verdict(probe, "x", "off") == {
        "verdict": "not_checked",
        "reason": "--longctx-fidelity=off",
    }
    unprobed = fidelity_verdict(None, "7", "check", "a warm-up carries no probe")
    assert unprobed == {"verdict": "not_checked", "reason": "a warm-up carries no probe"}


#: A token-form probe whose answer is the value 7, and a text-form one whose pass key is 48213.
TOKENS_PROBE = Probe("tokens", "7", 0.5, keyed_needle_token(0, 7), keyed_question_token(0), 512)
TEXT_PROBE = Probe("text", "48213", 0.5, "The pass key of Alice is 48213.", "What is", 512)


@pytest.mark.parametrize(
    ("completion", "answer", "reasoning"),
    [
        (" 48213.", " 48213.", 0),
        ("<think>Alice's key... 11111?</think> 48213", " 48213", 36),
        ("<think>a</think><think>b</think>48213", "48213", 32),
        ("<thinking>hmm</thinking>\n48213", "\n48213", 24),
        ("<think>the key is 48213 or", None, 26),  # the decode ended while it thought
        ("48213 <think>more", "48213 ", 0),  # an answer, then more thinking: it counts
    ],
)
def test_the_answer_is_read_after_the_reasoning_block(
    completion: str, answer: str | None, reasoning: int
) -> None:
    assert after_reasoning(completion) == (answer, reasoning)


def test_a_reasoning_models_answer_is_judged_after_its_thinking() -> None:
    thought = "<think>" + " hmm" * 100 + "</think>"
    right = fidelity_verdict(TOKENS_PROBE, thought + "<|needle-7|>", "check")
    assert (right["verdict"], right["answer"]) == ("correct", "7")
    assert right["completion"] == "<|needle-7|>" and right["reasoning_chars"] == len(thought)
    assert right["judged_by"].endswith("after its reasoning block")
    # the digits in its thinking are not its answer
    text = fidelity_verdict(TEXT_PROBE, "<think>is it 11111?</think> 48213", "check")
    assert (text["verdict"], text["answer"]) == ("correct", "48213")
    unfinished = fidelity_verdict(TEXT_PROBE, "<think>is it 48213? Let me see", "check")
    assert (unfinished["verdict"], unfinished["answer"]) == ("not_checked", None)
    assert "still reasoning" in unfinished["reason"]


def test_an_unjudged_answer_is_recorded_not_checked_with_the_reason() -> None:
    why = "the served model did not answer the fidelity probe in the warm-up"
    wrong = fidelity_verdict(TOKENS_PROBE, "▁is▁is▁is", "check", unjudged=why)
    assert (wrong["verdict"], wrong["reason"], wrong["answered"]) == ("not_checked", why, "wrong")
    assert wrong["expected"] == "7" and wrong["answer"] is None  # what came back is kept
    assert wrong["completion"] == "▁is▁is▁is" and "judged_by" not in wrong
    right = fidelity_verdict(TOKENS_PROBE, "<|needle-7|>", "record", unjudged=why)
    assert (right["verdict"], right["answered"]) == ("not_checked", "correct")
    assert right["mode"] == "record"
    thinking = fidelity_verdict(TOKENS_PROBE, "<think>hmm", "check", unjudged=why)
    assert (thinking["verdict"], thinking["answered"], thinking["reason"]) == (
        "not_checked",
        "not_checked",
        why,
    )
    # off stays off, and a prompt without a probe keeps its own reason
    off = fidelity_verdict(TOKENS_PROBE, "x", "off", unjudged=why)
    assert off["reason"] == "--longctx-fidelity=off"
    assert fidelity_verdict(None, "x", "check", "no probe", unjudged=why)["reason"] == "no probe"
    level = requests_verdict(TOKENS_PROBE, ["<|needle-7|>", "<|needle-3|>"], "check", unjudged=why)
    assert (level["verdict"], level["answered"], level["reason"]) == ("not_checked", "wrong", why)
    assert level["wrong_requests"] == [1] and level["requests"] == 2


def warm_ups(*completions: str) -> list[dict]:
    return [fidelity_verdict(TOKENS_PROBE, completion, "check") for completion in completions]


def test_a_model_that_does_not_answer_in_the_warm_ups_is_learned_not_to_follow() -> None:
    lesson = learn(warm_ups("▁is▁is▁is", "▁is▁is▁is", "▁is▁is▁is"), 1024, "tiny-qwen-fine")
    assert not lesson.follows and (lesson.asked, lesson.correct) == (3, 0)
    assert lesson.reason == (
        "the served model tiny-qwen-fine did not answer the fidelity probe in the warm-up at "
        "1Ki tokens (0 of 3 right; expected 7, answered None (completion '▁is▁is▁is')): its "
        "answers are recorded, not checked (--longctx-fidelity=check checks them)"
    )
    thinking = learn([fidelity_verdict(TEXT_PROBE, "<think>let me", "check")], 2048)
    assert not thinking.follows and "still reasoning" in thinking.reason
    assert "the served model did not" in thinking.reason and "at 2Ki tokens" in thinking.reason


def test_a_model_that_answers_in_the_warm_ups_follows_the_probe() -> None:
    assert learn(warm_ups("<|needle-7|>"), 1024).follows
    assert learn(warm_ups("<|needle-7|>", "<|needle-7|>", "<|needle-9|>"), 1024).follows
    assert learn(warm_ups("<|needle-7|>", "<|needle-9|>"), 1024).follows  # no more missed
    lesson = learn(warm_ups("<|needle-7|>", "<|needle-9|>", "x"), 1024)  # more missed than right
    assert not lesson.follows and "1 of 3 right; expected 7, answered 9" in lesson.reason
    assert learn(warm_ups("<|needle-7|>"), 1024).reason == ""


def test_nothing_is_learned_without_a_warm_up() -> None:
    lesson = learn([], 1024, "m")
    assert not lesson.follows
    assert lesson.reason.startswith("no warm-up asked the probe (--longctx-warmup-prompts=0)")


def test_auto_checks_within_the_advertised_context_and_records_beyond() -> None:
    assert judgement("auto", 4096, 4096) == "check"
    assert judgement("auto", 8192, 4096) == "record"
    assert judgement("auto", 8192, None) == "check"
    assert judgement("record", 1024, 4096) == "record"
    assert judgement("check", 1 << 20, 4096) == "check"
