"""Longest-predicted-first scheduling of sweep points over pytest-xdist workers.

The campaign's wall time is set by its longest points: a 64Mi point alone can take hours, so
it must start first, not last behind a queue of short ones (LPT scheduling). Any TTFT model
that grows with the prompt length (the study's, a fitted a + bL + cL^2, the profile's scale)
orders points the same way, so the order is by length, longest first, and a point's repeats
spread over the servers. Gate items and other tests run after every point has been handed out.

Each worker holds at most two units: the one it runs and the next (an xdist worker only
starts an item once it knows the one after it, or is told to finish). The next unit is given
when one completes, so a long point never waits behind a queue on a busy server. A unit is a
cold point with its warm follow-ups (they reuse the prefix it leaves in its server's cache, so
they go to that server, right after it), or any other item alone. The interference points,
longest first too, come after every cold one: each worker switches to their server once.

A worker whose server is lost for good hands back every point it still holds (``hand_back``),
one at a time as it reaches them. Until it has, no other worker is told to finish, nor the
session: a worker told to finish takes nothing more, and a point handed back to nobody is not
measured. The same holds from the moment a worker's server crashed during a point (``doubt``)
until the worker starts its next point (``trust``: the server came back) or hands it back:
the relaunch that decides may take minutes. And a worker told to finish may yet find its
server dead as it starts its last point: the others wait for that point too, so workers that
each hold their last point finish one after the other, however far one ran ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

from pytest_longctx.campaign.run import Run
from pytest_longctx.plan.points import Point
from pytest_longctx.session.items import point_of_nodeid
from pytest_longctx.workloads import workload_of

#: Units a worker holds: the one it runs and the one after it.
ITEMS_PER_WORKER = 2


class LongestFirstScheduling(LoadScheduling):
    """xdist's load scheduling, with the pending items ordered by predicted cost."""

    def __init__(self, config: pytest.Config, log: Any, run: Run) -> None:
        super().__init__(config, log)
        self.run = run
        #: The workers' common collection, once every one has sent it (xdist's own field).
        self.collection: list[str] | None = None
        #: False for a session without sweep points: then it is xdist's load scheduling.
        self.sweep = True
        self._points: dict[str, Point | None] = {}
        #: Workers whose server is lost for good: they take no more points.
        self.lost: set[Any] = set()
        #: Workers whose server crashed during their last point, not yet seen starting one
        #: since: the points they hold may come back.
        self.doubted: set[Any] = set()

    def _point(self, nodeid: str) -> Point | None:
        if nodeid not in self._points:
            self._points[nodeid] = point_of_nodeid(self.run.plan, nodeid)
        return self._points[nodeid]

    def _order(self, collection: Sequence[str]) -> list[int]:
        def key(index: int) -> tuple[int, int, int, int, int, int]:
            point = self._point(collection[index])
            if point is None:
                return (3, 0, 0, 0, 0, index)  # gate items and other tests: after every point
            # a workload's own server after the study's (interference, then the concurrency
            # levels): each worker starts each server once
            rank = workload_of(point).schedule_rank
            return (rank, -point.length, point.repeat, point.question, point.concurrency, index)

        return sorted(range(len(collection)), key=key)

    def _unit(self, index: int) -> Point | None:
        """The cold point an item belongs with (None: an item alone)."""
        assert self.collection is not None
        point = self._point(self.collection[index])
        return None if point is None else workload_of(point).reuses(point) or point

    def _units_in(self, indices: Sequence[int]) -> int:
        units, last = 0, None
        for index in indices:
            unit = self._unit(index)
            if unit is None or unit != last:
                units += 1
            last = unit
        return units

    def _send_tests(self, node: Any, num: int) -> None:
        """Send ``num`` units: a cold point and its follow-ups always together."""
        if not self.sweep or self.collection is None:
            super()._send_tests(node, num)
            return
        take, units, last = 0, 0, None
        while take < len(self.pending):
            unit = self._unit(self.pending[take])
            if unit is None or unit != last:
                if units == num:
                    break
                units += 1
            last = unit
            take += 1
        super()._send_tests(node, take)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection = next(iter(self.node2collection.values()))
        if not any(point_of_nodeid(self.run.plan, nodeid) for nodeid in collection):
            self.sweep = False  # a project's other tests: xdist's chunks, unchanged
            super().schedule()
            return
        self.collection = collection
        self.pending[:] = self._order(self.collection)
        # Round robin: the longest point to each worker first, then the next longest to each.
        for _ in range(ITEMS_PER_WORKER):
            for node in self.nodes:
                self._send_tests(node, 1)
        if not self.pending:
            for node in self.nodes:
                node.shutdown()

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if not self.sweep:
            super().check_schedule(node, duration)
            return
        if node.shutting_down:
            return
        if node in self.lost:
            if not self._takers():
                # nobody else can take them: its points each get a record saying so, its gate
                # items run, and the session ends rather than waiting for a worker
                self._send_tests(node, len(self.pending))
            node.shutdown()  # it finishes what it holds, handing those points back too
            return
        wanted = ITEMS_PER_WORKER - self._units_in(self.node2pending[node])
        if wanted > 0:
            self._send_tests(node, wanted)
        # a doubted worker runs its last item only once told to finish: that item decides
        if not self.pending and (node in self.doubted or not self._may_come_back_to(node)):
            node.shutdown()

    def _points_held(self, node: Any, last_included: bool = False) -> int:
        """Points (not gate items: a worker runs its own) ``node`` holds and may hand back: a
        lost or doubted worker's every one; a healthy worker's those beyond the one it runs,
        or every one with ``last_included`` (its server may die just before it sends the point
        it runs, which then comes back too)."""
        assert self.collection is not None
        held = [i for i in self.node2pending.get(node, ()) if self._point(self.collection[i])]
        if last_included or node in self.lost | self.doubted:
            return len(held)
        return max(0, len(held) - 1)

    def _may_come_back_to(self, node: Any) -> bool:
        """Whether another worker holds points it may yet hand to ``node``. One that holds
        nothing waits for every point another holds, the one it runs included; so does one
        that holds its own last item, for a worker already told to finish (it runs its last
        point, whose server may be found dead as it starts, and the point comes back). Of a
        worker not yet told it waits only for the points beyond the one it runs: xdist runs a
        worker's last item once it is told to finish, and workers that each waited for
        another's last item would wait for ever. So of workers that each hold their last
        point one is told to finish, and the others once its point is done."""
        idle = not self.node2pending.get(node)
        return any(
            self._points_held(other, last_included=idle or other.shutting_down)
            for other in self.node2pending
            if other is not node
        )

    @property
    def points_may_come_back(self) -> bool:
        """Whether a point may still come back to a worker: a lost or doubted worker holds
        one, or a worker that can take points waits for another's."""
        if self.collection is None:
            return False
        if any(self._points_held(node) for node in self.lost | self.doubted):
            return True
        return any(self._may_come_back_to(node) for node in self._takers())

    @property
    def tests_finished(self) -> bool:
        """xdist ends the session when nothing is pending and every worker holds at most
        its last item; not while points may still come back."""
        if self.sweep and self.points_may_come_back:
            return False
        return super().tests_finished

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        if self.sweep and not self.pending:  # the workers that waited for points may finish
            for other in self.nodes:
                if other not in self.lost | self.doubted:
                    self.check_schedule(other)

    def _recheck(self) -> None:
        """The workers that waited for points to come back may take them, or finish."""
        for node in self.nodes:
            self.check_schedule(node)

    def doubt(self, node: Any) -> None:
        """The worker's server crashed during its point: it may be lost for good."""
        self.doubted.add(node)

    def trust(self, node: Any) -> None:
        """The worker started a point of its own: its server came back."""
        if node in self.doubted:
            self.doubted.discard(node)
            if self.sweep:
                self._recheck()

    def remove_node(self, node: Any) -> str | None:
        """A dead worker's queued items go back in cost order: points before gate items."""
        crashitem = super().remove_node(node)
        if self.sweep and self.collection is not None:
            order = {index: rank for rank, index in enumerate(self._order(self.collection))}
            self.pending.sort(key=order.__getitem__)
        return crashitem

    def _takers(self) -> list[Any]:
        """The workers that can still take a point: their server not lost, not finishing."""
        return [n for n in self.nodes if n not in self.lost and not n.shutting_down]

    def hand_back(self, node: Any, nodeid: str) -> bool:
        """A point the worker could not measure (its server is lost for good) goes to the
        other workers; False when none is left to take it."""
        self.lost.add(node)
        self.doubted.discard(node)
        others = self._takers()
        if not others or self.collection is None or nodeid not in self.collection:
            return False
        order = {index: rank for rank, index in enumerate(self._order(self.collection))}
        self.pending.append(self.collection.index(nodeid))
        self.pending.sort(key=order.__getitem__)
        for other in others:
            self.check_schedule(other)
        return True
