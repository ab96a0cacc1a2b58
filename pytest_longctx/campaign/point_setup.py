"""What the session decides for a point before it is measured (its budgets, its stream's
checks, a warm point's planned bytes), and what the server measured now holds of the
session's prompts.

The session decides (budgets, nonces, which tokenizer) and judges what came back;
:mod:`pytest_longctx.measure.measurement` measures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_longctx.campaign import budgets, concurrency
from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.campaign.run import RunDescription
from pytest_longctx.core.records import Record
from pytest_longctx.measure.cache_state import PlannedBytes
from pytest_longctx.measure.measurement import PointSettings
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import Point
from pytest_longctx.profiles import Profile


@dataclass
class ServerMemory:
    """What the server measured now holds of this session's prompts, and what it showed the
    session: kept by :class:`lifecycle.ServerLifecycle`, a new one for each server start (a
    server started again, or an attached one that stopped answering, holds none of it)."""

    #: When this server last computed each cold point's prompt (monotonic clock): the
    #: prefix its warm follow-ups find cached.
    prefix_sent: dict[Point, float] = field(default_factory=dict)
    #: What this server showed the interference points, found once: its sequence limit as
    #: probed and its effective chunk (``/server_info``).
    interference: dict[str, Any] | None = None
    #: What this server showed the concurrency points, found once: its cache's blocks
    #: (``vllm:cache_config_info``) and, attached, its sequence limit as probed.
    concurrency: dict[str, Any] | None = None

    def note_sent(self, point: Point) -> None:
        """This server has just computed ``point``'s prompt."""
        self.prefix_sent[point] = time.monotonic()

    def interference_server(self, find: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What this server shows the interference points: ``find()`` the first time."""
        if self.interference is None:
            self.interference = find()
        return self.interference

    def concurrency_server(self, find: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What this server shows the concurrency points: ``find()`` the first time."""
        if self.concurrency is None:
            self.concurrency = find()
        return self.concurrency


@dataclass(frozen=True)
class PointSetup:
    """What the session decides for one point before it is measured (:func:`prepare`):
    the measurement's settings, and the run's words an interference point's background
    needs (its nonces' key, its streams, how its stream is judged)."""

    settings: PointSettings
    run_id: str
    background_streams: int
    stream_tolerance: float
    keep_disagreeing: bool
    #: Keep and gate the background figures of a point whose gaps are refuted
    #: (--longctx-allow-unconfirmed).
    keep_unconfirmed: bool
    tcp_keepalive_s: float
    #: A concurrency level's own setup (None for the other points).
    level: concurrency.LevelSetup | None = None


def prepare(
    run: RunDescription,
    server: ServerInfo,
    point: Point,
    *,
    selected: Sequence[Point],
    records: Sequence[Record],
    measured_ttft: Mapping[int, float],
    stream_interval: int | None,
) -> PointSetup:
    """The point's settings, with the first-token budget grown from the TTFT this process
    ``measured_ttft`` so far, or from what the run knows before (its ``records``, the
    profile: :mod:`budgets`), the point's planned slowest engine step (the least a request
    abandoned mid-step is waited for) and the server's ``stream_interval`` as the warm-ups
    showed it; a concurrency level's setup knows the highest level ``selected``."""
    requests = point.concurrency if point.concurrent else 1
    budget_s, source = budgets.first_token_budget(
        run, records, measured_ttft, point.length, requests
    )
    settings = PointSettings(
        decode_tokens=run.plan.decode_tokens,
        first_token_budget_s=budget_s,
        budget_source=source,
        allow_unverified=run.settings.allow_unverified,
        stream_interval=stream_interval,
        planned_step_s=budgets.planned_step_s(
            run, records, point.length, campaign_server.workload_of(point)
        ),
    )
    if not point.interference:
        settings = dataclasses.replace(
            settings,
            stream_tolerance=run.settings.stream_tolerance,
            strict_stream=run.settings.strict_stream,
            prefix_tokens=point.length if point.warm else 0,
            # a launched server serves the profile's layout; an attached one, its own
            planned_bytes=(
                planned_bytes(run.plan.profile)
                if point.warm and server.mode == "launched"
                else None
            ),
        )
    return PointSetup(
        settings,
        run.run_id,
        run.plan.background_streams,
        run.settings.stream_tolerance,
        not run.settings.strict_stream,
        run.settings.allow_unconfirmed,
        run.settings.tcp_keepalive_s,
        concurrency.level_setup(run, selected) if point.concurrent else None,
    )


def planned_bytes(profile: Profile) -> PlannedBytes | None:
    """The capacity plan's bytes one request of N tokens holds (growing and state, on the
    fullest rank) at a block size: the resident KV of a warm point's prefix, where vLLM does
    not export its cache's size. None without the model's config."""
    try:
        layout = capacity_check.layout_for(profile)
    except ValueError:
        return None
    if layout is None or layout.allocation is None:
        return None

    def request_bytes(tokens: int, block_size: int | None) -> float:
        served = layout.with_changes(block_size=block_size) if block_size else layout
        return float(sum(served.request_bytes(tokens)))

    return request_bytes
