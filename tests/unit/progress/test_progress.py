"""Progress inside a point, without vLLM: the ETA model's fit, device telemetry from fake tools,
energy, the progress file, the sample files and the sampler against the fake server."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from fake_vllm import Behaviour, FakeVLLM

from pytest_longctx.client import ClientConfig, CompletionClient, CompletionRequest
from pytest_longctx.core.records import Record
from pytest_longctx.progress import energy, eta, samples, state, telemetry
from pytest_longctx.progress.sampler import Outlook, PointWatch

# -- the ETA model ------------------------------------------------------------------------------


def _quadratic(a: float, b: float, c: float, lengths: list[int]) -> list[float]:
    return [a + b * n + c * n * n for n in lengths]


def test_the_fit_recovers_a_quadratic_from_its_points() -> None:
    lengths = [1024, 2048, 4096, 8192, 16384]
    a, b, c = eta.fit_nonnegative(lengths, _quadratic(0.05, 1e-4, 2e-9, lengths))
    assert (a, b, c) == pytest.approx((0.05, 1e-4, 2e-9), rel=1e-6)


def test_the_fit_keeps_every_coefficient_non_negative() -> None:
    # Plain least squares would fit a negative constant to this concave-up data.
    lengths = [1024, 2048, 4096, 8192]
    values = [0.01, 0.05, 0.2, 0.8]
    unconstrained = __import__("numpy").polyfit(lengths, values, 2)
    assert unconstrained[-1] < 0  # the constant a plain fit would take
    coefficients = eta.fit_nonnegative(lengths, values)
    assert coefficients is not None
    assert all(value >= 0 for value in coefficients)
    # and it still follows the data (relative residuals are what it minimises)
    fitted = [sum(k * n**i for i, k in enumerate(coefficients)) for n in lengths]
    assert all(abs(f - v) / v < 0.5 for f, v in zip(fitted, values, strict=True))


def test_no_model_before_two_lengths() -> None:
    assert eta.fit_nonnegative([4096], [0.5]) is None
    assert eta.fit_nonnegative([4096, 4096], [0.5, 0.6]) is None  # repeats are one length
    assert eta.fit_nonnegative([1024, 2048], [0.5, -1.0]) is None


def _record(length: int, ttft: float, decode: float = 100.0, outcome: str = "passed") -> Record:
    return Record(
        run_id="r",
        nodeid=f"t[{length}]",
        length=length,
        repeat=0,
        outcome=outcome,
        figures={"ttft": ttft, "decode_throughput": decode},
    )


def test_the_sweep_eta_weighs_each_point_by_its_cost() -> None:
    lengths = [1024, 2048, 4096]
    records = [
        _record(n, t, decode=1 / (0.01 + 1e-6 * n))
        for n, t in zip(lengths, _quadratic(0.0, 1e-4, 1e-8, lengths), strict=True)
    ]
    records.append(_record(8192, 99.0, outcome="failed"))  # not passed: not fitted
    model = eta.CostModel.fit(records, decode_tokens=33)
    assert model.ttft is not None and model.ttft.lengths == (1024, 2048, 4096)
    # 32 decoded tokens at 0.01 + 1e-6 L s each, after a TTFT of 1e-4 L + 1e-8 L^2
    for n in (8192, 65536):
        expected = 1e-4 * n + 1e-8 * n * n + 32 * (0.01 + 1e-6 * n)
        assert model.point_cost(n) == pytest.approx(expected, rel=1e-6)
    remaining = [8192, 16384, 65536]
    assert model.sweep_cost(remaining) == pytest.approx(sum(map(model.point_cost, remaining)))
    # long points dominate: 64Ki costs more than 64 times 1Ki, never one equal step
    assert model.point_cost(65536) > 64 * model.point_cost(1024)


def test_nothing_predicted_without_a_model() -> None:
    model = eta.CostModel.fit([_record(1024, 0.1)], decode_tokens=8)
    assert model.ttft is None
    assert model.point_cost(2048) is None
    assert model.sweep_cost([2048]) is None
    assert model.sweep_cost([]) == 0.0


def test_first_token_eta_scales_the_model_by_the_points_own_speed() -> None:
    model = eta.TtftModel(0.0, 0.0, 1e-8, (1024, 2048))  # TTFT = 1e-8 L^2
    length = 100_000  # model: 100 s
    # 50,000 tokens done: the model says 25 s; it took 50 s, so twice as slow: 150 s left
    assert eta.first_token_eta(model, length, 50.0, 50_000, None) == pytest.approx(150.0)
    # no progress known: the model's TTFT less the time spent
    assert eta.first_token_eta(model, length, 30.0, None, None) == pytest.approx(70.0)
    # no model: the remaining tokens at the current rate
    assert eta.first_token_eta(None, length, 10.0, 40_000, 2000.0) == pytest.approx(30.0)
    assert eta.first_token_eta(None, length, 10.0, None, None) is None
    assert eta.first_token_eta(model, length, 10.0, length, None) == 0.0


def test_durations_read_like_durations() -> None:
    assert eta.format_duration(None) == "?"
    assert eta.format_duration(3.21) == "3.2 s"
    assert eta.format_duration(200) == "3 min 20 s"
    assert eta.format_duration(11 * 3600 + 5 * 60) == "11 h 05 min"
    assert eta.format_duration(3 * 86400) == "3 d 00 h"


# -- device telemetry from fake tools ---------------------------------------------------------


def fake_tool(folder: Path, name: str, output: str, status: int = 0) -> None:
    """An executable on PATH printing what the real tool prints (its documented format)."""
    data = folder / f"{name}.out"
    data.write_text(output if output.endswith("\n") else output + "\n")
    path = folder / name
    loop = f"while IFS= read -r line; do printf '%s\\n' \"$line\"; done < '{data}'"
    path.write_text(f"#!/bin/sh\n{loop}\nexit {status}\n")  # builtins only: PATH is bare
    path.chmod(0o755)


#: nvidia-smi --query-gpu=index,pci.bus_id,uuid,memory.used,memory.total,utilization.gpu,
#: power.draw --format=csv,noheader,nounits on two H200s, the second without a power reading.
NVIDIA_OUTPUT = (
    "0, 00000000:1B:00.0, GPU-5e2f0c3a-0000-1111-2222-333344445555, 81234, 143771, 97, 612.45\n"
    "1, 00000000:3B:00.0, GPU-8a11d2b7-0000-1111-2222-333344445555, 1024, 143771, 0, [N/A]\n"
)

#: amd-smi metric --usage --power --mem-usage --json (ROCm 6.x: a list of GPUs).
AMD_OUTPUT = json.dumps(
    [
        {
            "gpu": 0,
            "usage": {
                "gfx_activity": {"value": 88, "unit": "%"},
                "umc_activity": {"value": 40, "unit": "%"},
                "mm_activity": "N/A",
            },
            "power": {
                "socket_power": {"value": 701, "unit": "W"},
                "gfx_voltage": "N/A",
                "power_management": "ENABLED",
            },
            "mem_usage": {
                "total_vram": {"value": 294896, "unit": "MB"},
                "used_vram": {"value": 250000, "unit": "MB"},
                "free_vram": {"value": 44896, "unit": "MB"},
            },
        },
        {"gpu": 1, "usage": "N/A", "power": {"socket_power": "N/A"}, "mem_usage": "N/A"},
    ]
)

#: rocm-smi --showuse --showpower --showmeminfo vram --json
ROCM_OUTPUT = json.dumps(
    {
        "card0": {
            "GPU use (%)": "12",
            "Current Socket Graphics Package Power (W)": "133.0",
            "VRAM Total Memory (B)": "206141652992",
            "VRAM Total Used Memory (B)": "296583168",
            "PCI Bus": "0000:05:00.0",
        },
        "system": {"Driver version": "6.8.5"},
    }
)


def test_nvidia_smi_output_is_read_per_device() -> None:
    first, second = telemetry.parse_nvidia_smi(NVIDIA_OUTPUT)
    assert first == telemetry.DeviceReading(
        0,
        81234 * 2**20,
        143771 * 2**20,
        97.0,
        612.45,
        "0000:1b:00.0",
        "GPU-5e2f0c3a-0000-1111-2222-333344445555",
    )
    assert second.power_w is None and second.utilization_pct == 0.0
    with pytest.raises(telemetry.TelemetryError):
        telemetry.parse_nvidia_smi("No devices were found")


def test_amd_smi_output_is_read_in_both_layouts() -> None:
    first, second = telemetry.parse_amd_smi(AMD_OUTPUT)
    assert first == telemetry.DeviceReading(0, 250000 * 2**20, 294896 * 2**20, 88.0, 701.0)
    assert second == telemetry.DeviceReading(1)
    wrapped = json.dumps({"gpu_data": json.loads(AMD_OUTPUT)})
    assert telemetry.parse_amd_smi(wrapped) == [first, second]


def test_rocm_smi_output_is_read_per_card() -> None:
    (card,) = telemetry.parse_rocm_smi(ROCM_OUTPUT)
    assert card == telemetry.DeviceReading(0, 296583168, 206141652992, 12.0, 133.0, "0000:05:00.0")


def test_the_first_tool_on_path_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_tool(tmp_path, "rocm-smi", ROCM_OUTPUT)
    fake_tool(tmp_path, "amd-smi", AMD_OUTPUT)
    found = telemetry.DeviceTelemetry.detect()
    assert found.tool == "amd-smi"
    assert [r.power_w for r in found.read()] == [701.0, None]
    fake_tool(tmp_path, "nvidia-smi", NVIDIA_OUTPUT)
    assert telemetry.DeviceTelemetry.detect().tool == "nvidia-smi"


def test_missing_tools_are_recorded_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    none = telemetry.DeviceTelemetry.detect()
    assert none.tool is None and none.read() is None
    assert none.describe() == {"tool": None, "missing": telemetry.MISSING}
    # a tool that is there but fails (no driver loaded) is missing too, with its reason
    fake_tool(tmp_path, "nvidia-smi", "NVIDIA-SMI has failed: no driver", status=9)
    broken = telemetry.DeviceTelemetry.detect()
    assert broken.tool is None
    assert "nvidia-smi exited with 9: NVIDIA-SMI has failed: no driver" in broken.missing


# -- energy ------------------------------------------------------------------------------------


def test_integration_holds_the_ends_and_joins_the_readings() -> None:
    # constant 300 W: 300 J per second, whatever the readings' cadence
    assert energy.integrate([0.0, 1.0, 5.0], [300.0] * 3, 0.0, 10.0) == pytest.approx(3000.0)
    # a ramp 0 -> 100 W over 10 s: 500 J; its first 5 s: 125 J
    assert energy.integrate([0.0, 10.0], [0.0, 100.0], 0.0, 10.0) == pytest.approx(500.0)
    assert energy.integrate([0.0, 10.0], [0.0, 100.0], 0.0, 5.0) == pytest.approx(125.0)
    # readings that start late: the first one holds before it
    assert energy.integrate([2.0, 4.0], [100.0, 100.0], 0.0, 4.0) == pytest.approx(400.0)
    assert energy.integrate([1.0], [50.0], 3.0, 3.0) == 0.0
    with pytest.raises(ValueError):
        energy.integrate([], [], 0.0, 1.0)


def test_a_points_energy_splits_at_the_first_token_and_sums_devices() -> None:
    def devices(*watts: float | None) -> list[dict]:
        return [{"index": i, "power_w": w} for i, w in enumerate(watts)]

    readings = [
        (-0.5, devices(100.0, 50.0)),
        (2.0, devices(300.0, None)),
        (3.0, devices(300.0, 50.0)),
        (5.0, devices(300.0, 50.0)),
        (6.0, devices(300.0, 50.0)),
    ]
    figures, unmeasured = energy.energy_figures(readings, 4.0, 6.0, 4096, 33, 1.0)
    assert unmeasured == {}
    # device 0: 100 -> 300 W between -0.5 and 2 s, then 300 W; device 1: 50 W throughout
    device0_prefill = energy.integrate([-0.5, 2.0, 3.0], [100.0, 300.0, 300.0], 0.0, 4.0)
    assert figures["prefill_energy"] == pytest.approx(device0_prefill + 4 * 50.0)
    assert figures["decode_energy"] == pytest.approx(2 * 300.0 + 2 * 50.0)
    assert figures["energy"] == pytest.approx(figures["prefill_energy"] + figures["decode_energy"])
    assert figures["energy_per_prompt_token"] == pytest.approx(figures["prefill_energy"] / 4096)
    assert figures["energy_per_generated_token"] == pytest.approx(figures["decode_energy"] / 32)
    assert energy.energy_figures(readings, None, None, 4096, 0) == ({}, {})  # no token
    assert energy.energy_figures([(0.0, devices(None))], 1.0, 2.0, 10, 10) == ({}, {})
    # a phase read once, or no longer than the averaging window, is not measured
    figures, unmeasured = energy.energy_figures(readings, 3.5, 4.5, 4096, 33, 1.0)
    assert set(figures) == {"prefill_energy", "energy_per_prompt_token"}
    assert unmeasured["decode_energy"] == (
        "not measured: the decode took 1 s, not more than the power tool's 1 s averaging window"
    )
    figures, unmeasured = energy.energy_figures(readings[:3], 1.5, 6.0, 4096, 33, 1.0)
    assert unmeasured["prefill_energy"] == (
        "not measured: 0 power reading(s) during the prefill (1.5 s); 2 are needed"
    )


# -- the progress file and the sample files ---------------------------------------------------


def test_the_progress_file_round_trips_and_is_replaced_whole(tmp_path: Path) -> None:
    first = state.ProgressState(
        run_id="r1",
        phase=state.PREFILL,
        length=65536,
        repeat=1,
        index=3,
        of=7,
        elapsed_s=12.5,
        prefilled=40960,
        prefill_rate=3276.8,
        sweep_eta_s=600.0,
        remaining=(state.RemainingPoint(131072, 1, 400.0), state.RemainingPoint(1024, 2, None)),
        devices=({"index": 0, "power_w": 500.0},),
    )
    path = state.write_progress_file(tmp_path, first)
    data = json.loads(path.read_text())
    assert data["remaining_points"] == 2
    assert data["prefilled"] == 40960 and data["phase"] == "prefill"
    assert state.read_progress_file(tmp_path) == first
    second = state.ProgressState(run_id="r1", phase=state.FINISHED)
    state.write_progress_file(tmp_path, second)
    assert state.read_progress_file(path) == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # no temporary left
    line = first.line(width=200)
    assert "64Ki rep 1 [3/7]" in line and "~40,960/65,536 prefilled (62%)" in line
    assert "3,277 tok/s" in line and "sweep ~10 min 00 s left (2 more points)" in line
    assert len(first.line(width=30)) == 30


def test_the_prefill_curve_comes_from_the_gauge_readings(tmp_path: Path) -> None:
    path = samples.samples_path(tmp_path, "len=8Ki-rep=0")
    writer = samples.SampleWriter(path, {"length": 8192, "repeat": 0, "interval_s": 0.1})
    rows = [
        (-0.1, "before", 0),
        (1.0, "prefill", 2048),
        (2.0, "prefill", 4096),
        (2.5, "prefill", 4096),
        (4.0, "prefill", 6144),
        (5.0, "decode", 8320),
    ]
    for t, phase, kv in rows:
        writer.append({"t": t, "phase": phase, "kv_tokens": kv, "prefilled": min(kv, 8192)})
    writer.append({"t": 5.5, "phase": "after", "first_token_t": 4.5, "last_token_t": 5.4})
    writer.close()
    with open(path, "a") as handle:
        handle.write('{"t": 6.0, "pha')  # a crash mid-write: skipped
    read = samples.read_samples(path)
    assert (read.length, read.repeat, read.first_token_s) == (8192, 0, 4.5)
    # steps: 0 at 0 s, 2048 at 1 s, 4096 at 2 s, 6144 at 4 s, the whole prompt at 4.5 s
    curve = [value for point in read.prefill_curve() for value in point]
    assert curve == pytest.approx([1024, 2048, 3072, 2048, 5120, 1024, 7168, 4096])
    # Sampled every 0.3 s, steps less than 0.6 s apart are merged: the last one (at the
    # first token, 0.5 s after 6144 was seen) ends the segment before it instead of making a
    # spike of its own.
    coarse = samples.PointSamples(path, {**read.header, "interval_s": 0.3}, read.samples)
    curve = [value for point in coarse.prefill_curve() for value in point]
    assert curve == pytest.approx([1024, 2048, 3072, 2048, 6144, 4096 / 2.5])
    assert samples.read_run_samples(tmp_path) == [read]
    assert samples.read_samples(tmp_path / "nothing.jsonl") is None


# -- the sampler against the fake server ------------------------------------------------------


def _watch(fake: FakeVLLM, length: int, **kwargs) -> tuple[PointWatch, list]:  # noqa: ANN003
    published: list[state.ProgressState] = []
    model = eta.CostModel(eta.TtftModel(0.0, 1e-4, 0.0, (1024, 2048)), (0.01, 0.0), 16)
    reader = CompletionClient(ClientConfig(fake.url))
    watch = PointWatch(
        length=length,
        repeat=0,
        decode_tokens=16,
        interval_s=0.05,
        outlook=Outlook("run", 2, 3, model, (state.RemainingPoint(2 * length, 0, 5.0),)),
        read_metrics=reader.metrics_text,
        publish=published.append,
        **kwargs,
    )
    return watch, published


def _measure(fake: FakeVLLM, watch: PointWatch, length: int):  # noqa: ANN202
    with CompletionClient(ClientConfig(fake.url)) as client:
        watch.start()
        try:
            return client.measure(
                CompletionRequest(model="fake-model", prompt=[7] * length, decode_tokens=16),
                first_token_budget_s=30,
                progress=watch.stream,
            )
        finally:
            watch.stop()


def test_samples_rise_chunk_by_chunk_to_the_whole_prompt(tmp_path: Path) -> None:
    length = 16384
    # computed in 512-token steps (32 in the second): with 2,048 (eight), a busy host's sampler
    # once read only two of them; 16 tokens decoded in 1.6 s (in 0.3 s a busy host's sampler
    # once read none of them)
    behaviour = Behaviour(first_token_delay_s=1.0, token_delay_s=0.1, prefill_chunk_tokens=512)
    with FakeVLLM(behaviour) as fake:
        path = samples.samples_path(tmp_path, "len=16Ki-rep=0")
        watch, published = _watch(fake, length, samples_path=path)
        measured = _measure(fake, watch, length)
    assert watch.problems == []
    prefill = [s for s in watch.samples if s["phase"] == "prefill" and s["kv_tokens"] is not None]
    values = [s["prefilled"] for s in prefill]
    assert values == sorted(values), values  # monotonic
    assert all(v % 128 == 0 for v in values)  # whole blocks
    assert len({v for v in values if 0 < v < length}) >= 3, values  # seen rising, chunk by chunk
    decode = [s for s in watch.samples if s["phase"] == "decode" and s["kv_tokens"] is not None]
    # the first reading after the first token holds the whole prompt, to a block
    assert decode and length <= decode[0]["kv_tokens"] <= length + 16 + 128
    assert watch.samples[-1]["phase"] == "after"
    # the stream counter the client kept
    assert watch.stream.tokens == measured.completion_tokens == 16
    assert watch.stream.first_token_at - watch.stream.t0 == pytest.approx(measured.ttft_s)
    # what was published: the prefill, then the decode, with the sweep's ETA behind
    phases = [p.phase for p in published]
    assert phases[0] == "prefill" and "decode" in phases
    assert all(p.index == 2 and p.of == 3 for p in published)
    assert published[0].predicted_ttft_s == pytest.approx(1.6384)
    done = [p for p in published if p.phase == "prefill" and p.prefilled]
    assert done and all(p.sweep_eta_s >= 5.0 for p in done if p.sweep_eta_s is not None)
    # the file: the header, then every sample with t from t0, the baseline before it
    read = samples.read_samples(path)
    assert read.header["capacity_tokens"] == 16383 * 128
    assert read.samples[0]["phase"] == "before" and read.samples[0]["t"] < 0
    assert [s["phase"] for s in read.samples][-1] == "after"
    assert read.first_token_s == pytest.approx(measured.ttft_s)
    assert len(read.prefill_curve()) >= 2
    figures = watch.figures(measured.prompt_tokens, measured.completion_tokens)
    assert figures == {"predicted_ttft": pytest.approx(1.6384)}  # no device tool: no energy


@pytest.mark.parametrize(
    ("first_token_delay_s", "token_delay_s", "slowest"),
    [(2.0, 0.01, 0.5), (0.1, 0.4, 0.4)],
    ids=["prefill-steps", "decode-steps"],
)
def test_the_slowest_step_the_point_showed(
    first_token_delay_s: float, token_delay_s: float, slowest: float
) -> None:
    """A 4Ki prompt prefilled in four chunks of 1024 over ``first_token_delay_s`` (the gauge
    moves once a chunk), then four tokens ``token_delay_s`` apart: the slowest step is the
    longer of a chunk's time and a token's, to a sampling interval (50 ms; more on a busy
    host, whose readings come late, never less)."""
    behaviour = Behaviour(
        first_token_delay_s=first_token_delay_s,
        token_delay_s=token_delay_s,
        prefill_chunk_tokens=1024,
    )
    with FakeVLLM(behaviour) as fake:
        watch, _ = _watch(fake, 4096)
        assert watch.slowest_step_s() is None  # nothing seen yet
        with CompletionClient(ClientConfig(fake.url)) as client:
            watch.start()
            try:
                client.measure(
                    CompletionRequest(model="fake-model", prompt=[7] * 4096, decode_tokens=4),
                    first_token_budget_s=30,
                    progress=watch.stream,
                )
            finally:
                watch.stop()
    assert slowest - 0.06 <= watch.slowest_step_s() <= slowest + 0.25


def test_energy_from_a_fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(
        tmp_path,
        "nvidia-smi",
        "0, 00000000:1B:00.0, GPU-a, 1000, 143771, 90, 400.0\n"
        "1, 00000000:3B:00.0, GPU-b, 1000, 143771, 90, 100.0\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    tool = telemetry.DeviceTelemetry.detect()
    assert tool.tool == "nvidia-smi"
    # a 1.8 s decode: a loaded host that holds the first tokens back and delivers them in a
    # burst still leaves it over the window (at 1.2 s, one once arrived within 0.94 s)
    with FakeVLLM(Behaviour(first_token_delay_s=1.3, token_delay_s=0.12)) as fake:
        watch, _ = _watch(fake, 4096, telemetry=tool)
        measured = _measure(fake, watch, 4096)
    figures = watch.figures(measured.prompt_tokens, measured.completion_tokens)
    # both phases last over the tools' 1 s averaging window, read many times: measured
    assert "not_measured" not in watch.energy(measured.prompt_tokens, measured.completion_tokens)
    # a constant 500 W over both devices: energy is 500 W times the time
    assert figures["prefill_energy"] == pytest.approx(500 * measured.ttft_s)
    decode_s = measured.token_times_s[-1] - measured.ttft_s
    assert figures["decode_energy"] == pytest.approx(500 * decode_s)
    assert figures["energy_per_prompt_token"] == pytest.approx(500 * measured.ttft_s / 4096)
    assert figures["energy_per_generated_token"] == pytest.approx(500 * decode_s / 15)
    assert all(s["devices"] for s in watch.samples)  # every reading carries the devices
    assert math.isclose(figures["energy"], figures["prefill_energy"] + figures["decode_energy"])


def test_a_sub_second_prefill_has_no_energy_measured_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi's power is a one-second average: a 0.3 s prefill's reading is mostly the
    second before it. Its prefill energy (and the total) is left out, said as not measured;
    the 1.8 s decode, read many times, keeps its figures (over the window even when a loaded
    host delivers its first tokens late, in a burst)."""
    fake_tool(tmp_path, "nvidia-smi", "0, 00000000:1B:00.0, GPU-a, 1000, 143771, 90, 400.0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    tool = telemetry.DeviceTelemetry.detect()
    with FakeVLLM(Behaviour(first_token_delay_s=0.3, token_delay_s=0.12)) as fake:
        watch, _ = _watch(fake, 4096, telemetry=tool)
        measured = _measure(fake, watch, 4096)
    figures = watch.figures(measured.prompt_tokens, measured.completion_tokens)
    assert "prefill_energy" not in figures and "energy_per_prompt_token" not in figures
    assert "energy" not in figures
    decode_s = measured.token_times_s[-1] - measured.ttft_s
    assert figures["decode_energy"] == pytest.approx(400 * decode_s)
    said = watch.energy(measured.prompt_tokens, measured.completion_tokens)
    why = said["not_measured"]["prefill_energy"]
    assert why.startswith(f"not measured: the prefill took {measured.ttft_s:.3g} s")
    assert "not more than the power tool's 1 s averaging window" in why
    assert said["not_measured"]["energy"] == "not measured: the prefill energy is not"
    assert set(said["not_measured"]) == {"prefill_energy", "energy"}


#: Four GPUs as nvidia-smi lists them (PCI order), each drawing its own power.
NVIDIA_FOUR = "".join(
    f"{i}, 00000000:{bus}:00.0, GPU-{i}aaa, {1000 * (i + 1)}, 143771, 50, {100.0 * (i + 1)}\n"
    for i, bus in enumerate(("1B", "3B", "5B", "7B"))
)


@pytest.mark.parametrize(
    ("ids", "indices"),
    [(("2", "3"), [2, 3]), (("GPU-1aaa",), [1]), ((), [0, 1, 2, 3])],
    ids=["indices", "uuid", "no-ids"],
)
def test_only_the_servers_own_gpus_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ids: tuple[str, ...], indices: list[int]
) -> None:
    """A server given CUDA_VISIBLE_DEVICES=2,3 (its -n slot) has the power and memory of
    those two read, not of the other servers' GPUs beside it."""
    fake_tool(tmp_path, "nvidia-smi", NVIDIA_FOUR)
    monkeypatch.setenv("PATH", str(tmp_path))
    scope = telemetry.DeviceScope(ids, "CUDA_VISIBLE_DEVICES")
    tool = telemetry.DeviceTelemetry.detect(scope)
    assert [r.index for r in tool.read()] == indices
    assert telemetry.memory_used(scope) == {i: 1000 * (i + 1) * 2**20 for i in indices}
    if ids == ("2", "3"):
        assert tool.describe()["devices"] == (
            "CUDA_VISIBLE_DEVICES=2,3: bus 0000:5b:00.0, 0000:7b:00.0"
        )


