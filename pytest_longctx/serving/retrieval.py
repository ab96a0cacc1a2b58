"""Weights that answer the needle probe, on the embedded Llama's own shapes.

The residual stream keeps five kinds of dimension: a needle flag (0), one identity per needle
value (1..64), one key flag per needle key, one question flag per key, and an any-needle
question flag (the last). A needle token's embedding sets the flag, its identity and (planted
under a key) its key's flag; a question token's sets its own question flag; every other token's
is zero. In the first layer one query head reads each question flag into a rotary pair of its
own among the slowest ones, and the KV head writes each key's flag into that key's pair of the
key vector (the needle flag into the any-needle pair): with a base of 1e12 these pairs barely
turn at any distance, so a keyed question attends to the needle planted under its key wherever
it is, and the any-needle question to every planted needle alike (several split the next-token
distribution evenly). The value carries the identity, the output projection adds it to the
residual, every other weight is zero (the rest of the network passes the residual through) and
the head reads the identity back as the value's token. A question that finds no needle (its
attention spread over ordinary tokens, as when positions are encoded otherwise than the model
was built for) answers the question token itself, which holds no digit: a lost needle is a
wrong answer, not a faint right one. The shapes, and so the cost of a prefill, are those of the
random-weight model.
"""

from __future__ import annotations

from typing import Any

from pytest_longctx.prompts.needle import (
    NEEDLE_KEYS,
    NEEDLE_VALUES,
    QUESTION_TOKEN,
    keyed_needle_token,
    keyed_question_token,
    needle_token,
)

NEEDLE_FLAG_DIM = 0
KEYS = len(NEEDLE_KEYS)
#: The key flags of planted needles, then the keyed questions' flags.
KEY_FLAG_DIM = 1 + NEEDLE_VALUES
QUESTION_FLAG_DIM = KEY_FLAG_DIM + KEYS
#: The rotary pair whose angle turns slowest (the last of head_dim / 2): key 0's, the key every
#: cold prompt asks; key k's is ``SLOW_PAIR - k`` and the any-needle question's the next one.
SLOW_PAIR = 31
ANY_PAIR = SLOW_PAIR - KEYS
#: Query and key gains: the question's score on a needle is about 37 to 45 (softmax weight
#: e^37 against 1 for each other token), far more than 64Mi tokens of zeros can dilute.
QUERY_GAIN = 2.0
KEY_GAIN = 2.0
#: Logit of the answer (about 34 for one needle; the others stay at 0).
HEAD_GAIN = 3.0
#: Logit of the question token's own "not found" answer: the needle's value wins while the
#: question gives the needle more than about a sixth of its attention.
NOT_FOUND_GAIN = 3.0


def plant_retrieval(model: Any, tokenizer: Any) -> None:
    """Overwrite ``model``'s weights (a LlamaForCausalLM) with the retrieving ones."""
    import torch

    config = model.config
    hidden, head_dim = config.hidden_size, config.head_dim
    if hidden < QUESTION_FLAG_DIM + KEYS + 1 or head_dim // 2 <= SLOW_PAIR or ANY_PAIR < 0:
        raise ValueError(
            f"retrieval weights need hidden_size >= {QUESTION_FLAG_DIM + KEYS + 1} and "
            f"head_dim >= {max(NEEDLE_VALUES, 2 * (SLOW_PAIR + 1))}; got {hidden} and {head_dim}"
        )
    any_question_dim = hidden - 1

    def token_id(token: str) -> int:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"the tokenizer lacks {token} of the needle vocabulary")
        return found

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        attention = model.model.layers[0].self_attn
        # Query head 0, key head 0 (shared by both query heads), first element of each pair.
        query, key = attention.q_proj.weight, attention.k_proj.weight
        question_id = token_id(QUESTION_TOKEN)
        embed[question_id, any_question_dim] = 1.0
        query[ANY_PAIR, any_question_dim] = QUERY_GAIN
        key[ANY_PAIR, NEEDLE_FLAG_DIM] = KEY_GAIN
        head[question_id, any_question_dim] = NOT_FOUND_GAIN
        for value in range(NEEDLE_VALUES):
            token = token_id(needle_token(value))
            embed[token, NEEDLE_FLAG_DIM] = 1.0
            embed[token, 1 + value] = 1.0
            head[token, 1 + value] = HEAD_GAIN
            attention.v_proj.weight[value, 1 + value] = 1.0
            # Head 0's output only; head 1 (uniform attention) adds nothing.
            attention.o_proj.weight[1 + value, value] = 1.0
        for k in range(KEYS):
            asked = token_id(keyed_question_token(k))
            embed[asked, QUESTION_FLAG_DIM + k] = 1.0
            query[SLOW_PAIR - k, QUESTION_FLAG_DIM + k] = QUERY_GAIN
            key[SLOW_PAIR - k, KEY_FLAG_DIM + k] = KEY_GAIN
            head[question_id, QUESTION_FLAG_DIM + k] = NOT_FOUND_GAIN
            for value in range(NEEDLE_VALUES):
                token = token_id(keyed_needle_token(k, value))
                embed[token, NEEDLE_FLAG_DIM] = 1.0
                embed[token, 1 + value] = 1.0
                embed[token, KEY_FLAG_DIM + k] = 1.0
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
