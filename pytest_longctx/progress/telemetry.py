"""Device telemetry from the vendors' command-line tools: memory used, utilization and power
per device, read at the progress sampler's cadence.

* NVIDIA: ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,memory.used,memory.total,
  utilization.gpu,power.draw --format=csv,noheader,nounits``: one line per GPU, memory in MiB,
  utilization in %, power in W; a field the GPU does not report reads ``[N/A]`` or
  ``[Not Supported]``.
* AMD: ``amd-smi metric --usage --power --mem-usage --json``: one object per GPU (a list, or
  ``{"gpu_data": [...]}`` in newer releases) whose figures are ``{"value": v, "unit": u}``
  objects or ``"N/A"``: ``usage.gfx_activity`` (%), ``power.socket_power`` (W),
  ``mem_usage.used_vram`` and ``total_vram`` (MB, which amd-smi counts in MiB). Its GPU
  numbers are amd-smi's own: ``amd-smi list -e --json`` gives each one's ``bdf`` (PCI bus
  id), ``uuid`` and its enumeration: ``hip_id``, the number HIP gives it with nothing hidden
  (amd-smi's KFD node id less the smallest GPU node's), and ``hip_uuid`` (``GPU-`` and 16
  hex digits, a form ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES accept). amd-smi prints
  the enumeration only under ``-e`` (``--enumeration``); a release without it refuses
  ``-e``, and ``amd-smi list --json`` is read instead.
* AMD without amd-smi: ``rocm-smi --showuse --showpower --showmeminfo vram --showbus
  --json``: ``{"card0": {"GPU use (%)": "12", "... Power (W)": "35.0", "VRAM Total Memory
  (B)": ..., "VRAM Total Used Memory (B)": ..., "PCI Bus": "0000:05:00.0"}}``.

Only the server's own devices are read: those its ``CUDA_VISIBLE_DEVICES`` or
``HIP_VISIBLE_DEVICES`` names (:class:`DeviceScope`), counted within the devices an
inherited ``ROCR_VISIBLE_DEVICES`` leaves (ROCm's runtime applies it first and numbers what
it leaves from 0; Slurm and Kubernetes set it on AMD nodes), matched to the tool's devices by
PCI bus id (a tool's numbers are not the runtime's: nvidia-smi counts in PCI order, amd-smi
and rocm-smi in their own). A host without any of the tools (a CPU host) has telemetry recorded
as missing, with the reason; a tool that fails is a missing reading, never an error.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,uuid,memory.used,memory.total,utilization.gpu,power.draw",
    "--format=csv,noheader,nounits",
)
AMD_SMI = ("amd-smi", "metric", "--usage", "--power", "--mem-usage", "--json")
#: amd-smi's static list with its enumeration: each GPU's number, PCI bus id, UUID, HIP
#: number and HIP UUID.
AMD_SMI_LIST = ("amd-smi", "list", "-e", "--json")
#: The same without the enumeration, for a release that refuses ``-e``: no HIP numbers.
AMD_SMI_LIST_PLAIN = ("amd-smi", "list", "--json")
ROCM_SMI = ("rocm-smi", "--showuse", "--showpower", "--showmeminfo", "vram", "--showbus", "--json")
#: The tools average power over about a second (nvidia-smi's power.draw is a one-second
#: average on recent drivers, amd-smi's socket power likewise): a span shorter than this,
#: or read fewer than twice, has no energy that was measured.
POWER_AVERAGING_S = 1.0

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
    #: The PCI bus id (``0000:3b:00.0``), the same in every tool and runtime.
    bus_id: str | None = None
    uuid: str | None = None

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


def bus_id(text: Any) -> str | None:
    """A PCI bus id as every tool can be compared on: ``domain:bus:device.function`` in
    lower case with a 4-digit domain (nvidia-smi prints an 8-digit one: ``00000000:3B:00.0``)."""
    match = re.fullmatch(
        r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*", str(text)
    )
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def parse_nvidia_smi(text: str) -> list[DeviceReading]:
    """``index, pci.bus_id, uuid, memory.used [MiB], memory.total [MiB], utilization.gpu [%],
    power.draw [W]``."""
    readings = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 7 or not fields[0].isdigit():
            raise TelemetryError(f"nvidia-smi: expected 7 fields starting with an index: {line!r}")
        used, total = _number(fields[3]), _number(fields[4])
        readings.append(
            DeviceReading(
                index=int(fields[0]),
                memory_used_bytes=int(used * MIB) if used is not None else None,
                memory_total_bytes=int(total * MIB) if total is not None else None,
                utilization_pct=_number(fields[5]),
                power_w=_number(fields[6]),
                bus_id=bus_id(fields[1]),
                uuid=fields[2] or None,
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
                bus_id=bus_id(card.get("PCI Bus")),
            )
        )
    return readings


@dataclass(frozen=True)
class ListedDevice:
    """One GPU as ``amd-smi list`` names it: amd-smi's number, bus id, UUID, HIP's number
    and HIP's UUID."""

    index: int
    bus_id: str | None
    uuid: str | None = None
    hip_id: int | None = None
    hip_uuid: str | None = None