def _by_subcommand(folder: Path, name: str, outputs: dict[str, str]) -> None:
    """A tool whose output depends on its first argument (``amd-smi list`` / ``metric``)."""
    for sub, output in outputs.items():
        fake_tool(folder, f"{name}-{sub}", output)
    cases = "".join(f'  {sub}) exec "{folder}/{name}-{sub}" ;;\n' for sub in outputs)
    path = folder / name
    path.write_text(f'#!/bin/sh\ncase "$1" in\n{cases}esac\nexit 2\n')
    path.chmod(0o755)


#: amd-smi numbers these two MI355X 0 and 1; HIP, which enumerates differently on this
#: host, numbers the one at 0000:05:00.0 as 0.
AMD_TWO = json.dumps(
    [
        {"gpu": 0, "power": {"socket_power": {"value": 900, "unit": "W"}}, "mem_usage": "N/A"},
        {"gpu": 1, "power": {"socket_power": {"value": 300, "unit": "W"}}, "mem_usage": "N/A"},
    ]
)


@pytest.mark.parametrize("hip_id", [True, False], ids=["hip-id-listed", "pci-order"])
def test_amd_gpus_are_matched_to_hips_numbers_by_pci_bus_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hip_id: bool
) -> None:
    """HIP_VISIBLE_DEVICES=0 is HIP's device 0: amd-smi's GPU 1 here (its list says so, by
    hip_id, or by PCI bus order where it does not), not amd-smi's GPU 0."""
    listed = [
        {"gpu": 0, "bdf": "0000:c5:00.0", "uuid": "u-c5", **({"hip_id": 1} if hip_id else {})},
        {"gpu": 1, "bdf": "0000:05:00.0", "uuid": "u-05", **({"hip_id": 0} if hip_id else {})},
    ]
    _by_subcommand(tmp_path, "amd-smi", {"metric": AMD_TWO, "list": json.dumps(listed)})
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = telemetry.DeviceTelemetry.detect(telemetry.DeviceScope(("0",), "HIP_VISIBLE_DEVICES"))
    assert tool.tool == "amd-smi"
    (reading,) = tool.read()
    assert (reading.index, reading.bus_id, reading.power_w) == (1, "0000:05:00.0", 300.0)


