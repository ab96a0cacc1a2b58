"""Shared pieces of the plugin's own tests.

End-to-end tests run pytest sessions (through ``pytester``) against real vLLM. They share
this session's server: the plugin's own ``longctx_server`` fixture launches it once from the
repository's profile (cpu-tiny), and sub-sessions attach to it with ``--longctx-url``. Tests
that are about launching start their own server in a subprocess session.
"""

from __future__ import annotations

import pytest
from longctx_testing import SWEEP_TEST


@pytest.fixture(scope="session")
def vllm_url(longctx_server) -> str:  # noqa: ANN001
    """URL of this session's real vLLM server (cpu-tiny), for sub-sessions to attach to."""
    return longctx_server.base_url


@pytest.fixture
def sweep_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder holding the repository's own sweep test, as a user's project would."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    return pytester
