"""What a stream's chunks say, from counts and stamps made up here: whether the counts are
exact, the gaps between chunks, the chunks the server merged, each chunk's share of the tokens
where the counts fell short, what the record says of the chunking, and the figures derived
from chunks of several tokens."""

from __future__ import annotations

import pytest

from pytest_longctx.client.result import StreamMeasurement, summarize_stream


def stream(
    times: tuple[float, ...],
    counts: tuple[int, ...],
    completion_tokens: int | None = None,
    known: int | None = None,
    source: str = "usage",
) -> StreamMeasurement:
    """A stream whose chunks arrived at ``times`` carrying ``counts`` tokens (the server's
    count: ``completion_tokens``, their sum unless given); ``known``: the interval the
    server's earlier streams showed."""
    return StreamMeasurement(
        ttft_s=times[0],
        e2e_s=times[-1],
        token_times_s=times,
        tokens_per_chunk=counts,
        itl_s=(),
        completion_tokens=sum(counts) if completion_tokens is None else completion_tokens,
        requested_tokens=sum(counts),
        prompt_tokens=None,
        cached_prompt_tokens=None,
        token_count_source=source,
        finish_reason="length",
        decode_throughput=None,
        itl_median_s=None,
        itl_p90_s=None,
        itl_max_s=None,
        body_bytes=0,
        body_build_s=0.0,
        connect_s=None,
        upload_s=None,
        response_headers_s=None,
        server_stream_interval=known,
    )


def test_counts_are_exact_when_they_add_up_to_the_servers() -> None:
    exact = stream((0.5, 0.6, 0.7), (1, 1, 1))
    assert exact.stream_tokens == 3 and exact.counts_exact
    short = stream((0.5, 0.6, 0.7), (1, 1, 1), completion_tokens=9, source="text")
    assert short.stream_tokens == 3 and not short.counts_exact
    assert short.stream_interval is None and not short.per_token  # text hides the interval


def test_per_token_gaps_only_at_stream_interval_one() -> None:
    assert stream((0.5, 0.6, 0.7, 0.8), (1, 1, 1, 1)).per_token
    assert not stream((0.5, 0.6, 0.7, 0.8), (1, 2, 2, 1)).per_token  # interval 2
    assert not stream((0.5, 0.6, 0.7, 0.8), (1, 8, 8, 7)).per_token
    # a server known to stream every token, whose stream fell behind: still per token
    behind = stream((0.5, 0.6, 0.7, 0.8), (1, 2, 2, 1), known=1)
    assert behind.stream_interval == 1 and behind.per_token


def test_the_gaps_between_chunks_are_as_they_arrived() -> None:
    assert stream((0.5, 0.6, 0.75, 0.8), (1, 1, 1, 1)).chunk_gaps_s == pytest.approx(
        (0.1, 0.15, 0.05)
    )
    assert stream((0.5,), (1,)).chunk_gaps_s == ()


@pytest.mark.parametrize(
    ("counts", "known", "coalesced"),
    [
        ((1, 8, 16, 8, 7), None, 1),  # interval 8: the 16 is two chunks merged
        ((1, 16, 8, 7), None, 1),
        ((1, 8, 8, 7), None, 0),  # whole chunks of the interval, the remainder last
        ((3, 1, 1, 2, 1), None, 2),  # the first carried three, a later one two
        ((2, 1, 1), None, 1),  # the first carried two (vLLM sends the first token alone)
        ((32,), 1, 1),  # the whole stream merged into its first chunk
        ((32,), None, 0),  # ... on a server of unknown interval: nothing to say
        ((), 1, 0),
    ],
)
def test_chunks_the_server_merged_carry_more_than_the_interval(
    counts: tuple[int, ...], known: int | None, coalesced: int
) -> None:
    times = tuple(0.5 + 0.1 * index for index in range(len(counts))) or (0.5,)
    assert stream(times, counts, completion_tokens=sum(counts), known=known).coalesced_chunks == (
        coalesced
    )