def test_rocm_smi_cards_are_matched_to_hips_numbers_by_pci_bus_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cards = {
        f"card{n}": {"Current Socket Graphics Package Power (W)": watts, "PCI Bus": bus}
        for n, watts, bus in ((0, "700.0", "0000:C5:00.0"), (1, "200.0", "0000:05:00.0"))
    }
    fake_tool(tmp_path, "rocm-smi", json.dumps(cards))
    monkeypatch.setenv("PATH", str(tmp_path))
    scope = telemetry.DeviceScope(("0",), "HIP_VISIBLE_DEVICES")
    (reading,) = telemetry.DeviceTelemetry.detect(scope).read()
    assert (reading.index, reading.power_w) == (1, 200.0)


def test_a_device_the_tool_does_not_list_leaves_telemetry_missing_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(tmp_path, "nvidia-smi", NVIDIA_FOUR)
    monkeypatch.setenv("PATH", str(tmp_path))
    scope = telemetry.DeviceScope(("6",), "CUDA_VISIBLE_DEVICES")
    tool = telemetry.DeviceTelemetry.detect(scope)
    assert tool.tool is None and tool.read() is None
    assert "CUDA_VISIBLE_DEVICES=6: device 6 is not among the 4" in tool.missing
    assert telemetry.memory_used(scope) is None