def parse_amd_smi_list(text: str) -> list[ListedDevice]:
    """``amd-smi list -e --json``: ``[{"gpu": 0, "bdf": "0000:05:00.0", "uuid": ...,
    "hsa_id": 2, "hip_id": 0, "hip_uuid": "GPU-...", ...}, ...]`` (without ``-e``, or where
    amd-smi cannot tell, no ``hip_id``/``hip_uuid`` or ``"N/A"``)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TelemetryError(f"amd-smi list: not JSON ({exc})") from None
    if isinstance(data, Mapping):
        data = data.get("gpu_data", [data])
    if not isinstance(data, list):
        raise TelemetryError("amd-smi list: expected a list of GPUs")
    listed = []
    for position, gpu in enumerate(data):
        if not isinstance(gpu, Mapping):
            raise TelemetryError(f"amd-smi list: GPU entry {position} is not an object")
        index, hip = str(gpu.get("gpu", position)), str(gpu.get("hip_id"))
        hip_uuid = str(gpu.get("hip_uuid") or "")
        listed.append(
            ListedDevice(
                index=int(index) if index.isdigit() else position,
                bus_id=bus_id(gpu.get("bdf")),
                uuid=str(gpu["uuid"]) if gpu.get("uuid") else None,
                hip_id=int(hip) if hip.isdigit() else None,
                hip_uuid=hip_uuid if hip_uuid.upper().startswith("GPU-") else None,
            )
        )
    return listed


def _uuid_key(text: str) -> str:
    """A GPU UUID as CUDA, HIP and the tools write it, compared without ``GPU-`` and dashes."""
    text = text.strip().lower()
    return (text[4:] if text.startswith("gpu-") else text).replace("-", "")


@dataclass(frozen=True)
class DeviceScope:
    """The devices one server was given: the ids of its ``variable`` (``CUDA_VISIBLE_DEVICES``
    or ``HIP_VISIBLE_DEVICES``) counted within those the ids of ``beneath_variable``
    (``ROCR_VISIBLE_DEVICES``, which ROCm's runtime applies first) leave visible (neither:
    every device of this host), and the nodes its profile spans with their devices each (a
    Ray server's other nodes are not read from here)."""

    ids: tuple[str, ...] = ()
    variable: str = "CUDA_VISIBLE_DEVICES"
    nodes: int = 1
    devices_per_node: int | None = None
    #: The runtime's own narrowing, in its order (empty: none).
    beneath: tuple[str, ...] = ()
    beneath_variable: str = "ROCR_VISIBLE_DEVICES"

    def bus_ids(
        self, readings: Sequence[DeviceReading], listed: Sequence[ListedDevice] = ()
    ) -> frozenset[str] | None:
        """The PCI bus ids of the scope's devices; None for every device. A number in
        ``beneath`` is the runtime's with nothing hidden: HIP's ``hip_id`` where amd-smi lists
        it, else the place in PCI bus order (nvidia-smi's own order, and CUDA's under
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on a node of one GPU model); a number in ``ids``
        is the same where nothing is beneath, else the place in ``beneath``'s list; a UUID is
        matched as such (amd-smi's ``uuid`` or ``hip_uuid``). Raises TelemetryError naming an
        id no device matches."""
        if not self.ids and not self.beneath:
            return None
        by_pci = sorted((r for r in readings if r.bus_id), key=lambda r: r.bus_id or "")
        hip = {d.hip_id: d.bus_id for d in listed if d.hip_id is not None and d.bus_id}
        uuids = {_uuid_key(r.uuid): r.bus_id for r in readings if r.uuid and r.bus_id}
        for entry in listed:
            for uuid in (entry.uuid, entry.hip_uuid):
                if uuid and entry.bus_id:
                    uuids[_uuid_key(uuid)] = entry.bus_id

        def unhidden(device: str, given: str) -> str:
            """The bus id of a device as the runtime numbers it with nothing hidden."""
            device = device.strip()
            if device.isdigit():
                number = int(device)
                if hip:
                    found_id = hip.get(number)
                else:
                    found_id = by_pci[number].bus_id if number < len(by_pci) else None
            else:
                found_id = uuids.get(_uuid_key(device))
            if found_id is None:
                raise TelemetryError(
                    f"{given}: device {device} is not among the {len(readings)} the tool "
                    "lists with a PCI bus id, so no reading can be told to be the server's"
                )
            return found_id

        if not self.beneath:
            given = f"{self.variable}={','.join(self.ids)}"
            return frozenset(unhidden(device, given) for device in self.ids)
        under = f"{self.beneath_variable}={','.join(self.beneath)}"
        visible = [unhidden(device, under) for device in self.beneath]
        if not self.ids:
            return frozenset(visible)
        given = f"{self.variable}={','.join(self.ids)} within {under}"
        found = set()
        for device in self.ids:
            device = device.strip()
            if not device.isdigit():
                found.add(unhidden(device, given))
            elif int(device) < len(visible):
                found.add(visible[int(device)])
            else:
                raise TelemetryError(
                    f"{given}: device {device} is not among the {len(visible)} that "
                    f"{self.beneath_variable} leaves visible, counted from 0"
                )
        return frozenset(found)

    def describe(self) -> str:
        """``HIP_VISIBLE_DEVICES=0,1 within ROCR_VISIBLE_DEVICES=4,5,6,7``."""
        parts = [f"{self.variable}={','.join(self.ids)}"] if self.ids else []
        if self.beneath:
            parts.append(f"{self.beneath_variable}={','.join(self.beneath)}")
        return " within ".join(parts)

    def coverage(self, read: int) -> str | None:
        """What the readings cover of a server over several nodes: None on one node."""
        if self.nodes <= 1:
            return None
        total = f"{self.nodes * self.devices_per_node}" if self.devices_per_node else "?"
        return f"{read} of {total} GPUs (head node only; the other {self.nodes - 1} nodes unread)"


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
    """The tool this host has (or why there is none), read on demand for the server's own
    devices (:class:`DeviceScope`)."""

    tool: str | None
    argv: tuple[str, ...] = ()
    parser: Callable[[str], list[DeviceReading]] | None = None
    #: Why there is no telemetry (no tool, the tool failed its first reading, or the
    #: server's devices are not among those it lists).
    missing: str | None = None
    #: The last failed reading, if any (a reading failing mid-run is kept as a gap).
    problem: str | None = None
    scope: DeviceScope = DeviceScope()
    #: amd-smi's list (its numbers to bus ids and HIP's numbers); empty for other tools.
    listed: tuple[ListedDevice, ...] = ()
    #: The bus ids of the server's devices; None: every device the tool lists.
    own: frozenset[str] | None = None
    #: How many devices the first reading counted as the server's.
    devices_read: int = 0

    @classmethod
    def detect(cls, scope: DeviceScope | None = None) -> DeviceTelemetry:
        """The first tool on PATH whose first reading parses, scoped to ``scope``; missing,
        with why, otherwise."""
        scope = scope or DeviceScope()
        failures = []
        for argv, parser in TOOLS:
            if shutil.which(argv[0]) is None:
                continue
            try:
                readings = parser(_run(argv))
            except TelemetryError as exc:
                failures.append(str(exc))
                continue
            listed: tuple[ListedDevice, ...] = ()
            if argv == AMD_SMI:
                listed = _amd_smi_list(failures)
            found = cls(tool=argv[0], argv=tuple(argv), parser=parser, scope=scope, listed=listed)
            readings = found._with_bus_ids(readings)
            try:
                found.own = scope.bus_ids(readings, listed)
            except TelemetryError as exc:
                return cls(tool=None, missing=f"{argv[0]}: {exc}", scope=scope)
            found.devices_read = len(found._scoped(readings))
            return found
        return cls(tool=None, missing="; ".join(failures) or MISSING, scope=scope)

    def _with_bus_ids(self, readings: list[DeviceReading]) -> list[DeviceReading]:
        """amd-smi's metrics carry its numbers only: the bus ids come from its list."""
        if not self.listed:
            return readings
        by_index = {d.index: d for d in self.listed}
        return [
            replace(r, bus_id=by_index[r.index].bus_id, uuid=by_index[r.index].uuid)
            if r.bus_id is None and r.index in by_index
            else r
            for r in readings
        ]

    def _scoped(self, readings: list[DeviceReading]) -> list[DeviceReading]:
        if self.own is None:
            return readings
        return [r for r in readings if r.bus_id in self.own]

    def read(self) -> list[DeviceReading] | None:
        """The server's devices now; None without a tool or when this reading failed."""
        if self.parser is None:
            return None
        try:
            return self._scoped(self._with_bus_ids(self.parser(_run(self.argv))))
        except TelemetryError as exc:
            self.problem = str(exc)
            return None

    def numbering(self) -> str:
        """How the runtime's device numbers were matched to the tool's devices."""
        if any(device.hip_id is not None for device in self.listed):
            return "HIP's numbers as amd-smi list -e gives them (hip_id)"
        if self.tool == "nvidia-smi":
            return "PCI bus order (nvidia-smi's, and CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID)"
        return f"PCI bus order ({self.tool} gives no HIP numbers here)"

    def describe(self) -> dict[str, Any]:
        """For the fingerprint and the sample files: the tool and the devices it reads, how
        they were told apart (and what they cover of a server over several nodes), or why
        none."""
        if self.tool is None:
            return {"tool": None, "missing": self.missing}
        scope = self.scope
        scoped = bool(scope.ids or scope.beneath)
        described: dict[str, Any] = {
            "tool": self.tool,
            "command": list(self.argv),
            "devices": (
                f"{scope.describe()}: bus " + ", ".join(sorted(self.own or ()))
                if scoped
                else f"every device {self.tool} lists (no device ids known for the server)"
            ),
        }
        if scoped:
            described["numbering"] = self.numbering()
        coverage = scope.coverage(self.devices_read)
        if coverage is not None:
            described["coverage"] = coverage
        return described


def _amd_smi_list(failures: list[str]) -> tuple[ListedDevice, ...]:
    """amd-smi's list with HIP's numbers (``list -e``), else without them (a release that
    refuses ``-e``); empty, with the failure noted, when neither reads."""
    for argv in (AMD_SMI_LIST, AMD_SMI_LIST_PLAIN):
        try:
            return tuple(parse_amd_smi_list(_run(argv)))
        except TelemetryError as exc:
            failures.append(f"{' '.join(argv)}: {exc}")
    return ()


def memory_used(
    scope: DeviceScope, telemetry: DeviceTelemetry | None = None
) -> dict[int, int] | None:
    """Bytes used on each of the server's devices now, by the tool's index; None when no
    tool reads them (a CPU host, devices the tool does not list) or the reading failed."""
    readings = (telemetry or DeviceTelemetry.detect(scope)).read()
    if readings is None:
        return None
    return {
        reading.index: reading.memory_used_bytes
        for reading in readings
        if reading.memory_used_bytes is not None
    }
