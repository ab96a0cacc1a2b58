"""The server's lifecycle as the state machine it is: the first start, a start that never gets
ready, a death and a hang brought back, the relaunch limit, the crashes a length may cause, the
switch to a workload's own server and back, an attached server lost and found, the stop.

The subject is the lifecycle's own bookkeeping, so a launched server here is a stand-in process
object serving from ``tests/support/fake_vllm.py`` in this process: no process starts, no model is
built, each test takes a fraction of a second. vLLM's own starts and relaunches are
``test_e2e_relaunch.py``'s and ``test_e2e_serving.py``'s; the stand-in launched as a real
process group, ``test_relaunch_session.py``'s and ``test_outcomes.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import Behaviour, FakeVLLM
from longctx_testing import plan_settings

from pytest_longctx.campaign.hooks import CampaignHooks
from pytest_longctx.campaign.lifecycle import PointSkipped, ServerLifecycle
from pytest_longctx.campaign.run import Run
from pytest_longctx.measure.measurement import PointFailure
from pytest_longctx.measure.target import ServerError, ServerInfo
from pytest_longctx.plan.points import INTERFERENCE, Point, build_plan
from pytest_longctx.plan.run_description import Placement
from pytest_longctx.plan.servers import ServerSlot
from pytest_longctx.profiles import PROFILE_DIR, load_profile
from pytest_longctx.serving.vllm_command import ServerCommand, serve_args
from pytest_longctx.workloads import points_of

MODEL = "tiny-llama"
#: What vLLM says when its KV cache cannot hold the ``--max-model-len`` it was given.
KV_REFUSAL = (
    "ValueError: To serve at least one request with the model's max seq len (4104), (0.01 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based "
    "on the available memory, the estimated maximum model length is 2100."
)


class StandIn:
    """A launched server as the lifecycle drives it (``serving/process.py``'s
    ``LaunchedServer``): it serves from a fake vLLM on its command's port, fails to get ready
    or dies when the test says."""

    def __init__(self, plant: Plant, command: ServerCommand, log_path: Path, timeout_s: float):
        self.plant = plant
        self.command = command
        self.log_path = log_path
        self.base_url = ""
        #: No process group to wait for, and no process to give a dying one grace.
        self.pgid: int | None = None
        self.process = None
        self.server: FakeVLLM | None = None
        self.dead: ServerError | None = None
        self.not_ready: ServerError | None = None
        self.stops = 0

    def start(self) -> None:
        argv = self.command.argv
        port = int(argv[argv.index("--port") + 1])
        self.base_url = f"http://127.0.0.1:{port}"
        self.plant.made.append(self)
        if self.plant.failures:
            self.not_ready = self.plant.failures.pop(0)
            return
        self.server = FakeVLLM(self.plant.behaviour, port=port).start()

    def wait_ready(self) -> None:
        if self.not_ready is not None:
            raise self.not_ready

    def death(self) -> ServerError | None:
        return self.dead

    def check_alive(self, what: str = "is gone") -> None:
        if self.dead is not None:
            raise self.dead

    def stop(self) -> None:
        self.stops += 1
        if self.server is not None:
            self.server.stop()
            self.server = None

    def die(self, failure_class: str = "engine_died") -> None:
        """The process ends: its port closes, and it says how."""
        self.stop()
        self.dead = ServerError(f"the stand-in is gone ({failure_class})", failure_class)

    @property
    def serves(self) -> list[str]:
        """The flags it was started with (the command past the program)."""
        return list(self.command.argv[1:])


@dataclass
class Plant:
    """Where the stand-ins come from: what they serve, the starts that fail (in order), every
    one made and what the hooks were told."""

    behaviour: Behaviour
    failures: list[ServerError] = field(default_factory=list)
    made: list[StandIn] = field(default_factory=list)
    ready: list[tuple[str, str, Any]] = field(default_factory=list)

    def launch(self, command: ServerCommand, log_path: Path, timeout_s: float) -> StandIn:
        return StandIn(self, command, log_path, timeout_s)

    @property
    def last(self) -> StandIn:
        return self.made[-1]


@pytest.fixture
def plant() -> Plant:
    return Plant(Behaviour(model=MODEL, max_model_len=8192))


@pytest.fixture
def lifecycle_of(tmp_path: Path, plant: Plant) -> Iterator[Callable[..., ServerLifecycle]]:
    """A lifecycle of a run of cpu-tiny's profile (its model named as a hub id, so nothing is
    built) over 1Ki..4Ki, no warm-up prompts; ``changes`` are the settings' own."""
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    profile_path = tmp_path / "stand-in.toml"
    profile_path.write_text(text.replace("embedded:tiny-llama", f"stand-in/{MODEL}"))
    made: list[ServerLifecycle] = []

    def make(placement: Placement | None = None, **changes: Any) -> ServerLifecycle:
        settings = plan_settings(
            to_length=4096,
            profile=str(profile_path),
            output=tmp_path / "reports",
            decode_tokens=8,
            warmup_prompts=0,
            **changes,
        )
        plan = build_plan(settings, load_profile(settings.profile))
        run = Run.create(settings, plan, tmp_path, placement=placement or Placement())
        run.selected_points = list(points_of(plan))

        def stand_in(plan: object, command: ServerCommand) -> ServerCommand:
            return ServerCommand(("stand-in", *(serve_args(command.argv) or ())), {})

        hooks = CampaignHooks(
            server_command=stand_in,
            server_ready=lambda url, mode, launched: plant.ready.append((url, mode, launched)),
            command_line=("pytest", "-k", "sweep"),
        )
        lifecycle = ServerLifecycle(run, hooks, plant.launch)
        made.append(lifecycle)
        return lifecycle

    yield make
    for lifecycle in made:
        lifecycle.stop()