def test_a_server_over_several_nodes_says_what_its_telemetry_covers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 4-node Ray profile: this head node's 8 GPUs are read, the other 24 are not."""
    eight = "".join(
        f"{i}, 00000000:{16 * i + 11:02X}:00.0, GPU-{i}, 1000, 143771, 50, 700.0\n"
        for i in range(8)
    )
    fake_tool(tmp_path, "nvidia-smi", eight)
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = telemetry.DeviceTelemetry.detect(telemetry.DeviceScope((), "HIP_VISIBLE_DEVICES", 4, 8))
    assert tool.describe()["coverage"] == "8 of 32 GPUs (head node only; the other 3 nodes unread)"
    single = telemetry.DeviceTelemetry.detect(telemetry.DeviceScope())
    assert "coverage" not in single.describe()


def test_a_server_without_the_gauge_still_shows_time_and_tokens() -> None:
    with FakeVLLM(Behaviour(first_token_delay_s=0.3, metrics_status=404)) as fake:
        watch, published = _watch(fake, 2048)
        _measure(fake, watch, 2048)
    assert any("/metrics" in problem for problem in watch.problems)
    prefill = [p for p in published if p.phase == "prefill"]
    assert prefill and all(p.prefilled is None for p in prefill)
    assert "prefilling" in prefill[0].line()


