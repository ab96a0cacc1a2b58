"""Device telemetry from the vendors' command-line tools: memory used, utilization and power
per device, read at the progress sampler's cadence.

* NVIDIA: ``nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu,power.draw
  --format=csv,noheader,nounits``: one line per GPU, memory in MiB, utilization in %, power in
  W; a field the GPU does not report reads ``[N/A]`` or ``[Not Supported]``.
* AMD: ``amd-smi metric --usage --power --mem-usage --json``: one object per GPU (a list, or
  ``{"gpu_data": [...]}`` in newer releases) whose figures are ``{"value": v, "unit": u}``
  objects or ``"N/A"``: ``usage.gfx_activity`` (%), ``power.socket_power`` (W),
  ``mem_usage.used_vram`` and ``total_vram`` (MB, which amd-smi counts in MiB).
* AMD without amd-smi: ``rocm-smi --showuse --showpower --showmeminfo vram --json``: ``{"card0":
  {"GPU use (%)": "12", "... Power (W)": "35.0", "VRAM Total Memory (B)": ..., "VRAM Total
  Used Memory (B)": ...}}``.

A host without any of them (a CPU host) has telemetry recorded as missing, with the reason;
a tool that fails is a missing reading, never an error.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,memory.used,memory.total,utilization.gpu,power.draw",
    "--format=csv,noheader,nounits",
)
AMD_SMI = ("amd-smi", "metric", "--usage", "--power", "--mem-usage", "--json")
ROCM_SMI = ("rocm-smi", "--showuse", "--showpower", "--showmeminfo", "vram", "--json")

TOOL_TIMEOUT_S = 15.0
MIB = 1024**2
_UNIT_BYTES = {
    "B": 1,
    "KB": 1024,
    "KIB": 1024,
    "MB": MIB,
    "MIB": MIB,
    "GB": 1024**3,
    "GIB": 1024**3,
}


class TelemetryError(ValueError):
    """A tool's output that is not in the format its documentation gives."""


@dataclass(frozen=True)
class DeviceReading:
    """One device at one moment; None where the tool did not report the figure."""

    index: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_pct: float | None = None
    power_w: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(text: Any) -> float | None:
    """A figure as the tools print it; None for N/A, Not Supported and the like."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*[A-Za-z%]*\s*", str(text))
    return float(match.group(1)) if match else None


def parse_nvidia_smi(text: str) -> list[DeviceReading]:
    """``index, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]``."""
    readings = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit():
            raise TelemetryError(f"nvidia-smi: expected 5 fields starting with an index: {line!r}")
        used, total = _number(fields[1]), _number(fields[2])
        readings.append(
            DeviceReading(
                index=int(fields[0]),
                memory_used_bytes=int(used * MIB) if used is not None else None,
                memory_total_bytes=int(total * MIB) if total is not None else None,
                utilization_pct=_number(fields[3]),
                power_w=_number(fields[4]),
            )
        )
    return readings


def _amd_value(section: Any, *keys: str) -> tuple[float | None, str | None]:
    """The first of ``keys`` in an amd-smi section: ``(value, unit)``."""
    if not isinstance(section, Mapping):
        return None, None
    for key in keys:
        entry = section.get(key)
        if isinstance(entry, Mapping):
            value = _number(entry.get("value"))
            if value is not None:
                return value, str(entry.get("unit") or "")
        elif entry is not None and _number(entry) is not None:
            return _number(entry), None
    return None, None


def _amd_bytes(section: Any, key: str) -> int | None:
    value, unit = _amd_value(section, key)
    if value is None:
        return None
    return int(value * _UNIT_BYTES.get((unit or "MB").upper(), MIB))


def parse_amd_smi(text: str) -> list[DeviceReading]:
    """``amd-smi metric --json``: a list of GPUs, or ``{"gpu_data": [...]}``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TelemetryError(f"amd-smi: not JSON ({exc})") from None
    if isinstance(data, Mapping):
        data = data.get("gpu_data", [data])
    if not isinstance(data, list):
        raise TelemetryError("amd-smi: expected a list of GPUs")
    readings = []
    for position, gpu in enumerate(data):
        if not isinstance(gpu, Mapping):
            raise TelemetryError(f"amd-smi: GPU entry {position} is not an object")
        index = gpu.get("gpu", position)
        memory = gpu.get("mem_usage")
        utilization, _ = _amd_value(gpu.get("usage"), "gfx_activity")
        power, _ = _amd_value(
            gpu.get("power"), "socket_power", "current_socket_power", "average_socket_power"
        )
        readings.append(
            DeviceReading(
                index=int(index) if str(index).isdigit() else position,
                memory_used_bytes=_amd_bytes(memory, "used_vram"),
                memory_total_bytes=_amd_bytes(memory, "total_vram"),
                utilization_pct=utilization,
                power_w=power,
            )
        )
    return readings


