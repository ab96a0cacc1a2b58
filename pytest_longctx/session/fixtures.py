"""The plugin's fixtures: the pieces of a sweep item, for the suite and for users' own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_longctx.campaign.run import Run
from pytest_longctx.core.records import Record
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan.points import Point
from pytest_longctx.session import gate_items
from pytest_longctx.session.activation import activate

if TYPE_CHECKING:  # annotations only: a session without a sweep imports none of these
    from pytest_longctx.client import CompletionClient
    from pytest_longctx.measure.measurement import PointMeasurement
    from pytest_longctx.prompts import Prompt, PromptBuilder


@pytest.fixture(scope="session")
def longctx_run(pytestconfig: pytest.Config) -> Run:
    """This session's plan, run folder and records so far (under xdist: the campaign's).

    Asking for it starts the sweep's part of the session, as collecting a sweep item does: a
    test that only needs the server (``longctx_server``) gets the same run."""
    return activate(pytestconfig).run


@pytest.fixture(scope="session")
def longctx_server(pytestconfig: pytest.Config, longctx_run: Run) -> Iterator[ServerInfo]:
    """The server, launched from the profile or attached by URL, once per session, warmed up."""
    sweep = activate(pytestconfig)
    yield sweep.start_server()
    sweep.stop_server()


@pytest.fixture(scope="session")
def longctx_client(
    pytestconfig: pytest.Config, longctx_server: ServerInfo, longctx_run: Run
) -> Iterator[CompletionClient]:
    """A streaming client bound to the session's server."""
    with activate(pytestconfig).client(longctx_server) as client:
        yield client


@pytest.fixture(scope="session")
def longctx_prompts(
    pytestconfig: pytest.Config, longctx_run: Run, longctx_server: ServerInfo
) -> PromptBuilder:
    """Builds exact-length prompts with the served model's tokenizer."""
    return activate(pytestconfig).prompt_builder(longctx_server)


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
    recorded = longctx_run.results.resumed.get(longctx_point)
    if recorded is not None:
        return RecordedPrompt(recorded.length, recorded.prompt_tokens or 0)
    builder: PromptBuilder = request.getfixturevalue("longctx_prompts")
    return activate(request.config).prompt(request.node, builder, longctx_point)


@pytest.fixture
def longctx_measure(
    request: pytest.FixtureRequest, longctx_point: Point, longctx_run: Run
) -> Callable[[Prompt], PointMeasurement]:
    """Measure one prompt: TTFT, decode throughput and the server's counters around it.

    It fails the item when the request did not complete or the server's counters cannot be
    read; what the counts must be (exact, cold, alone) is the calling test's to assert, as
    ``test_prefill_decode`` does.
    """
    sweep = activate(request.config)
    recorded = longctx_run.results.resumed.get(longctx_point)
    if recorded is not None:
        return sweep.recorded_measurement(recorded)
    server: ServerInfo = request.getfixturevalue("longctx_server")
    client = request.getfixturevalue("longctx_client")
    return sweep.measurement(request.node, longctx_point, server, client)


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
