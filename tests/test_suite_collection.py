"""Collecting the plugin's own tests imports no heavy package: `make test` runs three sessions
and each collects every test file, so an import at the top of one file is paid by all three
(vLLM, torch and transformers: about 17 CPU-s of collection a session)."""

from __future__ import annotations

import json
import subprocess
import sys

from longctx_testing import REPO

HEAVY = ("vllm", "torch", "transformers")

COLLECT = """
import json, sys, pytest
code = pytest.main(["-p", "no:cacheprovider", "--collect-only", "-q", "-m", sys.argv[1], "tests"])
print(json.dumps([int(code), sorted(m for m in sys.argv[2:] if m in sys.modules)]))
"""


def test_collecting_every_test_file_imports_no_heavy_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, "own_server or stand_in", *HEAVY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert imported == [], f"collection imported {imported}: use deferred_import"