# -- the reports ------------------------------------------------------------------------------


def test_reports_show_predictions_energy_and_the_prefill_curve(tmp_path: Path) -> None:
    from pytest_longctx.cli import rebuild_reports

    watched = Record(
        run_id="r",
        nodeid="t[16Ki]",
        length=16384,
        repeat=0,
        outcome="passed",
        figures={
            "ttft": 4.0,
            "decode_throughput": 100.0,
            "predicted_ttft": 5.0,
            "energy": 2500.0,
            "energy_per_prompt_token": 0.122,
            "energy_per_generated_token": 1.5,
        },
        fingerprint={"device_telemetry": {"tool": "nvidia-smi"}},
    )
    old = Record(
        run_id="r",
        nodeid="t[8Ki]",
        length=8192,
        repeat=0,
        outcome="passed",
        figures={"ttft": 1.0, "decode_throughput": 120.0},
    )
    writer = samples.SampleWriter(
        samples.samples_path(tmp_path, "len=16Ki-rep=0"),
        {"run_id": "r", "length": 16384, "repeat": 0, "interval_s": 0.25},
    )
    for t, kv in ((1.0, 2048), (2.0, 6144), (3.0, 10240), (3.5, 12288)):
        writer.append({"t": t, "phase": "prefill", "kv_tokens": kv})
    writer.append({"t": 4.2, "phase": "after", "first_token_t": 4.0})
    writer.close()
    written = rebuild_reports([old, watched], tmp_path)
    plot = tmp_path / "prefill_rate.png"
    assert plot in written and plot.read_bytes().startswith(b"\x89PNG")
    report = (tmp_path / "report.md").read_text()
    assert "![prefill_rate](prefill_rate.png)" in report
    assert "## Prediction and energy" in report
    assert "| 16Ki | 0 | 4.000 | 5.000 | +25.0% | 2,500.0 | 0.122 | 1.5 |" in report
    assert "| 8Ki |" not in report.split("## Prediction and energy")[1].split("##")[0]
    page = (tmp_path / "report.html").read_text()
    assert "Prediction and energy" in page and "+25.0%" in page


