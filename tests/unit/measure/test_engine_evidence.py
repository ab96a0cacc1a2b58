"""A dead or stuck engine behind an HTTP front that still answers, classed by what it shows.

vLLM 0.32's ``/health`` answers 503 once its engine is dead
(``vllm/entrypoints/serve/instrumentator/health.py``), and its API server exits soon after;
a stuck engine keeps its front answering ``/health`` with 200 while the request it holds
never moves and stays counted in ``vllm:num_requests_running``, where a working engine drops
a request whose client went away. The fake server plays both (faults ``engine_death`` and
``stuck_engine``), attached here; a launched stand-in whose engine sticks is in
``test_outcomes.py``, beside the one whose whole server freezes.
"""

from __future__ import annotations

import threading
import time

import pytest
from fake_vllm import ENGINE_DEAD_MESSAGE, FakeVLLM
from longctx_testing import (
    failure_classes,
)

from pytest_longctx.measure import outcomes
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.serving.process import check_attached


def test_health_503_is_a_dead_engine(fake_vllm: FakeVLLM) -> None:
    fake_vllm.die()
    with pytest.raises(ServerError) as raised:
        check_attached(fake_vllm.url, None)
    assert raised.value.failure_class == "engine_died"
    assert "HTTP 503" in str(raised.value) and "engine is dead" in str(raised.value)


@pytest.mark.parametrize("exits", [False, True], ids=["health-503", "server-exits"])
def test_an_attached_engine_that_dies_is_engine_died_whatever_health_shows_after(
    attached,  # noqa: ANN001
    fake_vllm: FakeVLLM,
    exits: bool,
) -> None:
    """The death frame, then /health 503 (or the server gone, as vLLM's API server exits):
    the point is engine_died with both lines kept; the next point waits for the server and
    fails as server_gone."""
    result, records = attached(
        "--longctx-to=2Ki",
        "--longctx-reattach-timeout=0",
        fault="engine_death",
        fault_after_tokens=2,
        stop_after_death_s=0.0 if exits else None,
    )
    result.assert_outcomes(failed=1, errors=1)
    assert failure_classes(records) == ["engine_died", "server_gone"]
    assert records[0].evidence[0] == ENGINE_DEAD_MESSAGE
    after = f"{fake_vllm.url}: connection refused" if exits else f"{fake_vllm.url}/health: HTTP 503"
    assert after in records[0].evidence
    assert "did not answer again within 0 s" in records[1].reason


def test_a_stuck_attached_engine_is_a_hang_it_cannot_restart(attached) -> None:  # noqa: ANN001
    """/health answers, the request is never answered and still runs after the client left:
    a hang, not a timeout, with the gauge as evidence; an attached server is not restarted."""
    result, records = attached("-m", "len==1Ki", "--longctx-ttft-timeout=0.5", fault="stuck_engine")
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["hang"]
    gauge, attached_line = records[0].evidence
    assert gauge.startswith("vllm:num_requests_running was 1 ")
    assert "after the client abandoned the request, while /health answers" in gauge
    assert "it cannot be restarted from here" in attached_line


def test_a_request_the_engine_drops_after_its_budget_is_a_timeout(attached) -> None:  # noqa: ANN001
    """The same silence, but the engine drops the abandoned request: a slow point, not a
    stuck server."""
    result, records = attached(
        "-m", "len==1Ki", "--longctx-ttft-timeout=0.5", fault="hang_after_headers"
    )
    result.assert_outcomes(failed=1)
    assert failure_classes(records) == ["timeout"]
    assert records[0].evidence == ()


@pytest.mark.parametrize(
    ("slowest_step_s", "klass"), [(None, "hang"), (3.5, "timeout")], ids=["no-step", "slow-steps"]
)
def test_the_grace_after_an_abort_covers_two_of_the_points_slowest_steps(
    fake_vllm: FakeVLLM, slowest_step_s: float | None, klass: str
) -> None:
    """The engine keeps an abandoned request 5.7 s, no counter moving, as an engine does
    whose step in progress outlasts the floor of 5 s: stuck for a point that showed no step,
    a timeout for one whose steps took 3.5 s (a grace of two of them, 7 s)."""
    fake_vllm.running = 1  # the abandoned request, held by the step in progress
    dropped = threading.Timer(5.7, setattr, (fake_vllm, "running", 0))
    dropped.start()
    server = ServerInfo(fake_vllm.url, "fake-model", None, "launched")
    try:
        got, evidence = outcomes.abandoned_request(server, time.monotonic(), 0, slowest_step_s)
    finally:
        dropped.cancel()
    assert got == klass
    (line,) = evidence
    if klass == "hang":
        assert "no step counter moved for 5.0 s" in line
    else:
        assert "within 7.0 s, two of the point's slowest steps (3.5 s)" in line
        assert "the server is kept" in line
