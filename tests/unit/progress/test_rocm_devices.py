"""A server's own devices on a ROCm node: what its launch sets, and what its telemetry reads.

vLLM's ROCm platform refuses to start when HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are
both set and differ (``_sync_hip_cuda_env_vars`` in ``vllm/platforms/rocm.py``, run here
from the installed vLLM's own source), so every server given devices of its own gets both,
alike, drawn from what the job was given. ROCm's runtime applies ROCR_VISIBLE_DEVICES
(which Slurm and Kubernetes set on AMD nodes) before either and numbers what it leaves from
0; amd-smi gives HIP's numbers only under ``list -e``. The fake tools below number their GPUs
in an order that is neither PCI bus order nor HIP's, as some hosts do.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from longctx_testing import SWEEP_TEST, plan_settings

from pytest_longctx.campaign import server as campaign_server
from pytest_longctx.plan.servers import (
    ServerSlot,
    ServerSplitError,
    devices_note,
    split_servers,
)
from pytest_longctx.profiles import load_profile
from pytest_longctx.progress import telemetry

ROCM_PROFILE = "kimi-linear-mi355x"  # tensor parallel 8 on ROCm
JOB_VARIABLES = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def installed_vllm_file(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed here, whose source could be read")
    return Path(next(iter(spec.submodule_search_locations))) / relative


def vllm_rocm_start(environ: dict[str, str]) -> dict[str, str]:
    """What vLLM's ROCm platform does at import with ``environ``: its own
    ``_sync_hip_cuda_env_vars``, taken from the installed vLLM's source and run on a copy (a
    ValueError where it refuses to start); the environment it leaves."""
    source = installed_vllm_file("platforms/rocm.py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    (check,) = (
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "_sync_hip_cuda_env_vars"
    )
    env = dict(environ)
    quiet = SimpleNamespace(warning_once=lambda *args, **kwargs: None)
    namespace = {"os": SimpleNamespace(environ=env), "logger": quiet}
    exec(compile(ast.Module(body=[check], type_ignores=[]), str(source), "exec"), namespace)
    namespace["_sync_hip_cuda_env_vars"]()
    return env


def without_job_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- item 3: a slotted launch sets every variable vLLM reads, alike ----------------------


def test_vllms_own_check_refuses_hip_and_cuda_apart() -> None:
    """The check the tests below run is vLLM's: it refuses the pair apart, copies HIP alone."""
    with pytest.raises(ValueError, match="Inconsistent GPU visibility"):
        vllm_rocm_start({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert vllm_rocm_start({"HIP_VISIBLE_DEVICES": "2"})["CUDA_VISIBLE_DEVICES"] == "2"


def test_a_slotted_launch_under_an_inherited_cuda_visible_devices_starts(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job given 16 GPUs by CUDA_VISIBLE_DEVICES (as Slurm exports it), each server 8: the
    server's command sets HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES to the same 8 of the
    job's, which vLLM's own check lets start (HIP_VISIBLE_DEVICES alone was refused)."""
    from pytest_longctx.session.activation import PREPARED_KEY
    from pytest_longctx.session.hookspecs import campaign_hooks

    without_job_devices(monkeypatch)
    given = [str(i) for i in range(8, 24)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(given))
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    config = pytester.parseconfigure(
        f"--longctx-profile={ROCM_PROFILE}", "--longctx-devices-per-server=8"
    )
    run = config.stash[PREPARED_KEY].run
    command = campaign_server.planned_command(
        campaign_hooks(config), run.description, run.sizing(), port=8000, build=False
    )
    own = ",".join(given[:8])
    assert {k: command.env[k] for k in JOB_VARIABLES if k in command.env} == {
        "HIP_VISIBLE_DEVICES": own,
        "CUDA_VISIBLE_DEVICES": own,
    }
    started = vllm_rocm_start({**os.environ, **command.env})
    assert started["HIP_VISIBLE_DEVICES"] == started["CUDA_VISIBLE_DEVICES"] == own
    note = campaign_server.devices_note(run.plan.profile, run.servers, os.environ)
    assert note is not None
    assert note.startswith(
        "devices: each server's ids are drawn from the inherited "
        f"CUDA_VISIBLE_DEVICES={','.join(given)} (honoured); each gets HIP_VISIBLE_DEVICES "
        "and CUDA_VISIBLE_DEVICES set to its own, alike: vLLM's ROCm platform refuses to start "
        "with them apart (vllm/platforms/rocm.py, every supported version)"
    )
    # Its telemetry watches those 8, as HIP numbers them.
    scope = campaign_server.device_scope(run.description)
    assert (scope.ids, scope.variable, scope.beneath) == (
        tuple(given[:8]),
        "HIP_VISIBLE_DEVICES",
        (),
    )


def slots(environ: dict[str, str]) -> tuple[ServerSlot, ...]:
    """Two servers of 8 devices each on a 16-device node, under the job's ``environ``."""
    settings = plan_settings(profile=ROCM_PROFILE, devices_per_server=8)
    profile = load_profile(ROCM_PROFILE)
    return split_servers(settings, profile, 2, [0], devices=16, environ=environ)


SIXTEEN = ",".join(str(i) for i in range(8, 24))


@pytest.mark.parametrize(
    ("environ", "first", "says"),
    [
        (
            {"HIP_VISIBLE_DEVICES": SIXTEEN, "CUDA_VISIBLE_DEVICES": "0,1"},
            "8,9,10,11,12,13,14,15",
            [
                f"devices: each server's ids are drawn from the inherited HIP_VISIBLE_DEVICES="
                f"{SIXTEEN} (honoured); each gets HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES "
                "set to its own, alike: *",
                f"  the inherited HIP_VISIBLE_DEVICES={SIXTEEN} and CUDA_VISIBLE_DEVICES=0,1 "
                "differ: the ids are drawn from HIP_VISIBLE_DEVICES, which HIP reads first; "
                "CUDA_VISIBLE_DEVICES overridden",
            ],
        ),
        (
            {"ROCR_VISIBLE_DEVICES": SIXTEEN},
            "0,1,2,3,4,5,6,7",
            [
                "devices: each server's ids are counted from 0 within the inherited "
                "ROCR_VISIBLE_DEVICES (none of HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES "
                "inherited); each gets *",
                f"  the inherited ROCR_VISIBLE_DEVICES={SIXTEEN} is honoured and left as it is: "
                "the runtime applies it first, and the ids above count within it (vLLM never "
                "reads it)",
            ],
        ),
        (
            {},
            "0,1,2,3,4,5,6,7",
            [
                "devices: each server's ids are counted from 0 (none of HIP_VISIBLE_DEVICES and "
                "CUDA_VISIBLE_DEVICES inherited); each gets *"
            ],
        ),
    ],
    ids=["hip-and-cuda-apart", "rocr-only", "none"],
)
def test_the_plan_says_which_inherited_variables_are_honoured_overridden_or_left(
    environ: dict[str, str], first: str, says: list[str]
) -> None:
    servers = slots(environ)
    assert dict(servers[0].env) == dict.fromkeys(JOB_VARIABLES[:2], first)
    for slot in servers:  # ROCR_VISIBLE_DEVICES stays as inherited: vLLM starts on each
        vllm_rocm_start({**environ, **slot.env})
    note = devices_note(load_profile(ROCM_PROFILE), servers, environ)
    assert note is not None
    for line, pattern in zip(note.splitlines(), says, strict=True):
        assert re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), line), (line, pattern)


def test_rocr_visible_devices_bounds_how_many_servers_the_job_can_have() -> None:
    with pytest.raises(ServerSplitError) as raised:
        slots({"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert "needs 16 devices; the job is given 8 (ROCR_VISIBLE_DEVICES=0,1,2,3,4,5,6,7)" in str(
        raised.value
    )


def test_a_lone_server_under_hip_and_cuda_apart_is_warned_of() -> None:
    """Without devices of its own the server inherits the job's pair as it is: the plan says
    vLLM will refuse it, rather than the server's log an hour later."""
    environ = {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(ValueError):
        vllm_rocm_start(environ)
    note = devices_note(load_profile(ROCM_PROFILE), (ServerSlot(0),), environ)
    assert note == (
        "devices: the inherited HIP_VISIBLE_DEVICES=0 and CUDA_VISIBLE_DEVICES=1 differ, and "
        "vLLM's ROCm platform refuses to start with them apart (vllm/platforms/rocm.py, every "
        "supported version): export one of them, or the same ids in each"
    )
    assert devices_note(load_profile(ROCM_PROFILE), (ServerSlot(0),), {}) is None


# -- item 4: the telemetry reads the server's own devices ---------------------------------


def fake_tool(folder: Path, name: str, outputs: dict[str, tuple[str, int]]) -> None:
    """An executable on PATH answering each command line (its arguments, as one string) with
    what the real tool prints and its exit status; any other exits 2, as argparse does."""
    cases = []
    for number, (arguments, (output, status)) in enumerate(outputs.items()):
        data = folder / f"{name}.{number}.out"
        data.write_text(output if output.endswith("\n") else output + "\n")
        stream = "" if status == 0 else " >&2"
        loop = f"while IFS= read -r line; do printf '%s\\n' \"$line\"{stream}; done < '{data}'"
        cases.append(f'  "{arguments}") {loop}; exit {status} ;;\n')
    path = folder / name
    path.write_text(f'#!/bin/sh\ncase "$*" in\n{"".join(cases)}esac\nexit 2\n')  # builtins only
    path.chmod(0o755)


#: Four MI355X as amd-smi numbers them (0-3), with their PCI bus ids and the numbers HIP gives
#: them (KFD node order): neither order is the other's, nor PCI bus order.
#:   amd-smi GPU  bus  HIP   power  used
#:             0  c5    2    100 W  1 GiB
#:             1  05    1    200 W  2 GiB
#:             2  75    3    300 W  3 GiB
#:             3  15    0    400 W  4 GiB
AMD_GPUS = [(0, "c5", 2), (1, "05", 1), (2, "75", 3), (3, "15", 0)]
AMD_METRIC = json.dumps(
    [
        {
            "gpu": gpu,
            "usage": {"gfx_activity": {"value": 50, "unit": "%"}},
            "power": {"socket_power": {"value": 100 * (gpu + 1), "unit": "W"}},
            "mem_usage": {
                "used_vram": {"value": 1024 * (gpu + 1), "unit": "MB"},
                "total_vram": {"value": 294896, "unit": "MB"},
            },
        }
        for gpu, _, _ in AMD_GPUS
    ]
)


def hip_uuid(gpu: int) -> str:
    return f"GPU-{0x5F00 + gpu:016x}"


def amd_list(enumeration: bool) -> str:
    """``amd-smi list --json``, and with ``-e`` its enumeration too (amdsmi_cli's list stores
    ``hip_id`` and ``hip_uuid`` only under ``-e``)."""
    entries = []
    for gpu, bus, hip in AMD_GPUS:
        entry = {
            "gpu": gpu,
            "bdf": f"0000:{bus}:00.0",
            "uuid": f"{gpu}fff74a1-0000-1000-80ea-c4c4f5e6b9de",
            "kfd_id": 1000 + gpu,
            "node_id": hip + 2,
            "partition_id": 0,
        }
        if enumeration:
            entry.update(
                render=f"renderD{128 + gpu}",
                card=f"card{gpu}",
                hsa_id=hip + 2,
                hip_id=hip,
                hip_uuid=hip_uuid(gpu),
            )
        entries.append(entry)
    return json.dumps(entries)


def amd_smi(folder: Path, enumeration: bool = True) -> None:
    """amd-smi as a ROCm 6.4+ node has it; ``enumeration=False``: a release without ``-e``."""
    refused = ("amd-smi list: error: unrecognized arguments: -e", 2)
    fake_tool(
        folder,
        "amd-smi",
        {
            "metric --usage --power --mem-usage --json": (AMD_METRIC, 0),
            "list -e --json": (amd_list(True), 0) if enumeration else refused,
            "list --json": (amd_list(False), 0),
        },
    )


def scope_of(environ: dict[str, str], slot: ServerSlot, monkeypatch: pytest.MonkeyPatch):
    """The telemetry scope a launched ROCm server of ``slot`` has under the job's
    ``environ``: the one its energy, its memory and a relaunch's "memory back" wait read."""
    without_job_devices(monkeypatch)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    run = SimpleNamespace(
        settings=SimpleNamespace(url=None),
        plan=SimpleNamespace(profile=load_profile(ROCM_PROFILE)),
        placement=SimpleNamespace(slot=slot),
    )
    return campaign_server.device_scope(run)  # type: ignore[arg-type]


def own(hip: str) -> ServerSlot:
    return ServerSlot(0, devices=(hip,), env=dict.fromkeys(JOB_VARIABLES[:2], hip))


@pytest.mark.parametrize(
    ("environ", "slot", "gpus"),
    [
        ({}, own("0"), [3]),
        ({}, own("2"), [0]),
        ({"ROCR_VISIBLE_DEVICES": "2,3"}, own("1"), [2]),
        ({"ROCR_VISIBLE_DEVICES": "2,3"}, ServerSlot(0), [0, 2]),
        ({"ROCR_VISIBLE_DEVICES": f"{hip_uuid(0)},{hip_uuid(2)}"}, own("1"), [2]),
        ({"HIP_VISIBLE_DEVICES": "3"}, ServerSlot(0), [2]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, ServerSlot(0), [1]),
    ],
    ids=[
        "hip-0",
        "hip-2",
        "rocr-then-hip",
        "rocr-only",
        "rocr-by-hip-uuid",
        "inherited-hip",
        "inherited-cuda",
    ],
)
def test_amd_telemetry_reads_the_devices_hip_gives_the_server(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    environ: dict[str, str],
    slot: ServerSlot,
    gpus: list[int],
) -> None:
    """HIP's numbers, as amd-smi gives them (``list -e``), counted within what
    ROCR_VISIBLE_DEVICES leaves: the power and memory read are the server's GPUs', not those
    first in PCI bus order or in amd-smi's own numbering."""
    amd_smi(tmp_path)
    scope = scope_of(environ, slot, monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = telemetry.DeviceTelemetry.detect(scope)
    assert tool.tool == "amd-smi", tool.missing
    readings = tool.read()
    assert readings is not None
    assert sorted(r.index for r in readings) == gpus
    assert sorted(r.power_w for r in readings) == [100.0 * (g + 1) for g in gpus]
    assert telemetry.memory_used(scope) == {g: 1024 * (g + 1) * 2**20 for g in gpus}
    assert tool.describe()["numbering"] == "HIP's numbers as amd-smi list -e gives them (hip_id)"


def test_the_devices_telemetry_watches_say_the_variables_they_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    amd_smi(tmp_path)
    scope = scope_of({"ROCR_VISIBLE_DEVICES": "2,3"}, own("1"), monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    described = telemetry.DeviceTelemetry.detect(scope).describe()
    assert described["devices"] == (
        "HIP_VISIBLE_DEVICES=1 within ROCR_VISIBLE_DEVICES=2,3: bus 0000:75:00.0"
    )


def test_a_device_beyond_what_rocr_visible_devices_leaves_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    amd_smi(tmp_path)
    scope = scope_of({"ROCR_VISIBLE_DEVICES": "2,3"}, own("2"), monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = telemetry.DeviceTelemetry.detect(scope)
    assert tool.tool is None and telemetry.memory_used(scope) is None
    assert tool.missing == (
        "amd-smi: HIP_VISIBLE_DEVICES=2 within ROCR_VISIBLE_DEVICES=2,3: device 2 is not among "
        "the 2 that ROCR_VISIBLE_DEVICES leaves visible, counted from 0"
    )


def test_an_amd_smi_without_list_e_falls_back_to_pci_order_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release that refuses ``-e`` has no HIP numbers to give: PCI bus order, said."""
    amd_smi(tmp_path, enumeration=False)
    scope = scope_of({}, own("0"), monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = telemetry.DeviceTelemetry.detect(scope)
    (reading,) = tool.read() or []
    assert (reading.index, reading.bus_id) == (1, "0000:05:00.0")  # lowest bus id
    assert tool.describe()["numbering"] == "PCI bus order (amd-smi gives no HIP numbers here)"


def test_rocm_smi_reads_within_rocr_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rocm-smi's cards are numbered in neither PCI nor HIP order; without HIP numbers, a
    number is the place in PCI bus order, within ROCR_VISIBLE_DEVICES all the same."""
    cards = {
        f"card{n}": {
            "Current Socket Graphics Package Power (W)": f"{watts}.0",
            "VRAM Total Memory (B)": str(288 * 2**30),
            "VRAM Total Used Memory (B)": str(watts * 2**20),
            "PCI Bus": bus,
        }
        for n, watts, bus in (
            (0, 700, "0000:C5:00.0"),
            (1, 200, "0000:05:00.0"),
            (2, 300, "0000:15:00.0"),
        )
    }
    fake_tool(
        tmp_path,
        "rocm-smi",
        {"--showuse --showpower --showmeminfo vram --showbus --json": (json.dumps(cards), 0)},
    )
    scope = scope_of({"ROCR_VISIBLE_DEVICES": "1,2"}, ServerSlot(0), monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    readings = telemetry.DeviceTelemetry.detect(scope).read() or []
    # PCI order: card1 (05), card2 (15), card0 (c5): ROCR's 1 and 2 are card2 and card0.
    assert sorted((r.index, r.power_w) for r in readings) == [(0, 700.0), (2, 300.0)]
    assert telemetry.memory_used(scope) == {0: 700 * 2**20, 2: 300 * 2**20}
