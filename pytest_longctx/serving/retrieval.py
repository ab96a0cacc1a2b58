"""Weights that answer the needle probe, on the embedded Llama's own shapes.

The residual stream keeps three kinds of dimension: a needle flag (0), one identity per needle
value (1..64) and a question flag (the last). A needle token's embedding sets the flag and its
identity, the question token's sets the question flag, every other token's is zero. In the
first layer one query head reads the question flag into the slowest rotary pair, and the KV
head writes the needle flag into the same pair's key: with a base of 1e12 that pair barely turns
at any distance, so the question attends to the needle wherever it is planted (to every planted
needle alike). The value carries the identity, the output projection adds it to the residual,
every other weight is zero (the rest of the network passes the residual through) and the head
reads the identity back as the needle's token. Several needles split the next-token
distribution evenly between them. The shapes, and so the cost of a prefill, are those of the
random-weight model.
"""

from __future__ import annotations

from typing import Any

from pytest_longctx.prompts.needle import NEEDLE_VALUES, QUESTION_TOKEN, needle_token

NEEDLE_FLAG_DIM = 0
#: The rotary pair whose angle turns slowest (the last of head_dim / 2).
SLOW_PAIR = 31
#: Query and key gains: the question's score on a needle is about 45 (softmax weight
#: e^45 against 1 for each other token), far more than 64Mi tokens of zeros can dilute.
QUERY_GAIN = 2.0
KEY_GAIN = 2.0
#: Logit of the answer (about 34 for one needle; the others stay at 0).
HEAD_GAIN = 3.0


def plant_retrieval(model: Any, tokenizer: Any) -> None:
    """Overwrite ``model``'s weights (a LlamaForCausalLM) with the retrieving ones."""
    import torch

    config = model.config
    hidden, head_dim = config.hidden_size, config.head_dim
    if hidden < NEEDLE_VALUES + 2 or head_dim < NEEDLE_VALUES or head_dim // 2 <= SLOW_PAIR:
        raise ValueError(
            f"retrieval weights need hidden_size >= {NEEDLE_VALUES + 2} and head_dim >= "
            f"{max(NEEDLE_VALUES, 2 * (SLOW_PAIR + 1))}; got {hidden} and {head_dim}"
        )
    question_dim = hidden - 1
    question_id = tokenizer.token_to_id(QUESTION_TOKEN)
    needle_ids = [tokenizer.token_to_id(needle_token(v)) for v in range(NEEDLE_VALUES)]
    if question_id is None or None in needle_ids:
        raise ValueError("the tokenizer lacks the needle vocabulary (prompts/needle.py)")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        embed = model.model.embed_tokens.weight
        embed[question_id, question_dim] = 1.0
        for value, token_id in enumerate(needle_ids):
            embed[token_id, NEEDLE_FLAG_DIM] = 1.0
            embed[token_id, 1 + value] = 1.0
            model.lm_head.weight[token_id, 1 + value] = HEAD_GAIN
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        attention = model.model.layers[0].self_attn
        # Query head 0, key head 0 (shared by both query heads), first element of the pair.
        attention.q_proj.weight[SLOW_PAIR, question_dim] = QUERY_GAIN
        attention.k_proj.weight[SLOW_PAIR, NEEDLE_FLAG_DIM] = KEY_GAIN
        for value in range(NEEDLE_VALUES):
            attention.v_proj.weight[value, 1 + value] = 1.0
            # Head 0's output only; head 1 (uniform attention) adds nothing.
            attention.o_proj.weight[1 + value, value] = 1.0