def parse_rocm_smi(text: str) -> list[DeviceReading]:
    """``rocm-smi --json``: ``{"card0": {...}, ...}``; other top-level keys are skipped."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TelemetryError(f"rocm-smi: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise TelemetryError("rocm-smi: expected an object of cards")
    readings = []
    for name, card in data.items():
        match = re.fullmatch(r"card(\d+)", str(name))
        if not match or not isinstance(card, Mapping):
            continue
        power = next(
            (_number(v) for k, v in card.items() if "Power (W)" in k and _number(v) is not None),
            None,
        )
        used = _number(card.get("VRAM Total Used Memory (B)"))
        total = _number(card.get("VRAM Total Memory (B)"))
        readings.append(
            DeviceReading(
                index=int(match.group(1)),
                memory_used_bytes=int(used) if used is not None else None,
                memory_total_bytes=int(total) if total is not None else None,
                utilization_pct=_number(card.get("GPU use (%)")),
                power_w=power,
            )
        )
    return readings


#: Each tool, in the order they are tried, with its query and parser.
TOOLS: tuple[tuple[Sequence[str], Callable[[str], list[DeviceReading]]], ...] = (
    (NVIDIA_SMI, parse_nvidia_smi),
    (AMD_SMI, parse_amd_smi),
    (ROCM_SMI, parse_rocm_smi),
)
MISSING = "no nvidia-smi, amd-smi or rocm-smi on PATH"


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TelemetryError(f"{argv[0]}: {type(exc).__name__}: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise TelemetryError(
            f"{argv[0]} exited with {done.returncode}" + (f": {detail[-1]}" if detail else "")
        )
    return done.stdout


@dataclass
class DeviceTelemetry:
    """The tool this host has (or why there is none), read on demand."""

    tool: str | None
    argv: tuple[str, ...] = ()
    parser: Callable[[str], list[DeviceReading]] | None = None
    #: Why there is no telemetry (no tool, or the tool failed its first reading).
    missing: str | None = None
    #: The last failed reading, if any (a reading failing mid-run is kept as a gap).
    problem: str | None = None

    @classmethod
    def detect(cls) -> DeviceTelemetry:
        """The first tool on PATH whose first reading parses; missing, with why, otherwise."""
        failures = []
        for argv, parser in TOOLS:
            if shutil.which(argv[0]) is None:
                continue
            try:
                parser(_run(argv))
            except TelemetryError as exc:
                failures.append(str(exc))
                continue
            return cls(tool=argv[0], argv=tuple(argv), parser=parser)
        return cls(tool=None, missing="; ".join(failures) or MISSING)

    def read(self) -> list[DeviceReading] | None:
        """Every device now; None without a tool or when this reading failed."""
        if self.parser is None:
            return None
        try:
            return self.parser(_run(self.argv))
        except TelemetryError as exc:
            self.problem = str(exc)
            return None

    def describe(self) -> dict[str, Any]:
        """For the fingerprint and the sample files: the tool, or why none."""
        if self.tool is None:
            return {"tool": None, "missing": self.missing}
        return {"tool": self.tool, "command": list(self.argv)}


def memory_used(
    devices: Sequence[str] = (), telemetry: DeviceTelemetry | None = None
) -> dict[int, int] | None:
    """Bytes used on each device now, by the tool's index: only ``devices`` when they are
    indices (a server's ``CUDA_VISIBLE_DEVICES``), every device otherwise; None when no tool
    reads it (a CPU host) or the reading failed."""
    readings = (telemetry or DeviceTelemetry.detect()).read()
    if readings is None:
        return None
    wanted = {int(d) for d in devices} if devices and all(d.isdigit() for d in devices) else None
    return {
        reading.index: reading.memory_used_bytes
        for reading in readings
        if reading.memory_used_bytes is not None and (wanted is None or reading.index in wanted)
    }
