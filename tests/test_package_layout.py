"""The package's folders are its design: pytest stays in the plugin layer, and the reports and
the gate read records, never a server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_longctx

PACKAGE = Path(pytest_longctx.__file__).parent

#: What each package may import from this one (besides itself).
ALLOWED = {
    "core": set(),
    "gate": {"core"},
    "reporting": {"core", "capacity", "gate", "progress"},
    "capacity": {"core", "plan", "serving"},
    "progress": {"core", "measure"},
}

#: The modules of ``progress`` that only read files and do arithmetic: the only ones the
#: reports may import (the sampler talks to the server, telemetry runs the device tools).
PURE_PROGRESS = {"samples", "eta", "energy", "state"}


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_plugin_layer_imports_pytest() -> None:
    offenders = []
    for path in modules():
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "session" or relative.name == "plugin.py":
            continue
        if any(name.split(".")[0] in ("pytest", "_pytest") for name in imports_of(path)):
            offenders.append(str(relative))
    assert offenders == []


def test_only_the_plugin_layer_imports_the_session() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in modules()
        if path.relative_to(PACKAGE).parts[0] not in ("session",)
        and path.name not in ("plugin.py",)
        and path.relative_to(PACKAGE) != Path("__init__.py")
        and any(name.startswith("pytest_longctx.session") for name in imports_of(path))
    ]
    assert offenders == []


def test_each_layer_imports_only_what_comes_before_it() -> None:
    offenders = []
    for path in modules():
        relative = path.relative_to(PACKAGE)
        layer = relative.parts[0]
        if layer not in ALLOWED:
            continue
        for name in imports_of(path):
            parts = name.split(".")
            if parts[0] != "pytest_longctx" or len(parts) < 2:
                continue
            if parts[1] != layer and parts[1] not in ALLOWED[layer]:
                offenders.append(f"{relative} imports {name}")
    assert offenders == []


def test_the_reports_read_progress_files_but_never_sample() -> None:
    offenders = []
    for path in sorted((PACKAGE / "reporting").rglob("*.py")):
        for name in imports_of(path):
            parts = name.split(".")
            if parts[:2] == ["pytest_longctx", "progress"] and (
                len(parts) < 3 or parts[2] not in PURE_PROGRESS
            ):
                offenders.append(f"{path.name} imports {name}")
    for module in PURE_PROGRESS:
        for name in imports_of(PACKAGE / "progress" / f"{module}.py"):
            parts = name.split(".")
            if parts[:2] == ["pytest_longctx", "progress"] and parts[2] not in PURE_PROGRESS:
                offenders.append(f"progress/{module}.py imports {name}")
            if parts[:2] in (["pytest_longctx", "measure"], ["pytest_longctx", "serving"]):
                offenders.append(f"progress/{module}.py imports {name}")
    assert offenders == []


def test_the_public_api_is_stated() -> None:
    assert pytest_longctx.__version__
    for name in pytest_longctx.__all__:
        assert hasattr(pytest_longctx, name), name
