"""Against a real vLLM server started with ``--stream-interval 8``: the first token alone, then
chunks of eight. Each chunk's tokens come from the running usage count, the decode figures
agree with the server's own, and no gap between chunks is taken for an inter-token latency.
"""

from __future__ import annotations

import statistics

import pytest
from longctx_testing import records_of, run_folder, run_session

pytestmark = pytest.mark.vllm


def test_a_sweep_records_the_chunking_and_agrees_with_the_server(
    sweep_dir: pytest.Pytester, stream_interval_8_url: str
) -> None:
    result, output = run_session(
        sweep_dir, "--longctx-to=4Ki", "--longctx-repeats=2", url=stream_interval_8_url
    )
    result.assert_outcomes(passed=6)
    records = records_of(output)
    ratios = []
    for record in records:
        stream = record.stream
        assert stream["token_count_source"] == "usage"
        assert stream["stream_interval"] == 8
        assert stream["tokens_per_chunk"] == [[1, 1], [8, 3], [7, 1]]  # 32 = 1 + 8 x 3 + 7
        assert stream["per_token_gaps"] is False
        assert stream["agreement"] == "agrees"
        assert stream["decode_source"] == "stream"
        figures = record.figures
        # no inter-token latency is recorded from gaps between chunks of eight ...
        assert not {"itl_median", "itl_p90", "itl_max"} & set(figures)
        # ... the gaps are kept as such, and the per-token figure derived from them
        assert figures["chunk_gap_median"] > 5 * figures["derived_itl_median"]
        server_per_token = figures["server_decode"] / 31
        ratios.append(figures["decode_throughput"] / figures["server_decode_throughput"])
        # the mean per-token gap is 1 / decode throughput; the median close to it
        assert figures["derived_itl_median"] == pytest.approx(server_per_token, rel=0.5)
    # per-token figures within a few percent of the server's own
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.05), ratios
    assert all(abs(ratio - 1) < 0.25 for ratio in ratios), ratios  # the tolerance
    assert records[0].fingerprint["stream"]["stream_interval"] == 8  # from the warm-up
    assert records[0].fingerprint["stream"]["tokens_per_chunk"] == [[1, 1], [8, 2], [7, 1]]
    report = (run_folder(output) / "report.md").read_text()
    assert (
        "- Streaming: 6 of 6 passed points streamed chunks of 8 tokens (stream interval 8, "
        "counted from the running usage count)" in report
    )
