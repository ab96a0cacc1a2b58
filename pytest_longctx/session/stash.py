"""Keys of what the plugin keeps on the config and on items, instead of globals, and the
parameters that make an item a sweep item."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_longctx.session.selection import Comparison

COMPARISONS_KEY: pytest.StashKey[tuple[Comparison, ...]] = pytest.StashKey()
#: On a sweep item: what its measurement produced, for the record written after it.
MEASUREMENT_KEY = pytest.StashKey[Any]()
#: On a sweep item: the fitted-or-not capacity verdict.
CAPACITY_KEY = pytest.StashKey[Any]()
#: Set once the sweep's lines of pytest's header are printed (at the start, or after collection).
HEADER_SHOWN_KEY = pytest.StashKey[bool]()
#: The parameter of a sweep point's item, and of a gate item (``callspec.params`` keys).
POINT_FIXTURE = "longctx_point"
REGRESSION_FIXTURE = "longctx_regression_length"
