"""Progress in a whole session against the fake server: what is printed in each mode, the
progress file while a point runs, and what the records keep."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import pytest
from fake_vllm import FakeVLLM
from longctx_testing import NO_PLOTS, SWEEP_TEST, records_of, run_folder

PROGRESS_LINE = "longctx 4Ki rep 0 [3/3]"


@dataclass
class _PrefillTakesTime:
    """After the warm-up: a first token ``length * 1e-4`` s (4Ki: 0.4 s) after the request,
    the prompt computed 512 tokens a step (4Ki: a step every 50 ms), so the prefilled count
    moves through the whole prefill, not only in its second half."""

    fake: FakeVLLM
    #: A length whose completion comes short (its item fails).
    fail_at: int | None = None

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        point = item.callspec.params["longctx_point"]  # type: ignore[attr-defined]
        self.fake.configure(
            first_token_delay_s=point.length * 1e-4,
            prefill_chunk_tokens=512,
            token_delay_s=0.005,
            tokens=3 if point.length == self.fail_at else None,
        )


@pytest.fixture
def session(pytester: pytest.Pytester, fake_vllm: FakeVLLM):  # noqa: ANN201
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def run(*args: str, fail_at: int | None = None):  # noqa: ANN202
        return pytester.runpytest(
            "-p",
            "no:cacheprovider",
            f"--longctx-url={fake_vllm.url}",
            f"--longctx-output={output}",
            "--longctx-decode-tokens=8",
            "--longctx-progress-interval=50ms",
            NO_PLOTS,  # the progress display is the subject, not the reports' figures
            *(
                args
                if any(a.startswith("--longctx-to") for a in args)
                else (*args, "--longctx-to=4Ki")
            ),
            plugins=[_PrefillTakesTime(fake_vllm, fail_at)],
        )

    return run, output


def test_plain_lines_without_a_terminal_and_the_eta_before_each_point(session) -> None:  # noqa: ANN001
    run, output = session
    result = run("--longctx-progress-throttle=0")  # auto: pytester's output is no terminal
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    assert "\r" not in text
    # before each point: what it is, its predicted TTFT once two lengths are in
    result.stdout.fnmatch_lines(
        [
            "longctx next: 1Ki rep 0 [[]1/3[]]: TTFT not predicted yet (two lengths needed)*",
            "longctx next: 2Ki rep 0 [[]2/3[]]: TTFT not predicted yet*",
            "longctx next: 4Ki rep 0 [[]3/3[]]: predicted TTFT *, point ~*; sweep ~* left (no more "
            "points)",
        ]
    )
    # inside the point: plain lines with the prefill seen through the KV gauge
    inside = [line for line in text.splitlines() if line.startswith(PROGRESS_LINE)]
    assert any("prefilled" in line and "first token in ~" in line for line in inside), inside
    # the summary: the model, predicted against measured, energy missing on this host
    result.stdout.fnmatch_lines(
        [
            "pytest-longctx progress: ETA model: TTFT ≈ * s, fitted to 3 lengths (1Ki..4Ki)",
            "pytest-longctx progress: predicted vs measured TTFT: 4Ki rep 0 * vs * (*%)",
            "pytest-longctx progress: sweep: every selected point measured (session took *)",
            "pytest-longctx progress: energy: not measured (*)",
        ]
    )
    records = records_of(output)
    assert [("predicted_ttft" in r.figures) for r in records] == [False, False, True]
    assert records[2].figures["predicted_ttft"] > 0
    assert "energy" not in records[2].figures
    assert records[0].fingerprint["device_telemetry"]["tool"] is None
    folder = run_folder(output)
    assert sorted(p.name for p in (folder / "samples").iterdir()) == [
        "len=1Ki-rep=0.jsonl",
        "len=2Ki-rep=0.jsonl",
        "len=4Ki-rep=0.jsonl",
    ]
    final = json.loads((folder / "progress.json").read_text())
    assert final["phase"] == "finished" and final["remaining_points"] == 0


def test_plain_lines_are_throttled(session) -> None:  # noqa: ANN001
    run, _ = session
    result = run()  # one plain line a minute at most: none inside sub-second points
    result.assert_outcomes(passed=3)
    lines = result.stdout.str().splitlines()
    assert not [line for line in lines if line.startswith("longctx 4Ki")]
    assert len([line for line in lines if line.startswith("longctx next:")]) == 3


def test_off_prints_nothing_and_still_writes_the_files(session) -> None:  # noqa: ANN001
    run, output = session
    result = run("--longctx-progress=off", "--longctx-progress-throttle=0")
    result.assert_outcomes(passed=3)
    assert "longctx next" not in result.stdout.str()
    assert "longctx 4Ki" not in result.stdout.str()
    assert "pytest-longctx progress" not in result.stdout.str()
    folder = run_folder(output)
    assert json.loads((folder / "progress.json").read_text())["phase"] == "finished"
    assert (folder / "samples" / "len=4Ki-rep=0.jsonl").is_file()
    assert "predicted_ttft" in records_of(output)[2].figures


def test_line_mode_rewrites_one_line_in_place(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """In a process of its own, to see the raw bytes it writes (a reader of lines would split
    them at each carriage return)."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    fake_vllm.configure(first_token_delay_s=0.5, token_delay_s=0.005)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        f"--longctx-url={fake_vllm.url}",
        f"--longctx-output={pytester.path / 'reports'}",
        "--longctx-decode-tokens=8",
        "--longctx-to=2Ki",
        "--longctx-progress-interval=50ms",
        "--longctx-progress=line",
        NO_PLOTS,
        "-v",
    )
    result.assert_outcomes(passed=2)
    raw = (pytester.path / "stdout").read_bytes().decode()
    line = "longctx 2Ki rep 0 [2/2]"
    assert f"\r{line}" in raw
    # the rewrites follow one another on one line: no newline between two of them
    start = raw.index(f"\r{line}")
    end = raw.index("\n", start)
    assert raw[start:end].count(f"\r{line}") >= 2, raw[start:end]
    assert "longctx next" not in raw  # a live line says it as it goes
    # cleared at the end of the point: pytest's own result follows on a clean line
    result.stdout.fnmatch_lines(["*test_prefill_decode?len=2Ki-rep=0? PASSED*"])


