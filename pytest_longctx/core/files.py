"""Files that appear whole or not at all: the one atomic writer, the one lock between the
processes of a campaign, and the redaction marker."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

#: What stands in for a secret (an API key, a token) in every log, record and report.
REDACTED = "***"


def write_atomically(path: Path | str, content: str | bytes) -> Path:
    """Replace ``path`` in one step, so a reader never sees half a file.

    Reports are rewritten after every sweep point while someone may have them open; a crash
    mid-write leaves the previous version, never a truncated one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per process and thread, so two writers never share a temporary file.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold ``path`` (a lock file, made if missing) exclusively: one pytest-xdist worker at a
    time reads and writes what the workers of one run share."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
