"""One campaign over several servers under pytest-xdist, on real vLLM: ``-n 2`` sessions on two
of the suite's shared cpu-tiny servers attached by URL, one run over both, gated; two servers
unlike each other refused unless mixing is allowed. The split, the schedule and a server lost
mid-run, on the stand-in: tests/unit/session/test_distributed.py.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from longctx_testing import (
    SHARED_SERVERS_PROFILE,
    assert_bursts_kept_with_the_servers_figure,
    records_of,
    run_folder,
    run_session,
)

from pytest_longctx.plan.points import Point

pytestmark = pytest.mark.vllm


def servers_of(records) -> Counter:  # noqa: ANN001
    return Counter(r.fingerprint["server"]["endpoint"] for r in records)


def test_two_attached_servers_share_one_run(
    sweep_dir: pytest.Pytester, vllm_url: str, loaded_url: str
) -> None:
    user_json = sweep_dir.path / "user-benchmark.json"
    result, output = run_session(
        sweep_dir,
        "-n",
        "2",
        f"--longctx-url={vllm_url},{loaded_url}",
        SHARED_SERVERS_PROFILE,
        "--longctx-to=4Ki",
        "--longctx-repeats=2",
        "--longctx-progress=plain",
        "--longctx-progress-interval=200ms",
        "--longctx-progress-throttle=0",
        f"--benchmark-json={user_json}",
    )
    result.assert_outcomes(passed=6)
    # pytest-benchmark disables itself under xdist; the controller hands it the sweep, with
    # both workers' repeats as each length's rounds, and it writes the file.
    written = json.loads(user_json.read_text())["benchmarks"]
    assert [
        (b["params"]["length"], b["params"]["metric"], b["stats"]["rounds"]) for b in written
    ] == [(n, metric, 2) for n in (1024, 2048, 4096) for metric in ("ttft", "decode")]
    ours = json.loads((run_folder(output) / "benchmark.json").read_text())["benchmarks"]
    assert written == ours
    # Workers write their progress; the controller prints it and merges the files.
    result.stdout.fnmatch_lines(["*longctx gw*: * || sweep ~* left"])
    folder = run_folder(output)
    merged = json.loads((folder / "progress.json").read_text())
    assert set(merged["servers"]) == {"gw0", "gw1"}
    assert merged["remaining_points"] == 0
    assert {s["phase"] for s in merged["servers"].values()} == {"finished"}
    records = records_of(output)
    points = Counter(Point(n, rep) for n in (1024, 2048, 4096) for rep in (0, 1))
    assert Counter(Point(r.length, r.repeat) for r in records) == points
    assert set(servers_of(records)) == {vllm_url, loaded_url}
    assert {r.run_id for r in records} == {run_folder(output).name}
    folders = [p.name for p in output.iterdir() if p.is_dir() and not p.is_symlink()]
    assert folders == [run_folder(output).name]
    report = (run_folder(output) / "report.md").read_text()
    assert f"gw0 {vllm_url}" in report and f"gw1 {loaded_url}" in report
    assert "6 recorded (6 passed)" in report

    # The gate on a distributed run: each length's item waits for that length's points from
    # both workers, then judges them against the first run. Two servers sharing two cores
    # change a 1Ki point's inter-token latency twentyfold from one session to the next, so
    # the tolerances here only keep the mechanism under test, not this host's noise.
    baseline = run_folder(output)
    result, output = run_session(
        sweep_dir,
        "-n",
        "2",
        f"--longctx-url={vllm_url},{loaded_url}",
        SHARED_SERVERS_PROFILE,
        "--longctx-to=2Ki",
        "--longctx-repeats=2",
        f"--longctx-baseline={baseline}",
        "--longctx-tolerance=ttft=100000%,decode=99%,itl=off",
        "-rA",
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*PASSED*test_regression[[]len=1Ki[]]*"])
    gated = records_of(output)
    assert len(gated) == 4 and set(servers_of(gated)) == {vllm_url, loaded_url}

    # each point kept the stream's figure or, where the record shows a burst or a rate
    # beyond the tolerance (a busy host held the stream back), the server's
    assert_bursts_kept_with_the_servers_figure(records, report)


def test_servers_unlike_each_other_are_refused_unless_mixing_is_allowed(
    sweep_dir: pytest.Pytester, vllm_url: str, foreign_model_url: str
) -> None:
    # the foreign model's weights are random: its answers are recorded, not checked
    urls = (
        f"--longctx-url={vllm_url},{foreign_model_url}",
        SHARED_SERVERS_PROFILE,
        "--longctx-fidelity=record",
    )
    result, output = run_session(
        sweep_dir, "-n", "2", *urls, "--longctx-to=1Ki", "--longctx-repeats=2"
    )
    result.assert_outcomes(passed=1, errors=1)
    refused = [r for r in records_of(output) if r.outcome == "error"]
    assert len(refused) == 1
    assert "differs from" in refused[0].reason and "model:" in refused[0].reason
    assert "--longctx-allow-mixed-servers" in refused[0].reason

    result, output = run_session(
        sweep_dir,
        "-n",
        "2",
        *urls,
        "--longctx-to=1Ki",
        "--longctx-repeats=2",
        "--longctx-allow-mixed-servers",
    )
    result.assert_outcomes(passed=2)
    records = records_of(output)
    assert set(servers_of(records)) == {vllm_url, foreign_model_url}
    report = (run_folder(output) / "report.md").read_text()
    assert "**The runs differ in fingerprint**" in report
    assert "Repeats on different servers: 1Ki on" in report
