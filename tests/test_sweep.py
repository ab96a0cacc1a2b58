"""The long-context sweep: one item per (length, repeat): ``test_prefill_decode[len=1Ki-rep=0]``.

Select lengths like any tests: ``pytest -m "len<=1Mi"``, ``pytest --longctx-to=64Mi
--longctx-repeats=3``. Each item measures one cold prefill (TTFT) and a fixed-length decode.
"""


def test_prefill_decode(longctx_point, longctx_prompt, longctx_measure):
    # Before the run: the tokenized prompt is exactly the target length.
    assert longctx_prompt.token_count == longctx_point.length

    result = longctx_measure(longctx_prompt)

    # After the run: the server read every prompt token, and decode produced the asked output.
    assert result.prompt_tokens == longctx_point.length
    assert result.completion_tokens == result.requested_tokens


def test_regression(longctx_regression_length, longctx_gate):
    """With --longctx-baseline: after a length's repeats, fail if it got slower than before."""
    longctx_gate.check(longctx_regression_length)
