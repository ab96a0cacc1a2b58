"""pytest-longctx: long-context LLM serving measured as a parametrized, gateable pytest suite.

The public API for writing your own long-context tests: the types the fixtures give
(``longctx_point`` -> :class:`Point`, ``longctx_prompt`` -> :class:`Prompt`,
``longctx_measure(prompt)`` -> :class:`PointMeasurement`, ``longctx_server`` ->
:class:`ServerInfo`), the records every report reads (:class:`Record`), and the hooks other
plugins implement (:mod:`pytest_longctx.session.hookspecs`).

The names load on first use: the plugin is imported by every pytest session of its
environment, and one without a sweep should not pay for the HTTP client and numpy.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_longctx.core.records import FIGURE_UNITS, OUTCOMES, Record, read_records
    from pytest_longctx.measure.measurement import PointFailure, PointMeasurement
    from pytest_longctx.measure.target import ServerInfo
    from pytest_longctx.plan import Point
    from pytest_longctx.prompts import Prompt
    from pytest_longctx.session import hookspecs

try:
    __version__ = metadata.version("pytest-longctx")
except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
    __version__ = "0+unknown"

#: Each public name and the module it comes from.
_PUBLIC = {
    "FIGURE_UNITS": "pytest_longctx.core.records",
    "OUTCOMES": "pytest_longctx.core.records",
    "Record": "pytest_longctx.core.records",
    "read_records": "pytest_longctx.core.records",
    "PointFailure": "pytest_longctx.measure.measurement",
    "PointMeasurement": "pytest_longctx.measure.measurement",
    "ServerInfo": "pytest_longctx.measure.target",
    "Point": "pytest_longctx.plan",
    "Prompt": "pytest_longctx.prompts",
    "hookspecs": "pytest_longctx.session.hookspecs",  # the module itself
}

__all__ = [
    "FIGURE_UNITS",
    "OUTCOMES",
    "Point",
    "PointFailure",
    "PointMeasurement",
    "Prompt",
    "Record",
    "ServerInfo",
    "__version__",
    "hookspecs",
    "read_records",
]


def __getattr__(name: str) -> Any:
    """``pytest_longctx.Record`` and the rest, imported when first asked for (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    value = module if module.__name__.endswith(f".{name}") else getattr(module, name)
    globals()[name] = value
    return value