def test_where_counts_fell_short_the_chunks_after_the_first_share_the_rest() -> None:
    times = (0.5, 0.6, 0.7, 0.8)
    exact = stream(times, (1, 8, 8, 7))
    assert exact.chunk_token_counts() == (1.0, 8.0, 8.0, 7.0)
    short = stream(times, (2, 1, 1, 1), completion_tokens=11, source="text")
    assert short.chunk_token_counts() == (2.0, 3.0, 3.0, 3.0)
    two = stream(times[:2], (1, 1), completion_tokens=5, source="text")
    assert two.chunk_token_counts() == (1.0, 4.0)
    alone = stream(times[:1], (1,), completion_tokens=5, source="text")
    assert alone.chunk_token_counts() == (1.0,)


def test_the_chunking_the_record_keeps() -> None:
    times = (0.5, 0.6, 0.7, 0.8, 0.9)
    assert stream(times, (1, 8, 16, 8, 7)).chunking() == {
        "token_count_source": "usage",
        "chunks": 5,
        "tokens_per_chunk": [[1, 1], [8, 1], [16, 1], [8, 1], [7, 1]],
        "tokens_per_chunk_mean": 9.75,
        "stream_interval": 8,
        "per_token_gaps": False,
        "coalesced_chunks": 1,
    }
    runs = stream(times, (1, 1, 1, 2, 1)).chunking()
    assert runs["tokens_per_chunk"] == [[1, 3], [2, 1], [1, 1]]
    assert (runs["stream_interval"], runs["per_token_gaps"], runs["coalesced_chunks"]) == (
        1,
        True,
        1,
    )
    assert runs["tokens_per_chunk_mean"] == 1.25
    short = stream(times, (1, 1, 1, 1, 1), completion_tokens=13, source="text").chunking()
    assert short["tokens_per_chunk"] is None  # the counts are not the chunks'
    assert short["tokens_per_chunk_mean"] == 3.0
    assert stream((0.5,), (4,)).chunking()["tokens_per_chunk_mean"] is None
    assert stream(times[:4], (1, 8, 8, 7)).chunking()["tokens_per_chunk_mean"] == 7.667


def test_chunks_of_several_tokens_give_chunk_gaps_and_derived_per_token_figures() -> None:
    # every chunk one token: the gaps are inter-token latencies, nothing derived
    assert stream((0.5, 0.6, 0.7), (1, 1, 1)).chunk_figures() == {}
    assert stream((0.5,), (3,)).chunk_figures() == {}
    # interval 4: gaps 0.4, 0.8, 0.2 s for 4, 4 and 2 tokens: per token 0.1 x4, 0.2 x4, 0.1 x2
    merged = stream((0.5, 0.9, 1.7, 1.9), (1, 4, 4, 2))
    assert merged.chunk_figures() == pytest.approx(
        {
            "chunk_gap_median": 0.4,
            "chunk_gap_p90": 0.72,
            "chunk_gap_max": 0.8,
            "derived_itl_median": 0.1,
            "derived_itl_p90": 0.2,
        }
    )
    # text counted, 10 tokens over 4 chunks: the three after the first share 9, 3 each
    short = stream((0.5, 0.9, 1.7, 1.9), (1, 1, 1, 1), completion_tokens=10, source="text")
    figures = short.chunk_figures()
    assert (figures["chunk_gap_median"], figures["chunk_gap_max"]) == pytest.approx((0.4, 0.8))
    assert figures["derived_itl_median"] == pytest.approx(0.4 / 3)
    assert figures["derived_itl_p90"] == pytest.approx(0.8 / 3)
    # counts exact and every chunk after the first one token (the first may carry more):
    # the gaps are per token already
    assert stream((0.5, 0.6, 0.8), (2, 1, 1)).chunk_figures() == {}
    # a chunk of one among chunks of several: one gap, the whole of it
    mixed = stream((0.5, 0.9, 1.2), (1, 4, 1)).chunk_figures()
    assert mixed["derived_itl_median"] == pytest.approx(0.1)
    assert mixed["derived_itl_p90"] == pytest.approx(0.1 + 0.2 * 0.6)  # of 0.1 x4, 0.3
    assert stream((0.5, 0.9, 1.0, 1.1), (1, 3, 1, 1)).chunk_figures()["chunk_gap_max"] == (
        pytest.approx(0.4)
    )


def test_decode_throughput_counts_the_tokens_after_the_first_chunk() -> None:
    """A first chunk of three: the two tokens after it over the second between the chunks."""
    throughput, gaps = summarize_stream((1.0, 1.5, 2.0), (3, 1, 1), 5)
    assert throughput == 2.0
    assert gaps == pytest.approx((0.5, 0.5))
