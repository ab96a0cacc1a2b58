"""The workload seam: every point belongs to one registered workload, which names it, orders
it, says what its record holds and what its server and its sizing need."""

from __future__ import annotations

import pytest
from longctx_testing import plan_settings

from pytest_longctx.core.records import Record
from pytest_longctx.plan.points import (
    COLD,
    CONCURRENCY,
    INTERFERENCE,
    WARM,
    WORKLOADS,
    Point,
    build_plan,
)
from pytest_longctx.profiles import load_profile
from pytest_longctx.reporting.view import point_words
from pytest_longctx.session.items import record_identity
from pytest_longctx.workloads import (
    BY_NAME,
    REGISTERED,
    STUDY_SERVER,
    named,
    planned,
    points_of,
    server_for,
    sized_for,
    workload_of,
)

KI = 1024
EVERY = (COLD, WARM, INTERFERENCE, CONCURRENCY)


def plan_of(order: str = "length", workload: tuple[str, ...] = EVERY, **changes: object):
    settings = plan_settings(
        from_length=KI,
        to_length=2 * KI,
        repeats=2,
        order=order,
        workload=workload,
        warm_questions=2,
        warm_suffix=64,
        background_streams=3,
        max_concurrency=2,
        **changes,
    )
    return build_plan(settings, load_profile("cpu-tiny"))


def test_each_workload_is_registered_once_under_its_own_name() -> None:
    assert [workload.name for workload in REGISTERED] == list(WORKLOADS)
    assert set(BY_NAME) == set(WORKLOADS)
    assert all(named(name).name == name for name in WORKLOADS)
    assert [workload.name for workload in planned(plan_of())] == list(EVERY)
    assert [workload.name for workload in planned(plan_of(workload=(COLD,)))] == [COLD]


def test_the_run_goes_by_server_then_pass_each_follow_up_after_its_cold_point() -> None:
    """The study's server first (each cold point and its follow-ups while its prefix is
    cached), then the interference points' server, then the concurrency levels'."""
    ids = [point.id for point in points_of(plan_of("length"))]
    study = []
    for length in ("1Ki", "2Ki"):
        for repeat in (0, 1):
            base = f"len={length}-rep={repeat}"
            study += [base, f"{base}-warm=1", f"{base}-warm=2"]
    passes = [f"len={n}-rep={r}" for n in ("1Ki", "2Ki") for r in (0, 1)]
    loaded = [f"{base}-interference" for base in passes]
    levels = [f"{base}-conc={c}" for base in passes for c in (1, 2)]
    assert ids == study + loaded + levels
    by_repeat = [point.id for point in points_of(plan_of("pass"))]
    assert by_repeat[:3] == ["len=1Ki-rep=0", "len=1Ki-rep=0-warm=1", "len=1Ki-rep=0-warm=2"]
    assert by_repeat[3] == "len=2Ki-rep=0"  # the next length of the same pass


def test_every_point_belongs_to_the_workload_that_made_it_and_its_record_names_it() -> None:
    plan = plan_of()
    for point in points_of(plan):
        workload = workload_of(point)
        assert workload.name == point.cache_state
        assert point in workload.points(plan, plan.passes)
        record = Record(
            run_id="r", nodeid=f"t.py::t[{point.id}]", outcome="passed", **record_identity(point)
        )
        assert Point.of_record(record) == point
        assert record.cache_state == workload.name


def test_only_a_follow_up_reuses_another_points_prompt() -> None:
    plan = plan_of()
    for point in points_of(plan):
        reused = workload_of(point).reuses(point)
        if point.cache_state == WARM:
            assert reused == Point(point.length, point.repeat)
            assert workload_of(reused).name == COLD
        else:
            assert reused is None


def test_each_point_names_the_server_it_runs_on() -> None:
    plan = plan_of()
    servers = {point.cache_state: workload_of(point).server for point in points_of(plan)}
    assert servers == {
        COLD: STUDY_SERVER,
        WARM: STUDY_SERVER,
        INTERFERENCE: INTERFERENCE,
        CONCURRENCY: CONCURRENCY,
    }
    points = points_of(plan)
    assert server_for([p for p in points if p.cache_state == INTERFERENCE]) == INTERFERENCE
    assert server_for([p for p in points if p.cache_state == CONCURRENCY]) == CONCURRENCY
    assert server_for(points) == STUDY_SERVER  # several: the study's first
    assert server_for([]) == STUDY_SERVER


@pytest.mark.parametrize(
    ("selected", "after_prefix"),
    [
        (lambda points: [p for p in points if p.cache_state == COLD], 32),
        (lambda points: [p for p in points if p.cache_state != WARM], 32),
        (lambda points: [p for p in points if p.cache_state == WARM], 64 + 32),
        (lambda points: [], 64 + 32),  # none selected: the whole plan
    ],
    ids=["cold-only", "not-warm", "warm-only", "none"],
)
def test_a_selection_without_follow_ups_is_sized_as_a_cold_run(selected, after_prefix) -> None:  # noqa: ANN001
    plan = plan_of(decode_tokens=32)
    sized = sized_for(plan, selected(points_of(plan)))
    assert sized.tokens_after_prefix == after_prefix
    assert sized.max_model_len() == 2 * KI + after_prefix


def test_a_point_that_did_not_pass_is_named_with_its_workloads_words() -> None:
    """Each concurrency level of a length is its own point: the reports name its level."""
    plan = plan_of()
    words = {}
    for point in points_of(plan):
        record = Record(run_id="r", nodeid="t", outcome="failed", **record_identity(point))
        words[point.id] = point_words(record)
    assert words["len=1Ki-rep=0"] == "1Ki repeat 0"
    assert words["len=1Ki-rep=0-warm=2"] == "1Ki repeat 0 warm 2"
    assert words["len=2Ki-rep=1-interference"] == "2Ki repeat 1 under 3 background streams"
    assert words["len=1Ki-rep=0-conc=2"] == "1Ki repeat 0 at 2 requests at once"
    assert len(set(words.values())) == len(words)
