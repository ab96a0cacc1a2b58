"""One campaign over several servers under pytest-xdist: the split, the schedule, the run.

The end-to-end test here runs ``-n 2`` sessions on the launched stand-in: one server killed
mid-run and the run completed by a resume. Two real vLLM servers attached by URL (the suite's
shared cpu-tiny servers): tests/e2e/test_e2e_distributed.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from longctx_testing import (
    SWEEP_TEST,
    FakeNode,
    assert_bursts_kept_with_the_servers_figure,
    launch_fake_conftest,
    records_of,
    run_folder,
    run_session,
    schedule_on_two,
)
from longctx_testing import plan_settings as settings

from pytest_longctx.plan.points import Point
from pytest_longctx.plan.servers import ServerSplitError, split_servers
from pytest_longctx.profiles import load_profile
from pytest_longctx.workloads import points_of

POINTS_1KI_TO_8KI_X2 = {Point(n, r) for n in (1024, 2048, 4096, 8192) for r in (0, 1)}


# -- the split ---------------------------------------------------------------------------


def test_attached_endpoints_map_one_to_one_onto_workers() -> None:
    urls = ("http://a:1", "http://b:2", "http://c:3")
    slots = split_servers(settings(urls=urls), load_profile("cpu-tiny"), 2, [0, 1])
    assert [s.endpoint for s in slots] == ["http://a:1", "http://b:2"]
    with pytest.raises(ServerSplitError, match=r"-n 4 with 3 --longctx-url endpoint"):
        split_servers(settings(urls=urls), load_profile("cpu-tiny"), 4, [0, 1])


def test_cpu_servers_get_their_own_cores() -> None:
    slots = split_servers(settings(), load_profile("cpu-tiny"), 2, [0, 1, 2, 3, 4])
    assert [s.cores for s in slots] == [(0, 1), (2, 3)]
    assert [dict(s.env) for s in slots] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
        {"VLLM_CPU_OMP_THREADS_BIND": "2-3"},
    ]
    assert split_servers(settings(), load_profile("cpu-tiny"), 0, [0, 1])[0].env == {}
    with pytest.raises(ServerSplitError, match="need a core each; this session may use 2"):
        split_servers(settings(), load_profile("cpu-tiny"), 3, [0, 1])
    # Hyper-threads 0+4, 1+5, ...: each server gets whole physical cores.
    smt = {c: (c % 4, c % 4 + 4) for c in range(8)}
    slots = split_servers(settings(), load_profile("cpu-tiny"), 2, range(8), siblings=smt)
    assert [s.cores for s in slots] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert dict(slots[0].env) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1,4-5"}
    # Fewer physical cores than servers: logical ones, rather than no split at all.
    both = {0: (0, 1), 1: (0, 1)}
    slots = split_servers(settings(), load_profile("cpu-tiny"), 2, [0, 1], siblings=both)
    assert [s.cores for s in slots] == [(0,), (1,)]


@pytest.mark.parametrize(
    ("profile", "variable"),
    [("kimi-linear-h200", "CUDA_VISIBLE_DEVICES"), ("kimi-linear-mi355x", "HIP_VISIBLE_DEVICES")],
)
def test_gpu_servers_get_their_own_devices(profile: str, variable: str) -> None:
    loaded = load_profile(profile)
    parallel = loaded.serving.tensor_parallel_size * loaded.serving.pipeline_parallel_size
    per_server = max(parallel, 1)
    slots = split_servers(
        settings(devices_per_server=per_server), loaded, 2, [0], devices=2 * per_server
    )
    first = ",".join(str(i) for i in range(per_server))
    second = ",".join(str(i) for i in range(per_server, 2 * per_server))
    # ROCm: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES both, the same (vLLM refuses them apart).
    variables = (variable, "CUDA_VISIBLE_DEVICES")
    assert [dict(s.env) for s in slots] == [
        dict.fromkeys(variables, first),
        dict.fromkeys(variables, second),
    ]
    with pytest.raises(ServerSplitError, match="--longctx-devices-per-server"):
        split_servers(
            settings(devices_per_server=per_server), loaded, 3, [0], devices=2 * per_server
        )
    # A job given some of the node's devices (a batch scheduler's CUDA_VISIBLE_DEVICES)
    # hands out those, never indices from 0.
    given = [str(i) for i in range(8, 8 + 2 * per_server)]
    slots = split_servers(
        settings(devices_per_server=per_server),
        loaded,
        2,
        [0],
        environ={variable: ",".join(given)},
    )
    assert [s.devices for s in slots] == [tuple(given[:per_server]), tuple(given[per_server:])]


# -- the schedule ------------------------------------------------------------------------


def test_the_longest_points_go_first_to_every_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-repeats=2")
    from pytest_longctx.session.activation import PREPARED_KEY

    run = config.stash[PREPARED_KEY].run
    collection = ["test_sweep.py::test_regression[len=1Ki]", "test_other.py::test_unrelated"]
    collection += [f"test_sweep.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    scheduler, a, b, handed_out = schedule_on_two(config, run, collection)

    def names(indices: list[int]) -> list[str]:
        return [collection[i].split("[")[-1].rstrip("]") for i in indices]

    assert names(a.sent) == ["len=16Ki-rep=0", "len=8Ki-rep=0"]
    assert names(b.sent) == ["len=16Ki-rep=1", "len=8Ki-rep=1"]
    scheduler.mark_test_complete(b, b.sent[0])  # the worker that is free takes the next longest
    assert names(b.sent)[-1] == "len=4Ki-rep=0"
    while scheduler.has_pending:
        for node in (a, b):
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0])
    assert sorted(handed_out) == list(range(len(collection)))  # each item exactly once
    assert set(names(handed_out[-2:])) == {"len=1Ki", "test_other.py::test_unrelated"}
    lengths = [points_of(run.plan)[i - 2].length for i in handed_out[:-2]]
    assert lengths == sorted(lengths, reverse=True)
    assert a.shutting_down and b.shutting_down


def drain(scheduler, nodes) -> None:  # noqa: ANN001
    """Each worker completes what it holds, one item at a time, until nothing is left."""
    while scheduler.has_pending:
        for node in nodes:
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0])


def test_cold_points_go_out_with_their_follow_ups_then_interference_then_concurrency(
    pytester: pytest.Pytester,
) -> None:
    """A cold point and its warm follow-up are one unit; every cold unit goes out before the
    interference points, and those before the concurrency levels, each longest first: a
    worker starts each workload's server once."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    workloads = "--longctx-workload=cold,warm,interference,concurrency"
    config = pytester.parseconfigure(
        "--tx=2*popen",
        "--longctx-to=2Ki",
        workloads,
        "--longctx-max-concurrency=2",
        "--longctx-warm-questions=1",
    )
    from pytest_longctx.session.activation import PREPARED_KEY

    run = config.stash[PREPARED_KEY].run
    collection = [f"t.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    collection.append("t.py::test_unrelated")
    scheduler, a, b, handed_out = schedule_on_two(config, run, collection)

    def names(indices: list[int]) -> list[str]:
        return [collection[i].split("[")[-1].rstrip("]") for i in indices]

    assert names(a.sent) == ["len=2Ki-rep=0", "len=2Ki-rep=0-warm=1", "len=2Ki-rep=0-interference"]
    assert names(b.sent) == ["len=1Ki-rep=0", "len=1Ki-rep=0-warm=1", "len=1Ki-rep=0-interference"]
    drain(scheduler, (a, b))
    assert names(handed_out) == [
        "len=2Ki-rep=0",
        "len=2Ki-rep=0-warm=1",
        "len=1Ki-rep=0",
        "len=1Ki-rep=0-warm=1",
        "len=2Ki-rep=0-interference",
        "len=1Ki-rep=0-interference",
        "len=2Ki-rep=0-conc=1",
        "len=2Ki-rep=0-conc=2",
        "len=1Ki-rep=0-conc=1",
        "len=1Ki-rep=0-conc=2",
        "t.py::test_unrelated",
    ]


def test_items_alone_are_a_unit_each(pytester: pytest.Pytester) -> None:
    """Gate items and other tests after the points: a worker holds two of them at most."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-to=2Ki")
    from pytest_longctx.session.activation import PREPARED_KEY

    run = config.stash[PREPARED_KEY].run
    collection = [f"t.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    collection += [f"t.py::test_other_{index}" for index in range(4)]
    scheduler, a, b, handed_out = schedule_on_two(config, run, collection)
    assert [len(a.sent), len(b.sent)] == [2, 2]
    scheduler.mark_test_complete(a, a.sent[0])
    assert len(scheduler.node2pending[a]) == 2 and len(scheduler.pending) == 1
    while scheduler.has_pending:
        for node in (a, b):
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0])
                assert len(scheduler.node2pending[node]) <= 2
    assert sorted(handed_out) == list(range(len(collection)))


def test_a_session_without_sweep_points_is_scheduled_as_xdist_schedules_it(
    pytester: pytest.Pytester,
) -> None:
    """A project's other tests under pytest-xdist: the same items to the same workers as
    xdist's own load scheduling, a worker's crash included."""
    from xdist.scheduler import LoadScheduling

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-to=2Ki")
    from pytest_longctx.session.activation import PREPARED_KEY
    from pytest_longctx.session.scheduling import LongestFirstScheduling

    run = config.stash[PREPARED_KEY].run
    collection = [f"test_other.py::test_{index}" for index in range(40)]

    def play(scheduler) -> list[tuple[str, tuple[int, ...], bool]]:  # noqa: ANN001
        log: list[int] = []
        a, b = FakeNode("gw0", log), FakeNode("gw1", log)
        for node in (a, b):
            scheduler.add_node(node)
            scheduler.add_node_collection(node, collection)
        scheduler.schedule()
        seen = [(n.gateway.id, tuple(n.sent), n.shutting_down) for n in (a, b)]
        for _ in range(3):
            scheduler.mark_test_complete(a, scheduler.node2pending[a][0], 0.5)
            seen.append(("gw0", tuple(a.sent), a.shutting_down))
        scheduler.remove_node(b)  # it crashed: what it held goes to the others
        seen.append(("gw0", tuple(a.sent), a.shutting_down))
        while scheduler.has_pending:
            scheduler.mark_test_complete(a, scheduler.node2pending[a][0], 0.01)
            seen.append(("gw0", tuple(a.sent), a.shutting_down))
        return seen

    ours = LongestFirstScheduling(config, None, run)
    assert play(ours) == play(LoadScheduling(config, None))
    assert not ours.sweep


def sweep_on_two_to_4ki(pytester: pytest.Pytester):  # noqa: ANN201
    """1Ki..4Ki x2 scheduled over two fake workers: (scheduler, a, b, the item of each point)."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=2*popen", "--longctx-to=4Ki", "--longctx-repeats=2")
    from pytest_longctx.session.activation import PREPARED_KEY

    run = config.stash[PREPARED_KEY].run
    collection = [f"test_sweep.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    scheduler, a, b, _ = schedule_on_two(config, run, collection)
    item = {(p.length // 1024, p.repeat): i for i, p in enumerate(points_of(run.plan))}
    return scheduler, a, b, collection, item


def test_no_worker_finishes_while_a_lost_one_holds_points_it_hands_back(
    pytester: pytest.Pytester,
) -> None:
    """b's server dies during 4Ki; b hands back each point it holds as it reaches it. a runs
    out of pending points meanwhile: told to finish then (or the session ended), it could
    take nothing more, and b's last point would be handed to nobody. Each handed point is
    measured by a."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    assert (a.sent, b.sent) == ([item[4, 0], item[2, 0]], [item[4, 1], item[2, 1]])
    scheduler.mark_test_complete(b, item[4, 1])  # failed: its server died
    assert b.sent[-1] == item[1, 0]
    assert scheduler.hand_back(b, collection[item[2, 1]])  # b's server is lost for good
    scheduler.mark_test_complete(b, item[2, 1])
    assert b.shutting_down and scheduler.node2pending[b] == [item[1, 0]]
    scheduler.mark_test_complete(a, item[4, 0])
    scheduler.mark_test_complete(a, item[2, 0])
    assert scheduler.node2pending[a] == [item[2, 1], item[1, 1]] and not scheduler.pending
    assert not a.shutting_down  # b still holds 1Ki-rep=0
    scheduler.mark_test_complete(a, item[2, 1])
    assert not scheduler.tests_finished  # xdist would tell every worker to finish
    assert scheduler.hand_back(b, collection[item[1, 0]])
    assert scheduler.node2pending[a] == [item[1, 1], item[1, 0]]
    assert not a.shutting_down
    scheduler.mark_test_complete(b, item[1, 0])
    assert a.shutting_down  # b holds nothing more: a finishes what it holds
    for index in (item[1, 1], item[1, 0]):
        scheduler.mark_test_complete(a, index)
    assert scheduler.tests_finished
    measured_by_a = {collection[i] for i in a.sent}
    assert measured_by_a == set(collection) - {collection[item[4, 1]]}


def test_a_worker_out_of_points_waits_while_another_holds_points_beyond_the_one_it_runs(
    pytester: pytest.Pytester,
) -> None:
    """a runs out of points while b, healthy so far, runs 4Ki with 2Ki behind it. b's server
    may yet die during 4Ki and hand 2Ki back: a is not told to finish, nor the session, until
    b runs its last point. (Told to finish at once, a was gone when b's server died, and 2Ki
    was recorded as not measured: no worker left to take it.) b's server dies: a measures
    2Ki, and both finish."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    for index in (item[4, 0], item[2, 0], item[1, 0]):
        scheduler.mark_test_complete(a, index)
    assert not scheduler.pending and scheduler.node2pending[a] == [item[1, 1]]
    assert scheduler.node2pending[b] == [item[4, 1], item[2, 1]]
    assert not a.shutting_down and not scheduler.tests_finished
    scheduler.mark_test_complete(a, item[1, 1])
    assert not a.shutting_down and not scheduler.tests_finished  # b still holds 2Ki
    scheduler.doubt(b)  # the controller saw 4Ki-rep=1's record: engine_died
    scheduler.mark_test_complete(b, item[4, 1])
    assert scheduler.hand_back(b, collection[item[2, 1]])  # lost for good: a takes 2Ki
    assert scheduler.node2pending[a] == [item[2, 1]]
    scheduler.mark_test_complete(b, item[2, 1])  # b skips it, handed
    assert b.shutting_down
    scheduler.mark_test_complete(a, item[2, 1])
    assert a.shutting_down and scheduler.tests_finished
    assert {collection[i] for i in a.sent} == set(collection) - {collection[item[4, 1]]}


def test_an_idle_worker_waits_for_the_point_another_runs_and_finishes_after_it(
    pytester: pytest.Pytester,
) -> None:
    """A worker that holds nothing waits even for the one point another runs: that worker's
    server may die just before it sends the point, which then comes back (the other finished
    at once, it was recorded as not measured). It finishes once that point is done."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    for index in (item[4, 0], item[2, 0], item[1, 0], item[1, 1]):
        scheduler.mark_test_complete(a, index)
    assert not a.shutting_down
    scheduler.mark_test_complete(b, item[4, 1])  # b now runs 2Ki, its last point
    assert b.shutting_down and not a.shutting_down  # b must be told, to run its last item
    assert not scheduler.tests_finished
    scheduler.mark_test_complete(b, item[2, 1])
    assert a.shutting_down and scheduler.tests_finished


def test_workers_that_each_hold_their_last_point_are_told_to_finish_one_after_the_other(
    pytester: pytest.Pytester,
) -> None:
    """Each worker holds only its last point, which it runs only once told to finish: one is
    told, and the other waits until that one's point is done (neither waits on a worker not
    yet told: they would wait for ever)."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    for index in (item[4, 0], item[2, 0], item[1, 0]):
        scheduler.mark_test_complete(a, index)
    assert scheduler.node2pending[a] == [item[1, 1]] and not a.shutting_down
    scheduler.mark_test_complete(b, item[4, 1])
    assert scheduler.node2pending[b] == [item[2, 1]]
    assert b.shutting_down and not a.shutting_down and not scheduler.tests_finished
    scheduler.mark_test_complete(b, item[2, 1])
    assert a.shutting_down and scheduler.tests_finished


def test_a_point_handed_back_by_a_worker_told_to_finish_goes_to_one_still_waiting(
    pytester: pytest.Pytester,
) -> None:
    """A slow host: a ran ahead through every pending point while b's server started, and
    both hold their last point when b ends its first. b, told to finish, runs its last, and
    its server, dead by then, hands it back: a, holding its own last point, has waited for
    b's and takes it (told to finish with b, a was gone, and the point was not measured)."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    for index in (item[4, 0], item[2, 0], item[1, 0]):
        scheduler.mark_test_complete(a, index)
    scheduler.mark_test_complete(b, item[4, 1])
    assert b.shutting_down and scheduler.node2pending[b] == [item[2, 1]]
    assert scheduler.hand_back(b, collection[item[2, 1]])
    assert scheduler.node2pending[a] == [item[1, 1], item[2, 1]] and not a.shutting_down
    scheduler.mark_test_complete(b, item[2, 1])  # b skips it, handed
    assert a.shutting_down
    for index in (item[1, 1], item[2, 1]):
        scheduler.mark_test_complete(a, index)
    assert scheduler.tests_finished
    assert {collection[i] for i in a.sent} == set(collection) - {collection[item[4, 1]]}


def test_no_worker_finishes_while_one_whose_server_crashed_may_hand_points_back(
    pytester: pytest.Pytester,
) -> None:
    """b's server crashes during 4Ki; whether b can go on is known only at its next point
    (a relaunch may take minutes, and fail). Until then a, out of pending points, is not told
    to finish, nor the session; b is, so that it runs its last item. b's next point starts:
    its server is back, and a finishes once b's last point is done."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    scheduler.doubt(b)  # the controller saw 4Ki-rep=1's record: engine_died
    scheduler.mark_test_complete(b, item[4, 1])
    scheduler.mark_test_complete(a, item[4, 0])
    assert not scheduler.pending and scheduler.node2pending[b] == [item[2, 1], item[1, 0]]
    assert not a.shutting_down and not b.shutting_down and not scheduler.tests_finished
    scheduler.mark_test_complete(a, item[2, 0])
    assert not a.shutting_down and not scheduler.tests_finished
    scheduler.trust(b)  # b started 2Ki-rep=1
    assert b.shutting_down and not a.shutting_down  # b may yet hand back 1Ki-rep=0
    scheduler.mark_test_complete(b, item[2, 1])
    assert not a.shutting_down  # b runs its last point, which may yet come back
    scheduler.mark_test_complete(b, item[1, 0])
    assert a.shutting_down
    # out of pending points, a doubted worker is told to finish (it would never run its last
    # item else), the others wait; lost after all, it hands its points to them
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    scheduler.mark_test_complete(a, item[4, 0])
    scheduler.doubt(b)
    scheduler.mark_test_complete(b, item[4, 1])
    assert not scheduler.pending and scheduler.node2pending[b] == [item[2, 1], item[1, 1]]
    assert b.shutting_down and not a.shutting_down
    assert scheduler.hand_back(b, collection[item[2, 1]])
    scheduler.mark_test_complete(b, item[2, 1])
    scheduler.mark_test_complete(a, item[2, 0])
    assert a.sent[-1] == item[2, 1] and not a.shutting_down


def test_the_controller_doubts_a_worker_whose_point_crashed_its_server(
    pytester: pytest.Pytester,
) -> None:
    from pytest_longctx.core.records import Record
    from pytest_longctx.session.activation import PREPARED_KEY, SESSION_KEY
    from pytest_longctx.session.controller import Controller
    from pytest_longctx.session.items import record_identity
    from pytest_longctx.session.outputs import REPORT_ATTRIBUTE

    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    config = scheduler.config
    config.stash[SESSION_KEY] = SimpleNamespace()  # the sweep is active on the controller
    controller = Controller(config, config.stash[PREPARED_KEY].run)
    controller.scheduler = scheduler

    run = config.stash[PREPARED_KEY].run

    def report(index: int, when: str, failure_class: str | None = None) -> pytest.TestReport:
        """What b reports: a setup, or a point that failed with ``failure_class``."""
        outcome = "passed" if failure_class is None else "failed"
        made = pytest.TestReport(collection[index], ("t.py", 1, "x"), {}, outcome, None, when)
        if failure_class is not None:
            identity = record_identity(points_of(run.plan)[index])
            record = Record(run.run_id, collection[index], **identity, outcome="failed")
            record = dataclasses.replace(record, failure_class=failure_class)
            setattr(made, REPORT_ATTRIBUTE, record.to_json())
        made.node = b  # type: ignore[attr-defined]
        return made

    scheduler.doubt = lambda node: seen.append(("doubt", node))  # type: ignore[method-assign]
    scheduler.trust = lambda node: seen.append(("trust", node))  # type: ignore[method-assign]
    seen: list[tuple[str, object]] = []
    controller.pytest_runtest_logreport(report(item[4, 1], "setup"))
    controller.pytest_runtest_logreport(report(item[4, 1], "call", "timeout"))  # server up
    controller.pytest_runtest_logreport(report(item[4, 1], "call", "engine_died"))
    controller.pytest_runtest_logreport(report(item[2, 1], "setup"))
    assert seen == [("trust", b), ("doubt", b), ("trust", b)]


def test_a_point_no_worker_can_take_is_refused_and_the_lost_worker_gets_the_rest(
    pytester: pytest.Pytester,
) -> None:
    """Both servers lost: a handed point has no taker (hand_back says so), and the points
    still pending go to the last lost worker, which hands each back too (each gets a record
    saying why) rather than leaving xdist waiting for a worker."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    assert scheduler.hand_back(b, collection[item[4, 1]])
    scheduler.mark_test_complete(b, item[4, 1])
    assert not scheduler.hand_back(a, collection[item[4, 0]])  # no other worker left
    assert scheduler.pending  # 1Ki's points and the handed 4Ki-rep=1 were never sent
    scheduler.mark_test_complete(a, item[4, 0])
    assert a.shutting_down and not scheduler.pending
    assert {collection[i] for i in a.sent + b.sent} == set(collection)


def test_a_handed_point_no_worker_can_take_is_recorded_as_not_measured(
    pytester: pytest.Pytester,
) -> None:
    """The controller learns from hand_back that no worker took the point: a newer record of
    it says so (not "handed to the other workers"), and the report says so too."""
    from pytest_longctx.core.records import Record
    from pytest_longctx.core.stats import latest_records
    from pytest_longctx.session.activation import PREPARED_KEY, SESSION_KEY
    from pytest_longctx.session.controller import Controller
    from pytest_longctx.session.items import record_identity
    from pytest_longctx.session.outputs import REPORT_ATTRIBUTE
    from pytest_longctx.session.recorder import HANDED_BACK_ATTRIBUTE

    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    config = scheduler.config
    run = config.stash[PREPARED_KEY].run
    config.stash[SESSION_KEY] = SimpleNamespace()  # the sweep is active on the controller
    controller = Controller(config, run)
    controller.scheduler = scheduler

    def handed_report(node: FakeNode, index: int) -> pytest.TestReport:
        """What a worker whose server is lost reports for a point it hands back."""
        point = points_of(run.plan)[index]
        cause = "Skipped: the vLLM server exited with code -9"
        reason = f"{cause}\n{node.gateway.id} takes no more points: handed to the other workers"
        record = Record(
            run_id=run.run_id,
            nodeid=collection[index],
            **record_identity(point),
            outcome="skipped",
            reason=reason,
            failure_class="start_failed",
        )
        run.results.append(record)  # the worker appends its record itself
        report = pytest.TestReport(
            collection[index], ("test_sweep.py", 1, "x"), {}, "skipped", ("f", 1, reason), "setup"
        )
        setattr(report, REPORT_ATTRIBUTE, record.to_json())
        setattr(report, HANDED_BACK_ATTRIBUTE, node.gateway.id)
        report.node = node  # type: ignore[attr-defined]
        return report

    taken = handed_report(b, item[2, 1])
    controller.pytest_runtest_logreport(taken)  # a takes it
    assert "handed to the other workers" in taken.longrepr[2]
    a.shutting_down = True  # a was told to finish: nobody can take b's next point
    refused = handed_report(b, item[1, 0])
    controller.pytest_runtest_logreport(refused)
    records = latest_records(records_of(pytester.path / "reports"))
    by_point = {(r.length, r.repeat): r for r in records}
    assert "handed to the other workers" in by_point[2048, 1].reason
    not_measured = by_point[1024, 0]
    assert not_measured.outcome == "skipped" and not_measured.failure_class == "start_failed"
    assert not_measured.reason == (
        "Skipped: the vLLM server exited with code -9\n"
        "gw1 takes no more points, and no other worker was left to take this one: "
        "not measured (a resumed session measures it)"
    )
    assert refused.longrepr[2] == not_measured.reason
    assert Record.from_json(getattr(refused, REPORT_ATTRIBUTE)) == not_measured


def test_a_workers_run_is_created_with_its_place_in_the_campaign(
    pytester: pytest.Pytester,
) -> None:
    """What the controller hands a worker (its slot, the run's start, a split error) is the
    worker's run from its creation on, not patched in afterwards."""
    from pytest_longctx.campaign.run import Run
    from pytest_longctx.session import workers
    from pytest_longctx.session.activation import PREPARED_KEY

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--longctx-to=2Ki")
    settings, plan = config.stash[PREPARED_KEY].run.settings, config.stash[PREPARED_KEY].run.plan
    serial = workers.place(config, settings, plan)
    assert (serial.worker, serial.split_error, serial.started_at) == (None, None, None)
    assert serial.slot == serial.servers[0]
    config.workerinput = {  # what pytest_configure_node hands worker gw1
        "workerid": "gw1",
        workers.RUN_ID_KEY: "20260101T000000Z-abcdef",
        workers.STARTED_KEY: 1234.5,
        workers.SPLIT_ERROR_KEY: "no room for two servers",
        workers.SLOT_KEY: {"index": 1, "endpoint": "http://127.0.0.1:9", "cores": [3]},
    }
    placement = workers.place(config, settings, plan)
    run = Run.create(settings, plan, pytester.path, workers.run_from_controller(config), placement)
    assert (run.run_id, run.worker, run.started_at) == ("20260101T000000Z-abcdef", "gw1", 1234.5)
    assert run.split_error == "no room for two servers"
    assert (run.slot.index, run.slot.endpoint, run.slot.cores) == (1, "http://127.0.0.1:9", (3,))
    assert run.server_name == "server-gw1"


needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="two launched CPU servers need two cores"
)


@needs_two_cores
def test_plan_prints_the_split(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--longctx-plan")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "2 servers, one per pytest-xdist worker, each measured alone:",
            "  server 0: launched on cores * (VLLM_CPU_OMP_THREADS_BIND=*)",
            "  server 1: launched on cores * (VLLM_CPU_OMP_THREADS_BIND=*)",
        ]
    )
    assert not (pytester.path / "reports").exists()


def test_more_workers_than_endpoints_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "3", "--longctx-url=http://127.0.0.1:9,http://127.0.0.1:10"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-n 3 with 2 --longctx-url endpoint(s)*at most 2 workers*"])


def test_a_gate_item_waits_for_its_lengths_points_from_other_workers(
    pytester: pytest.Pytester,
) -> None:
    import threading
    import time

    from pytest_longctx.core.records import Record
    from pytest_longctx.session.activation import PREPARED_KEY
    from pytest_longctx.session.workers import wait_for_length

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--longctx-to=2Ki", "--longctx-repeats=2")
    run = config.stash[PREPARED_KEY].run
    run.selected_points = list(points_of(run.plan))
    started = time.time()

    def record(point: Point, finished: float) -> Record:
        return Record(
            run.run_id, point.id, point.length, point.repeat, "passed", finished_at=finished
        )

    run.results.append(record(Point(1024, 0), started - 60))  # an earlier session's: not this one's
    run.results.append(record(Point(1024, 0), started + 1))
    run.results.append(record(Point(2048, 0), started + 1))  # another length
    waiter = threading.Thread(target=wait_for_length, args=(run, 1024, started, 0.05))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive()  # 1Ki rep 1 is still being measured elsewhere
    run.results.append(record(Point(1024, 1), started + 2))
    waiter.join(timeout=10)
    assert not waiter.is_alive()


def test_more_workers_than_cores_fails_only_the_sweep(pytester: pytest.Pytester) -> None:
    """A project's other tests under `-n` are none of the sweep's business."""
    pytester.makepyfile(
        test_sweep=SWEEP_TEST,
        test_other="def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    )
    workers = str(len(os.sched_getaffinity(0)) + 1)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", workers, "test_other.py")
    result.assert_outcomes(passed=2)
    reports = pytester.path / "reports"
    assert not reports.exists() or not any(reports.iterdir())  # no run folder
    assert "need a core each" not in result.stdout.str()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", workers, "--longctx-to=1Ki"
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*CPU servers need a core each; this session may use*"])


def test_a_dead_workers_queue_goes_back_before_the_gate_items(pytester: pytest.Pytester) -> None:
    """Re-queued points behind gate items would leave the gate waiting for them forever."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--tx=1*popen", "--longctx-to=2Ki", "--longctx-repeats=2")
    from pytest_longctx.session.activation import PREPARED_KEY
    from pytest_longctx.session.scheduling import LongestFirstScheduling

    run = config.stash[PREPARED_KEY].run
    collection = [f"t.py::test_prefill_decode[{p.id}]" for p in points_of(run.plan)]
    collection += ["t.py::test_regression[len=1Ki]", "t.py::test_regression[len=2Ki]"]
    scheduler = LongestFirstScheduling(config, None, run)
    log: list[int] = []
    dead = FakeNode("gw0", log)
    scheduler.add_node(dead)
    scheduler.add_node_collection(dead, collection)
    scheduler.schedule()
    assert scheduler.remove_node(dead) == collection[dead.sent[0]]  # it crashed on its first
    replacement = FakeNode("gw1", log)
    scheduler.add_node(replacement)
    scheduler.node2collection[replacement] = collection
    scheduler.schedule()
    names = [collection[i] for i in replacement.sent]
    assert all("test_prefill_decode" in name for name in names), names


def test_a_dead_workers_points_go_back_in_cost_order(pytester: pytest.Pytester) -> None:
    """b dies measuring 4Ki-rep=1: the 2Ki point it held goes back ahead of the 1Ki ones."""
    scheduler, a, b, collection, item = sweep_on_two_to_4ki(pytester)
    assert scheduler.remove_node(b) == collection[item[4, 1]]
    assert scheduler.pending == [item[2, 1], item[1, 0], item[1, 1]]
    scheduler.mark_test_complete(a, item[4, 0])
    assert a.sent[-1] == item[2, 1]


def test_a_point_whose_worker_died_is_recorded_once(pytester: pytest.Pytester) -> None:
    from pytest_longctx.session.activation import PREPARED_KEY
    from pytest_longctx.session.controller import Controller
    from pytest_longctx.session.outputs import REPORT_ATTRIBUTE

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure("--longctx-to=2Ki")
    run = config.stash[PREPARED_KEY].run
    controller = Controller(config, run)
    nodeid = "test_sweep.py::test_prefill_decode[len=2Ki-rep=0]"
    report = SimpleNamespace(node=SimpleNamespace(gateway=SimpleNamespace(id="gw1")))
    controller.pytest_handlecrashitem(nodeid, report, None)
    (record,) = records_of(pytester.path / "reports")
    assert (record.length, record.repeat, record.outcome) == (2048, 0, "error")
    assert record.reason == "worker gw1 died while measuring this point"
    assert record.fingerprint == {}  # no setup to compare: the report lists no difference
    assert json.loads(json.dumps(getattr(report, REPORT_ATTRIBUTE)))["outcome"] == "error"
    controller.pytest_handlecrashitem(nodeid, report, None)  # already recorded: not again
    assert len(records_of(pytester.path / "reports")) == 1


def test_two_workers_given_as_a_tx_spec_each_get_a_server(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tx=2*popen", "--dist=load")
    result.assert_outcomes(passed=1)


def test_dist_each_would_measure_every_point_on_every_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tx=1*popen", "--dist=each", "--longctx-to=1Ki"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--dist each runs every sweep point on every worker*"])


# -- a server lost mid-run ----------------------------------------------------------------


#: Kills the server of worker gw1 as it starts its second point (first session only).
KILL_GW1_SERVER = """
import os, signal

started = []
#: Each server the session started, as it became ready; None for an attached one.
servers = []

def pytest_longctx_server_ready(config, base_url, mode, launched):
    servers.append(launched)

def pytest_runtest_call(item):
    worker = getattr(item.config, "workerinput", {}).get("workerid")
    if worker != "gw1" or os.path.exists("killed") or "rep=" not in item.name:
        return
    started.append(item.name)
    if len(started) == 2:
        open("killed", "w").close()
        os.killpg(servers[-1].pgid, signal.SIGKILL)
        servers[-1].process.wait()
"""


@needs_two_cores
def test_a_dead_server_loses_only_its_worker_and_resume_completes_the_run(
    pytester: pytest.Pytester,
) -> None:
    """No relaunches: gw1's server is killed as its second point starts. That point and any
    gw1 still held either fail (server gone) or are handed to gw0 (skipped, then measured
    there); gw0 carries on; a resumed session measures only what has no passed record."""
    from pytest_longctx.core.stats import latest_records

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    # the session's own bookkeeping over two workers: the stand-in server is launched
    pytester.makeconftest(KILL_GW1_SERVER + launch_fake_conftest())
    args = ("-n", "2", "--longctx-to=8Ki", "--longctx-repeats=2")
    result, output = run_session(pytester, *args, "--longctx-max-relaunches=0")
    assert (pytester.path / "killed").exists()
    records = records_of(output)
    assert {Point(r.length, r.repeat) for r in records} == POINTS_1KI_TO_8KI_X2
    by_worker = Counter((r.fingerprint.get("server", {}).get("worker"), r.outcome) for r in records)
    lost = [r for r in records if r.outcome != "passed"]
    assert lost and all(r.fingerprint["server"]["worker"] == "gw1" for r in lost), by_worker
    assert all(
        "vLLM server is gone" in r.reason
        or "exited" in r.reason
        or "takes no more points" in r.reason
        for r in lost
    ), [r.reason for r in lost]
    assert by_worker[("gw0", "passed")] >= 1 and by_worker[("gw1", "passed")] == 1
    latest = {Point(r.length, r.repeat): r for r in latest_records(records)}
    unfinished = [point for point, r in latest.items() if r.outcome != "passed"]
    for point, record in latest.items():  # a handed point was measured by gw0 after its skip
        if record.outcome == "passed" and any(Point(r.length, r.repeat) == point for r in lost):
            assert record.fingerprint["server"]["worker"] == "gw0"
    # gw1 holds its next point as its second fails: handed back, gw0 measures it (gw0 is not
    # told to finish while gw1 holds points it hands back)
    handed = {Point(r.length, r.repeat) for r in lost if "takes no more points" in r.reason}
    assert handed and any(latest[point].outcome == "passed" for point in handed), [
        latest[point].reason for point in handed
    ]
    served = json.loads((run_folder(output) / "server-gw0.json").read_text())
    assert served["stopped_at"]  # each worker's server ended with its session

    result, output = run_session(pytester, *args, "--longctx-resume")
    result.assert_outcomes(passed=8)
    after = records_of(output)
    assert len(after) == len(records) + len(unfinished)  # only those points were measured
    final = {Point(r.length, r.repeat): r for r in latest_records(after)}
    assert set(final) == POINTS_1KI_TO_8KI_X2
    assert all(r.outcome == "passed" for r in final.values())
    assert {r.run_id for r in after} == {run_folder(output).name}
    assert_bursts_kept_with_the_servers_figure(
        list(final.values()), (run_folder(output) / "report.md").read_text()
    )


# -- one server over several nodes ---------------------------------------------------------


def test_past_64mi_one_server_spans_nodes_and_the_plan_counts_them() -> None:
    """MLA's cache is replicated over TP ranks: only pipeline stages over more nodes shrink it."""
    from pytest_longctx.plan.capacity_check import check_points
    from pytest_longctx.plan.points import build_plan

    one_node = build_plan(settings(to_length=128 * 1024**2), load_profile("kimi-linear-mi355x"))
    four_nodes = build_plan(settings(), load_profile("kimi-linear-mi355x-4node"))
    length = 128 * 1024**2
    assert not check_points(one_node, [length])[length].fits
    fit = check_points(four_nodes, [length])[length]
    assert fit.fits
    # 2 of the model's 7 MLA layers per stage, 576 FP8 elements each: 128Mi + 1Ki tokens,
    # in whole blocks (vLLM 0.25.1, the profile's pin, aligns this hybrid's block to 480).
    from pytest_longctx.plan.capacity_check import layout_for

    block = layout_for(four_nodes.profile).allocation.block_size
    assert block == 480
    assert fit.kv_bytes == -(-(length + 1024) // block) * block * 2 * 576


def test_the_plan_prints_the_ray_head_and_worker_commands(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--longctx-profile=kimi-linear-mi355x-4node", "--longctx-plan"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "one server over 4 nodes x 8 devices (Ray executor; tensor parallel 8 x pipeline "
            "parallel 4):",
            "  on the head node:",
            "    env *VLLM_ROCM_USE_AITER=1* ray start --head --port=6379 --num-gpus=8",
            "  on each of the other 3 node(s):",
            "    env * ray start --address=HEAD_NODE_IP:6379 --num-gpus=8",
            "  then on the head node (a launched session runs this):",
            "    *--tensor-parallel-size 8 --pipeline-parallel-size 4 *"
            "--distributed-executor-backend ray*",
            "*(hybrid, TP=8 x PP=4, KV fp8_e4m3); 2 (of 7) MLA layers*",
            "128Mi *yes",
        ]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ('executor = "ray"', 'nodes = 4 needs [serving] executor = "ray"'),
        ("pipeline_parallel_size = 4", "should equal tensor_parallel_size x"),
    ],
)
def test_a_multi_node_profile_must_be_served_by_ray_on_every_device(
    tmp_path: Path, change: str, message: str
) -> None:
    from pytest_longctx.profiles import PROFILE_DIR, ProfileError

    text = (PROFILE_DIR / "kimi-linear-mi355x-4node.toml").read_text()
    assert change in text
    broken = tmp_path / "broken.toml"
    broken.write_text(text.replace(change, change.replace("ray", "mp").replace("4", "2")))
    with pytest.raises(ProfileError, match=re.escape(message)):
        load_profile(str(broken))