def test_old_records_get_no_progress_section_and_a_cpu_host_says_why(tmp_path: Path) -> None:
    from pytest_longctx.reporting.markdown import render_markdown

    old = _record(1024, 0.1)
    assert "Prediction and energy" not in render_markdown([old])
    cpu = Record(
        run_id="r",
        nodeid="t",
        length=1024,
        repeat=0,
        outcome="passed",
        figures={"ttft": 0.1},
        fingerprint={"device_telemetry": {"tool": None, "missing": telemetry.MISSING}},
    )
    text = render_markdown([cpu])
    assert f"Energy not measured: {telemetry.MISSING}." in text


def test_reports_say_what_the_energy_covers_and_which_points_have_none(tmp_path: Path) -> None:
    """A record's ``energy`` reaches the report and the session's summary line: the share of
    a multi-node server's GPUs read, and the points whose prefill was too short to measure."""
    from pytest_longctx.reporting.markdown import render_markdown
    from pytest_longctx.session.live_progress import energy_line

    covers = "8 of 32 GPUs (head node only; the other 3 nodes unread)"
    why = "not measured: the prefill took 0.3 s, not more than the power tool's 1 s window"
    short = Record(
        run_id="r",
        nodeid="t[1Ki]",
        length=1024,
        repeat=0,
        outcome="passed",
        figures={"ttft": 0.3, "decode_energy": 900.0},
        energy={"coverage": covers, "not_measured": {"prefill_energy": why, "energy": "x"}},
    )
    long = Record(
        run_id="r",
        nodeid="t[64Ki]",
        length=65536,
        repeat=0,
        outcome="passed",
        figures={"ttft": 30.0, "energy": 25000.0, "prefill_energy": 24000.0},
        energy={"coverage": covers},
    )
    assert Record.from_json(short.to_json()) == short
    text = render_markdown([short, long])
    assert f"Energy covers {covers}." in text
    assert f"Energy of 1 point(s) not measured in full: {why} (1Ki rep 0)." in text
    line = energy_line([short, long], {"tool": "amd-smi", "coverage": covers})
    assert line.startswith("energy: 25,000.0 J over 1 points (amd-smi)")
    assert f"[{covers}]; 1 point(s) without energy, e.g. {why}" in line


