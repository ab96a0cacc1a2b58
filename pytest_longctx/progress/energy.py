"""Energy of a point from the power its devices drew, sampled while it ran.

Power between two readings is taken as the straight line between them, and before the first
or after the last reading as that reading: the trapezoid rule, on whatever cadence the
readings came. A point's energy is split at its first token: **prefill energy** is drawn from
t0 to the first token, **decode energy** from the first token to the last, so
``energy_per_prompt_token`` is prefill energy over the prompt's tokens and
``energy_per_generated_token`` is decode energy over the ``N - 1`` tokens decoded after the
first (the same count decode throughput divides by). Every device's energy is summed: the
devices are the server's own (telemetry.DeviceScope). A phase no longer than the tool's power
averaging window, or read fewer than twice, has its figures left out, said as not measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def integrate(times: Sequence[float], values: Sequence[float], start: float, end: float) -> float:
    """The integral of the piecewise-linear curve through ``(times, values)`` over
    ``[start, end]``, held flat before the first and after the last reading.

    ``times`` must be sorted; raises ValueError on no readings or mismatched lengths.
    """
    if len(times) != len(values):
        raise ValueError(f"{len(times)} times but {len(values)} values")
    if not times:
        raise ValueError("no readings to integrate")
    if end <= start:
        return 0.0

    def at(t: float) -> float:
        if t <= times[0]:
            return values[0]
        if t >= times[-1]:
            return values[-1]
        # the segment holding t (readings are few: a linear scan is fine)
        for index in range(1, len(times)):
            if t <= times[index]:
                t0, t1 = times[index - 1], times[index]
                v0, v1 = values[index - 1], values[index]
                return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return values[-1]  # pragma: no cover - unreachable: t < times[-1]

    knots = [start, *(t for t in times if start < t < end), end]
    return math.fsum(
        (right - left) * (at(left) + at(right)) / 2
        for left, right in zip(knots, knots[1:], strict=False)
    )


def power_series(readings: Iterable[tuple[float, Sequence[Mapping[str, Any]]]]) -> dict[int, tuple]:
    """Per device index: ``(times, watts)`` from ``(t, devices)`` readings, skipping readings
    where that device reported no power."""
    series: dict[int, tuple[list[float], list[float]]] = {}
    for t, devices in readings:
        for device in devices:
            power = device.get("power_w")
            if power is None or not math.isfinite(power):
                continue
            times, watts = series.setdefault(int(device.get("index", 0)), ([], []))
            times.append(t)
            watts.append(float(power))
    return {index: (tuple(times), tuple(watts)) for index, (times, watts) in series.items()}


def energy_between(series: Mapping[int, tuple], start: float, end: float) -> float | None:
    """Joules drawn by every device over ``[start, end]``; None without any power reading."""
    if not series:
        return None
    return math.fsum(integrate(times, watts, start, end) for times, watts in series.values())


def _unmeasured(
    series: Mapping[int, tuple], start: float, end: float, window_s: float, what: str
) -> str | None:
    """Why the energy over ``[start, end]`` is not a measurement, or None when it is: the
    tools average power over ``window_s``, so a shorter span, or one read fewer than twice,
    holds mostly power drawn outside it."""
    span = end - start
    if span <= window_s:
        return (
            f"not measured: the {what} took {span:.3g} s, not more than the power tool's "
            f"{window_s:g} s averaging window"
        )
    inside = max(sum(1 for t in times if start <= t <= end) for times, _ in series.values())
    if inside < 2:
        return (
            f"not measured: {inside} power reading(s) during the {what} ({span:.3g} s); "
            "2 are needed"
        )
    return None


def energy_figures(
    readings: Iterable[tuple[float, Sequence[Mapping[str, Any]]]],
    first_token_s: float | None,
    last_token_s: float | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    window_s: float = 0.0,
) -> tuple[dict[str, float], dict[str, str]]:
    """The point's energy figures (J and J/token), times relative to t0, and the figures not
    measured with why (a phase no longer than the tool's averaging ``window_s``, or read
    fewer than twice); both empty when no device reported power or the stream produced no
    token. ``energy`` needs both phases measured."""
    series = power_series(readings)
    if not series or first_token_s is None:
        return {}, {}
    last = last_token_s if last_token_s is not None else first_token_s
    figures: dict[str, float] = {}
    unmeasured: dict[str, str] = {}
    prefill_problem = _unmeasured(series, 0.0, first_token_s, window_s, "prefill")
    if prefill_problem is None:
        prefill = energy_between(series, 0.0, first_token_s) or 0.0
        figures["prefill_energy"] = prefill
        if prompt_tokens:
            figures["energy_per_prompt_token"] = prefill / prompt_tokens
    else:
        unmeasured["prefill_energy"] = prefill_problem
    decode_problem = (
        _unmeasured(series, first_token_s, last, window_s, "decode")
        if last > first_token_s
        else None
    )
    if decode_problem is None:
        decode = energy_between(series, first_token_s, last) or 0.0
        figures["decode_energy"] = decode
        if completion_tokens and completion_tokens > 1 and last > first_token_s:
            figures["energy_per_generated_token"] = decode / (completion_tokens - 1)
    else:
        unmeasured["decode_energy"] = decode_problem
    if "prefill_energy" in figures and "decode_energy" in figures:
        figures["energy"] = figures["prefill_energy"] + figures["decode_energy"]
    else:
        missing = [p for p in ("prefill", "decode") if f"{p}_energy" in unmeasured]
        unmeasured["energy"] = f"not measured: the {' and '.join(missing)} energy is not"
    return figures, unmeasured
