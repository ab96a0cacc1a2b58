"""The long-context sweep: one item per (length, repeat): ``test_prefill_decode[len=1Ki-rep=0]``.

Shipped with the plugin, so any project runs it with no copied file:
``pytest --pyargs pytest_longctx.suite --longctx-url=http://127.0.0.1:8000`` against your own
server, or with no URL against the embedded default. Select lengths like any tests:
``-m "len<=1Mi"``, ``--longctx-to=64Mi --longctx-repeats=3``. Each item measures one cold
prefill (TTFT) and a fixed-length decode; with ``--longctx-workload=cold,warm`` each cold point
is followed by questions on its prefix (``[len=1Ki-rep=0-warm=1]``), served from the cache;
with ``interference`` each length is measured again beside K background streams
(``[len=1Ki-rep=0-interference]``), on a server of its own; with ``concurrency`` c prompts
of each length are sent at once (``[len=8Ki-rep=0-conc=4]``), on a server with room for them.
"""


def test_prefill_decode(longctx_point, longctx_prompt, longctx_measure):
    """What makes a point's figures true: the whole contract, in one place."""
    length = longctx_point.prompt_tokens  # a warm point's: its cold prefix and new suffix
    result = longctx_measure(longctx_prompt)
    if longctx_point.concurrent:
        # c at once, as it claims: every request streamed its decode from a cold prompt of
        # the length, and the server counted these c requests and no other client's. (A level
        # past the cache's fit that did not run at once is measured, not failed.)
        assert result.concurrency_problem is None, result.concurrency_problem

    # Exact: the server read exactly the point's prompt ...
    assert result.prompt_tokens == length, (
        f"the server counted {result.prompt_tokens} prompt tokens; the point sent {length}"
    )
    # ... and generated exactly the decode length (vLLM clamps it silently at max_model_len).
    assert result.completion_tokens == result.requested_tokens, result.completion_problem()
    if longctx_point.warm:
        # Warm: the cache served the cold point's whole prefix (to the cache's alignment, by
        # usage and /metrics alike), or the message says how much and why not (evicted).
        assert result.cache_problem is None, result.cache_problem
    else:
        # Cold: its prefix cache served none of the prompt (usage and /metrics both say so;
        # under load, its own usage: /metrics counts the background requests too).
        # The message names the tier that served them: the device's prefix cache, or a KV
        # connector's (host memory, disk, another instance).
        assert not result.cached_prompt_tokens, result.not_cold_problem()
    if longctx_point.interference:
        # Under load, as it claims: the K background streams ran throughout with no request
        # failed, and nothing was preempted. Gaps the server's own figures (its inter-token
        # histogram, its timing of each request) refute are not what the streams waited:
        # the point keeps its TTFT under load, its background figures set aside and not
        # gated (--longctx-allow-unconfirmed keeps them; --longctx-strict-stream fails it).
        assert result.interference_problem is None, result.interference_problem
    elif not longctx_point.concurrent:
        # Alone: nobody else's request ran on the server while this one was timed (None only
        # with --longctx-allow-unverified, when the server's counters cannot be read).
        assert result.server_requests in (1, None), (
            f"the server served {result.server_requests} requests during this point: its TTFT "
            "is not this request's alone"
        )
    # Streamed as decoded: the stream's decode rate and its chunks agree with the server's own
    # decode, a stream held back and flushed at once does not; this fails only with
    # --longctx-strict-stream: by default such a point keeps the server's decode figure, or
    # none where the server has none of this request's own (None also when it is unknown).
    assert result.stream_problem is None, result.stream_problem


def test_regression(longctx_regression_length, longctx_gate):
    """With --longctx-baseline: after a length's repeats, fail if it got slower than before."""
    longctx_gate.check(longctx_regression_length)