def test_devices_are_read_only_where_the_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from pytest_longctx.plan.servers import ServerSlot
    from pytest_longctx.plan.settings import Settings
    from pytest_longctx.profiles import load_profile
    from pytest_longctx.session.live_progress import SessionProgress

    fake_tool(tmp_path, "nvidia-smi", NVIDIA_OUTPUT)
    monkeypatch.setenv("PATH", str(tmp_path))
    config = SimpleNamespace(pluginmanager=SimpleNamespace(getplugin=lambda name: None))

    def session(url: str | None) -> SessionProgress:
        settings = Settings(
            None,
            None,
            1,
            "pass",
            "cpu-tiny",
            (url,) if url else (),
            None,
            tmp_path,
            None,
            None,
            "ids",
            0,
            None,
            None,
            False,
            False,
            None,
        )
        plan = SimpleNamespace(profile=profile)
        placement = SimpleNamespace(slot=slot)
        description = SimpleNamespace(settings=settings, plan=plan, placement=placement)
        run = SimpleNamespace(settings=settings, plan=plan, slot=slot, description=description)
        return SessionProgress(config, run)  # type: ignore[arg-type]

    profile, slot = load_profile("cpu-tiny"), ServerSlot(0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert session(None).describe_telemetry()["tool"] == "nvidia-smi"  # launched here
    assert session("http://127.0.0.1:8000").describe_telemetry()["tool"] == "nvidia-smi"
    remote = session("http://gpu-node-7:8000").describe_telemetry()
    assert remote["tool"] is None and "is not on this host" in remote["missing"]
    # an -n slot's launched server: only the GPU its slot gives it
    profile = load_profile("kimi-linear-h200")
    slot = ServerSlot(1, devices=("1",), env={"CUDA_VISIBLE_DEVICES": "1"})
    own = session(None)
    assert [r.index for r in own.telemetry.read()] == [1]
    assert own.describe_telemetry()["devices"] == "CUDA_VISIBLE_DEVICES=1: bus 0000:3b:00.0"
