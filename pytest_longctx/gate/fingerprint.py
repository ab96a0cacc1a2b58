"""What must match for two runs to be compared."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pytest_longctx.core.records import (
    Record,
)

FINGERPRINT_KEYS: tuple[str, ...] = (
    "model",
    "revision",
    "profile",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "vllm_version",
    "hardware",
)
"""Keys of ``Record.fingerprint`` that must match for two runs to be comparable.

``hardware`` is a mapping; the gate reads only :data:`HARDWARE_KEYS` from it and compares a
normalised identity (see :func:`hardware_identity`). Other values compare as text, whitespace
collapsed, so ``1`` and ``"1"`` agree. A key absent on both sides is no difference; absent on one
side it is, since the gate cannot confirm the setups match.
"""

HARDWARE_KEYS: tuple[str, ...] = ("gpu_names", "gpu_count", "cpu_model", "cpu_count")
"""Keys of ``fingerprint["hardware"]`` the gate reads.

``gpu_count`` is how many GPUs the server may use, ``gpu_names`` their model names (distinct
names or one per GPU: both read the same), ``cpu_model`` the host CPU's model string and
``cpu_count`` its cores, as :func:`pytest_longctx.profiles.hardware.describe_host` reports them.
"""

_NOT_RECORDED = "(not recorded)"


def hardware_identity(hardware: Any) -> str:
    """What sets the speed: the GPUs when there are any, else the CPU model and its cores.

    The host CPU of a GPU run is left out on purpose: CI pools mix host CPUs under the same GPUs,
    and refusing those comparisons would train teams to always force.
    """
    if not isinstance(hardware, Mapping) or not hardware:
        return _NOT_RECORDED
    names = [_normalise_text(name) for name in hardware.get("gpu_names") or []]
    count = _as_int(hardware.get("gpu_count")) or len(names)
    if count:
        return f"{count}x {' + '.join(sorted(set(names))) or 'unnamed GPU'}"
    cpu = _normalise_text(hardware.get("cpu_model") or "") or "unnamed CPU"
    # A server bound to some of the host's cores runs on those.
    cores = _as_int(hardware.get("server_cores")) or _as_int(hardware.get("cpu_count"))
    return f"CPU {cpu}" + (f" ({cores} cores)" if cores else "")


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _normalise_text(value: Any) -> str:
    return " ".join(str(value).split())


def _fingerprint_value(fingerprint: Mapping[str, Any], key: str) -> str:
    if key == "hardware":
        return hardware_identity(fingerprint.get("hardware"))
    value = fingerprint.get(key)
    if value is None or value == "":
        return _NOT_RECORDED
    if isinstance(value, (list, tuple)):
        return ", ".join(_normalise_text(item) for item in value)
    return _normalise_text(value)


def fingerprint_differences(
    baseline_records: Iterable[Record],
    current_records_or_fingerprint: Iterable[Record] | Mapping[str, Any],
) -> list[str]:
    """One line per :data:`FINGERPRINT_KEYS` entry that differs, e.g.
    ``vllm_version: baseline 0.32.0, now 0.33.0``; empty when the runs are comparable.

    The current side may be a fingerprint, so the check can run before any server starts.
    """
    if isinstance(current_records_or_fingerprint, Mapping):
        current = [current_records_or_fingerprint]
    else:
        current = [record.fingerprint for record in current_records_or_fingerprint]
    baseline = [record.fingerprint for record in baseline_records]
    if not baseline or not current:
        return []
    differences = []
    for key in FINGERPRINT_KEYS:
        before = sorted({_fingerprint_value(fp, key) for fp in baseline})
        after = sorted({_fingerprint_value(fp, key) for fp in current})
        if before != after:
            differences.append(f"{key}: baseline {' / '.join(before)}, now {' / '.join(after)}")
    return differences


def fingerprint_mismatch(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[str]:
    """One line per :data:`FINGERPRINT_KEYS` entry two servers' fingerprints disagree on."""
    return [
        f"{key}: {a} vs {b}"
        for key in FINGERPRINT_KEYS
        if (a := _fingerprint_value(first, key)) != (b := _fingerprint_value(second, key))
    ]
