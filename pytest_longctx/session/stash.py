"""Keys of what the plugin keeps on the config and on items, instead of globals."""

from __future__ import annotations

from typing import Any

import pytest

RUN_KEY = pytest.StashKey["Run"]()
COMPARISONS_KEY = pytest.StashKey["tuple[Comparison, ...]"]()
#: On a sweep item: what its measurement produced, for the record written after it.
MEASUREMENT_KEY = pytest.StashKey[Any]()
#: On a sweep item: the fitted-or-not capacity verdict.
CAPACITY_KEY = pytest.StashKey[Any]()
