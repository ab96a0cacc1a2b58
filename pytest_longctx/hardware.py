"""What the measurement ran on: CPU model, GPUs and their memory, library versions."""

from __future__ import annotations

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
                }
            )
        return found
    out = _run(["rocm-smi", "--showproductname", "--csv"])
    if out:
        lines = [ln for ln in out.strip().splitlines()[1:] if ln.strip()]
        return [
            {"vendor": "amd", "name": ln.split(",")[1].strip() if "," in ln else ln} for ln in lines
        ]
    return []


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
