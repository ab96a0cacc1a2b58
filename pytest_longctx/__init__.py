"""pytest-longctx: long-context LLM serving measured as a parametrized, gateable pytest suite.

The public API for writing your own long-context tests: the types the fixtures give
(``longctx_point`` -> :class:`Point`, ``longctx_prompt`` -> :class:`Prompt`,
``longctx_measure(prompt)`` -> :class:`PointMeasurement`, ``longctx_server`` ->
:class:`ServerInfo`), the records every report reads (:class:`Record`), and the hooks other
plugins implement (:mod:`pytest_longctx.session.hookspecs`).
"""

from __future__ import annotations

from importlib import metadata

from pytest_longctx.core.records import FIGURE_UNITS, OUTCOMES, Record, read_records
from pytest_longctx.measure.point import PointFailure, PointMeasurement
from pytest_longctx.measure.target import ServerInfo
from pytest_longctx.plan import Point
from pytest_longctx.prompts import Prompt
from pytest_longctx.session import hookspecs

try:
    __version__ = metadata.version("pytest-longctx")
except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
    __version__ = "0+unknown"

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
