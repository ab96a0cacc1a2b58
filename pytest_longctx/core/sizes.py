"""The one place that parses and prints context lengths (``1Ki``, ``64Mi``, ``1048576``)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "ki": 1024, "mi": 1024**2, "gi": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(ki|mi|gi)?\s*$", re.IGNORECASE)

ACCEPTED_FORM = "a token count like 65536 or a binary size like 1Ki, 64Mi, 1Gi"


class SizeError(ValueError):
    """A length that is not ``N``, ``NKi``, ``NMi`` or ``NGi``."""


def parse_size(text: str | int) -> int:
    """Tokens in ``text``; raises :class:`SizeError` naming the accepted form."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise SizeError(f"{text!r} is not a length; expected {ACCEPTED_FORM}")
        value = int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if value <= 0:
        raise SizeError(f"{text!r} is not a positive length; expected {ACCEPTED_FORM}")
    return value


def format_size(tokens: int) -> str:
    """``1024`` -> ``1Ki``; lengths that are not a whole unit print as the raw count."""
    for suffix, unit in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if tokens >= unit and tokens % unit == 0:
            return f"{tokens // unit}{suffix}"
    return str(tokens)


def format_bytes(value: float) -> str:
    """A byte count in its largest binary unit: ``1.5 GiB``, ``512 B``."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def powers_of_two_between(low: int, high: int) -> list[int]:
    """Powers of two in ``[low, high]``: ``low`` rounds up, ``high`` rounds down."""
    power = 1 << max(0, (low - 1).bit_length())
    lengths = []
    while power <= high:
        lengths.append(power)
        power <<= 1
    return lengths