def point(length: int, **kwargs: Any) -> Point:
    return Point(length, 0, **kwargs)


def cause_of(lifecycle: ServerLifecycle, start: int) -> str:
    return lifecycle.history.starts[start]["cause"]


# -- the first start ---------------------------------------------------------------------------


def test_the_first_start_launches_once_and_tells_the_hooks(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    info = lifecycle.start()
    assert (info.mode, info.model_name, info.base_url) == ("launched", MODEL, plant.last.base_url)
    assert lifecycle.start() is info  # once per session
    assert len(plant.made) == 1
    assert plant.ready == [(info.base_url, "launched", plant.last)]
    # the hook's command is what ran, sized for the selected lengths
    assert plant.last.serves[plant.last.serves.index("--max-model-len") + 1] == str(4096 + 8)
    assert [start["index"] for start in lifecycle.history.starts] == [0]
    findings = lifecycle.run.findings
    assert findings.fingerprint["command_line"] == ["pytest", "-k", "sweep"]
    assert findings.fingerprint["server_mode"] == "launched"
    assert findings.model is not None
    lifecycle.warm_up(info)
    assert findings.fingerprint["stream"]["tolerance"] == 0.5


def test_a_start_that_never_gets_ready_is_kept_and_every_point_fails_at_once(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    plant.failures.append(ServerError("the stand-in did not become healthy", "start_failed"))
    lifecycle = lifecycle_of()
    with pytest.raises(ServerError, match="did not become healthy"):
        lifecycle.start()
    assert plant.last.stops == 1  # a failed start leaves nothing behind
    with pytest.raises(ServerError, match="did not become healthy"):
        lifecycle.start()  # kept: not started again
    with pytest.raises(PointFailure, match="did not become healthy") as failure:
        lifecycle.before_point(point(1024))
    assert (failure.value.failure_class, failure.value.sent) == ("start_failed", False)
    assert len(plant.made) == 1 and plant.ready == []


def test_lengths_vllm_refuses_at_start_up_are_skipped_and_the_rest_served(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    """vLLM's KV cache holds 2,100 tokens: 4Ki (+ 8 decode) is refused with its words and
    the server is started again for 2Ki."""
    plant.failures.append(ServerError("the engine failed to start", "oom", (KV_REFUSAL,)))
    lifecycle = lifecycle_of()
    lifecycle.start()
    assert len(plant.made) == 2
    lengths = [s.serves[s.serves.index("--max-model-len") + 1] for s in plant.made]
    assert lengths == [str(4096 + 8), str(2048 + 8)]
    assert cause_of(lifecycle, 0).startswith("vLLM refused --max-model-len 4104 (estimated ")
    with pytest.raises(PointSkipped, match="holds at most 2100") as skipped:
        lifecycle.before_point(point(4096))
    assert skipped.value.failure_class == "oom"
    lifecycle.before_point(point(2048))  # served


# -- a death, a hang, the limits ---------------------------------------------------------------


def test_a_dead_server_is_started_again_with_the_same_command_before_the_next_point(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    lifecycle.start()
    lifecycle.memory.note_sent(point(1024))
    first = plant.last
    first.die("engine_died")
    assert lifecycle.server_down()
    lifecycle.before_point(point(2048))
    again = plant.last
    assert again is not first and again.command == first.command
    assert cause_of(lifecycle, 1) == "engine_died: the stand-in is gone (engine_died)"
    assert lifecycle.history.relaunches == 1
    assert [mode for _, mode, _ in plant.ready] == ["launched", "launched"]
    assert lifecycle.current.base_url == again.base_url and not lifecycle.server_down()
    assert lifecycle.memory.prefix_sent == {}  # it holds none of the prefixes sent before
    lifecycle.before_point(point(4096))  # alive: nothing started
    assert len(plant.made) == 2


def test_a_hang_stops_the_server_counts_against_its_length_and_starts_it_again(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    lifecycle.start()
    hung = plant.last
    lifecycle.after_failure(point(2048), PointFailure("no token for 600 s", "hang", sent=True))
    assert hung.stops == 1 and lifecycle.server_down()
    assert lifecycle.history.crashes == {2048: ["hang"]}
    lifecycle.before_point(point(4096))
    assert len(plant.made) == 2
    assert cause_of(lifecycle, 1) == "hang: the server hung during len=2Ki-rep=0"


def test_a_failure_that_is_not_a_crash_counts_nothing(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    lifecycle.start()
    lifecycle.after_failure(point(2048), PointFailure("timed out", "timeout", sent=True))
    lifecycle.after_failure(point(2048), PointFailure("gone", "engine_died", sent=False))
    assert lifecycle.history.crashes == {} and not lifecycle.server_down()


def test_a_length_that_crashed_the_server_too_often_is_skipped_with_its_last_class(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(max_crashes_per_length=2)
    lifecycle.start()
    for klass in ("engine_died", "oom"):
        lifecycle.before_point(point(2048))
        lifecycle.after_failure(point(2048), PointFailure("down", klass, sent=True))
        plant.last.die(klass)
    with pytest.raises(PointSkipped, match="took the server down 2 times") as skipped:
        lifecycle.before_point(point(2048))
    assert (skipped.value.failure_class, skipped.value.handed_back) == ("oom", False)
    lifecycle.before_point(point(1024))  # another length: brought back and measured
    assert lifecycle.history.relaunches == 2


def test_once_relaunches_are_spent_the_points_left_are_never_sent(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    """One relaunch: its start fails, which spends it; the point is not sent, and neither is
    any after it, without another start."""
    lifecycle = lifecycle_of(max_relaunches=1)
    lifecycle.start()
    plant.last.die("engine_died")
    plant.failures.append(ServerError("the stand-in fails this start", "start_failed"))
    with pytest.raises(PointFailure) as failure:
        lifecycle.before_point(point(2048))
    message = str(failure.value)
    assert (failure.value.failure_class, failure.value.sent) == ("start_failed", False)
    assert message.startswith("relaunching the server after engine_died")
    assert "relaunches are spent (1 of --longctx-max-relaunches=1)" in message
    made = len(plant.made)
    with pytest.raises(PointFailure, match="relaunches are spent"):
        lifecycle.before_point(point(4096))
    assert len(plant.made) == made == 2


def test_a_relaunch_whose_start_fails_is_tried_again_while_relaunches_are_left(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(max_relaunches=2)
    lifecycle.start()
    plant.last.die("engine_died")
    plant.failures.append(ServerError("the stand-in fails this start", "start_failed"))
    lifecycle.before_point(point(2048))
    assert len(plant.made) == 3 and lifecycle.history.relaunches == 2
    assert cause_of(lifecycle, 1).endswith(
        "; 1 start(s) failed before it, the last: the stand-in fails this start"
    )


def test_a_worker_whose_server_is_lost_for_good_hands_its_points_back(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(Placement(worker="gw1"), max_relaunches=0)
    lifecycle.start()
    plant.last.die("engine_died")
    with pytest.raises(PointSkipped, match="gw1 takes no more points") as handed:
        lifecycle.before_point(point(2048))
    assert (handed.value.handed_back, handed.value.failure_class) == (True, "start_failed")


# -- a workload's own server -------------------------------------------------------------------


def test_the_interference_points_get_a_server_of_their_own_and_the_cold_ones_theirs_back(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(workload=("cold", INTERFERENCE), background_streams=2)
    lifecycle.start()
    cold = plant.last
    assert cold.serves[cold.serves.index("--max-num-seqs") + 1] == "1"
    lifecycle.before_point(point(1024, background=2, workload=INTERFERENCE))
    loaded = plant.last
    assert cold.stops == 1 and loaded is not cold
    assert loaded.serves[loaded.serves.index("--max-num-seqs") + 1] == "3"  # K + 1
    assert lifecycle.workload == INTERFERENCE
    assert lifecycle.history.starts[1]["workload"] == INTERFERENCE
    assert cause_of(lifecycle, 1).startswith("the interference workload: room for 2 background")
    assert lifecycle.run.findings.fingerprint["server_command"] == list(loaded.command.argv)
    assert lifecycle.history.relaunches == 0  # a switch is no relaunch
    # the same workload: nothing started
    lifecycle.before_point(point(1024, background=2, workload=INTERFERENCE))
    lifecycle.before_point(point(2048))
    assert len(plant.made) == 3 and lifecycle.workload == "cold"
    assert cause_of(lifecycle, 2) == "the cold workload: the study's server again"


def test_a_session_of_interference_points_only_starts_their_server_first(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(workload=("cold", INTERFERENCE), background_streams=2)
    lifecycle.run.selected_points = [p for p in points_of(lifecycle.run.plan) if p.interference]
    lifecycle.start()
    assert lifecycle.workload == INTERFERENCE and len(plant.made) == 1
    lifecycle.before_point(point(1024, background=2, workload=INTERFERENCE))
    assert len(plant.made) == 1


# -- an attached server ------------------------------------------------------------------------


def test_an_attached_server_lost_during_a_point_is_checked_to_be_the_same_before_the_next(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    with FakeVLLM(plant.behaviour) as server:
        lifecycle = lifecycle_of(urls=(server.url,))
        info = lifecycle.start()
        assert (info.mode, plant.made, plant.ready) == (
            "attached",
            [],
            [(server.url, "attached", None)],
        )
        lifecycle.after_failure(point(1024), PointFailure("connection reset", "server_gone"))
        lifecycle.before_point(point(2048))  # it answers, and it is the same server
        assert cause_of(lifecycle, 1).startswith("server_gone: connection reset; answered again")
        lifecycle.after_failure(point(2048), PointFailure("connection reset", "server_gone"))
        server.configure(model="another-model")
        with pytest.raises(PointFailure, match="not the server this run measured") as failure:
            lifecycle.before_point(point(4096))
        assert (failure.value.failure_class, failure.value.sent) == ("server_gone", False)


def test_an_attached_server_that_does_not_answer_again_fails_its_points(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    server = FakeVLLM(plant.behaviour).start()
    lifecycle = lifecycle_of(urls=(server.url,), reattach_timeout_s=0.0)
    lifecycle.start()
    server.stop()
    with pytest.raises(PointFailure, match="did not answer again within 0 s") as failure:
        lifecycle.before_point(point(1024))
    assert failure.value.failure_class == "server_gone"
    with pytest.raises(PointFailure, match="did not answer again"):
        lifecycle.before_point(point(2048))  # kept


# -- the stop ----------------------------------------------------------------------------------


def test_stop_ends_the_launched_server_once(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    lifecycle.start()
    lifecycle.stop()
    lifecycle.stop()
    assert plant.last.stops == 1 and lifecycle.launched is None


def test_a_split_the_workers_cannot_have_starts_nothing(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of(Placement(servers=(ServerSlot(0),), split_error="no cores left"))
    with pytest.raises(ServerError, match="no cores left"):
        lifecycle.start()
    with pytest.raises(PointFailure, match="no cores left"):
        lifecycle.before_point(point(1024))
    assert plant.made == []


def test_the_current_server_is_the_one_measured(
    lifecycle_of: Callable[..., ServerLifecycle], plant: Plant
) -> None:
    lifecycle = lifecycle_of()
    assert lifecycle.current is None
    info = lifecycle.start()
    assert isinstance(lifecycle.current, ServerInfo) and lifecycle.current == info