@pytest.mark.parametrize("flags", [("-s",), ("-q",), ("-s", "-q", "--longctx-progress=line")])
def test_capture_and_verbosity_flags_do_not_break_it(session, flags) -> None:  # noqa: ANN001
    run, output = session
    result = run("--longctx-progress-throttle=0", *flags)
    result.assert_outcomes(passed=3)
    assert PROGRESS_LINE in result.stdout.str()
    assert len(records_of(output)) == 3


def test_no_sampling_with_a_zero_interval(session) -> None:  # noqa: ANN001
    run, output = session
    result = run("--longctx-progress-interval=0", "--longctx-progress-throttle=0")
    result.assert_outcomes(passed=3)
    assert PROGRESS_LINE not in result.stdout.str()
    folder = run_folder(output)
    assert not (folder / "samples").exists()
    records = records_of(output)
    assert "predicted_ttft" in records[2].figures  # the prediction needs no sampling
    assert records[0].fingerprint["device_telemetry"]["missing"].startswith("progress sampling off")


def test_the_progress_file_moves_while_a_point_runs(session) -> None:  # noqa: ANN001
    run, output = session
    seen: list[dict] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for path in output.glob("*/progress.json"):
                try:
                    seen.append(json.loads(path.read_text()))
                except (OSError, ValueError) as exc:  # never half a file
                    seen.append({"error": repr(exc)})
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run("--longctx-progress=off")
    finally:
        stop.set()
        watcher.join()
    result.assert_outcomes(passed=3)
    assert not [state for state in seen if "error" in state]
    inside = [s for s in seen if s["phase"] == "prefill" and s["length"] == 4096]
    elapsed = [s["elapsed_s"] for s in inside]
    assert len(set(elapsed)) >= 2, elapsed  # rewritten during the point, not only after it
    prefilled = [s["prefilled"] for s in inside if s["prefilled"]]
    assert prefilled and prefilled == sorted(prefilled)
    assert {"sweep_eta_s", "remaining_points", "first_token_eta_s"} <= set(inside[-1])
    # The session's last word, read once it is over (the watcher may not get a turn after it).
    assert json.loads((output / "latest" / "progress.json").read_text())["phase"] == "finished"


def test_a_stopped_sweep_says_what_is_left_and_what_it_would_take(session) -> None:  # noqa: ANN001
    run, output = session
    result = run("--longctx-to=8Ki", "-x", fail_at=4096)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-longctx progress: sweep: 1 selected point not measured, "
            "~* to measure it (session took *)"
        ]
    )
    assert "~? to measure" not in result.stdout.str()  # two lengths in: it is predicted
    final = json.loads((run_folder(output) / "progress.json").read_text())
    assert final["phase"] == "finished"
    assert final["remaining"] == [
        {"length": 8192, "repeat": 0, "predicted_s": final["sweep_eta_s"]}
    ]
    assert final["sweep_eta_s"] > 0


def test_a_real_terminal_gets_the_live_line_by_default(
    pytester: pytest.Pytester, fake_vllm: FakeVLLM
) -> None:
    """Driven in a pseudo-terminal with the default options, as a user at a shell: while the
    first token is awaited the live line is written and rewritten in place (carriage returns),
    not the plain lines a CI log gets."""
    import os
    import pty
    import select
    import subprocess
    import sys

    pytester.makepyfile(test_sweep=SWEEP_TEST)
    fake_vllm.configure(first_token_delay_s=2.0, token_delay_s=0.005)
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160"}
    env.pop("CI", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--longctx-url={fake_vllm.url}",
            "--longctx-to=1Ki",
            "--longctx-decode-tokens=8",
            "--longctx-progress-interval=100ms",
            NO_PLOTS,  # the progress display's default is the subject, not the plots'
        ],
        cwd=pytester.path,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    output = bytearray()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the session ended
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(leader)
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, text
    live = [part for part in text.split("\r") if part.lstrip().startswith("longctx 1Ki rep 0")]
    assert len(live) >= 2, text  # rewritten in place, more than once during the prefill
    assert "prefilled" in live[0] or "first token" in live[0], live[0]
    assert "longctx next:" not in text  # the plain mode's announcement: not on a terminal
