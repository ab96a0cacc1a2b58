"""The plugin's fixtures: the pieces of a sweep item, for the suite and for users' own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from pytest_longctx.client import CompletionClient
from pytest_longctx.core.records import Record
from pytest_longctx.measure.point import PointFailure, PointMeasurement, UnverifiedPoint, client_for
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan.sweep import Point
from pytest_longctx.prompts import Prompt, PromptBuilder, PromptError
from pytest_longctx.session import gate_items, points, restarts, sweep_session
from pytest_longctx.session import server as session_server
from pytest_longctx.session.run import Run
from pytest_longctx.session.stash import MEASUREMENT_KEY


@pytest.fixture(scope="session")
def longctx_run(pytestconfig: pytest.Config) -> Run:
    """This session's plan, run folder and records so far (under xdist: the campaign's).

    Asking for it starts the sweep's part of the session, as collecting a sweep item does: a
    test that only needs the server (``longctx_server``) gets the same run."""
    return sweep_session.activate(pytestconfig).run


@pytest.fixture(scope="session")
def longctx_server(pytestconfig: pytest.Config, longctx_run: Run) -> Iterator[ServerInfo]:
    """The server, launched from the profile or attached by URL, once per session, warmed up."""
    try:
        info = session_server.start(pytestconfig)
        points.warm_up(longctx_run, info)
    except ServerError as exc:
        session_server.stop(pytestconfig)
        raise restarts.failed(exc) from None
    yield info
    session_server.stop(pytestconfig)


@pytest.fixture(scope="session")
def longctx_client(longctx_server: ServerInfo, longctx_run: Run) -> Iterator[CompletionClient]:
    """A streaming client bound to the session's server."""
    with client_for(longctx_server, longctx_run.settings.tcp_keepalive_s) as client:
        yield client


@pytest.fixture(scope="session")
def longctx_prompts(longctx_run: Run, longctx_server: ServerInfo) -> PromptBuilder:
    """Builds exact-length prompts with the served model's tokenizer."""
    builder = points.prompt_builder(longctx_run, longctx_server)
    if longctx_run.settings.prompt_format == "text":
        try:
            builder.check_text_prompts()
        except PromptError as exc:  # one usage error, not one failure per item
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    return builder


@pytest.fixture
def longctx_point() -> Point:
    """The (length, repeat) of a sweep item; the plugin parametrizes it."""
    raise pytest.UsageError("longctx_point is parametrized by pytest-longctx; none given here")


@dataclass(frozen=True)
class RecordedPrompt:
    """A resumed point's prompt, as its record describes it."""

    length: int
    token_count: int


@pytest.fixture
def longctx_prompt(
    request: pytest.FixtureRequest, longctx_point: Point, longctx_run: Run
) -> Prompt | RecordedPrompt:
    """A cold prompt of exactly the point's length, unique to this run, length and repeat."""
    recorded = longctx_run.resumed.get(longctx_point)
    if recorded is not None:
        return RecordedPrompt(recorded.length, recorded.prompt_tokens or 0)
    builder: PromptBuilder = request.getfixturevalue("longctx_prompts")
    restarts.before_point(request.config, longctx_run, longctx_point)  # the server may build it
    return points.build_prompt(longctx_run, builder, longctx_point)


@pytest.fixture
def longctx_measure(
    request: pytest.FixtureRequest, longctx_point: Point, longctx_run: Run
) -> Callable[[Prompt], PointMeasurement]:
    """Measure one prompt: TTFT, decode throughput and the server's counters around it.

    It fails the item when the request did not complete or the server's counters cannot be
    read; what the counts must be (exact, cold, alone) is the calling test's to assert, as
    ``test_prefill_decode`` does.
    """
    recorded = longctx_run.resumed.get(longctx_point)
    if recorded is not None:
        return lambda prompt: PointMeasurement.from_record(recorded)
    server: ServerInfo = request.getfixturevalue("longctx_server")
    client = request.getfixturevalue("longctx_client")
    restarts.before_point(request.config, longctx_run, longctx_point)

    def run_measurement(prompt: Prompt) -> PointMeasurement:
        try:
            result = points.measure(longctx_run, server, client, longctx_point, prompt)
        except UnverifiedPoint as exc:
            request.node.stash[MEASUREMENT_KEY] = exc.measurement  # its figures stay recorded
            raise
        except PointFailure as exc:
            if exc.sent or not restarts.server_down(longctx_run):
                restarts.after_failure(longctx_run, longctx_point, exc)
                raise
            # Never sent: the server died just before it. Measured after the relaunch.
            restarts.before_point(request.config, longctx_run, longctx_point)
            return run_measurement(prompt)
        request.node.stash[MEASUREMENT_KEY] = result
        return result

    return run_measurement


@pytest.fixture(scope="session")
def longctx_baseline_records(longctx_run: Run) -> list[Record]:
    """The baseline's passed records (``--longctx-baseline``)."""
    return gate_items.baseline_records(longctx_run)


@pytest.fixture
def longctx_regression_length() -> int:
    """The length a regression item compares; the plugin parametrizes it."""
    raise pytest.UsageError("longctx_regression_length is parametrized by pytest-longctx")


@pytest.fixture
def longctx_gate(
    request: pytest.FixtureRequest, longctx_run: Run, longctx_baseline_records: list[Record]
) -> gate_items.Gate:
    """Compares this run's records of a length with the baseline's; the item's properties
    (JUnit XML) get the verdicts."""
    return gate_items.Gate(longctx_run, longctx_baseline_records, request.node)
