"""The package's folders are its design: data flows one way (options -> plan -> server -> prompt
-> measurement -> record -> reports and gate), pytest stays in the plugin layer, and no two
modules or packages import each other in a loop, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_longctx

PACKAGE = Path(pytest_longctx.__file__).parent
ROOT = PACKAGE.name

#: What each package may import from this one (besides itself), bottom-up. Every package is
#: listed: a new one must take its place here before it can import anything.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "client": {"core"},
    "prompts": {"core"},
    "profiles": {"core", "prompts"},
    "capacity": {"core", "profiles"},
    "plan": {"core", "profiles", "capacity"},
    "measure": {"core", "client", "prompts", "plan"},
    "serving": {"core", "client", "prompts", "profiles", "capacity", "plan", "measure"},
    "progress": {"core", "client", "measure"},
    "gate": {"core"},
    "reporting": {"core", "capacity", "gate", "progress"},
    "suite": {"__init__"},
}
#: The plugin layer: pytest-aware, and free to import every package below it.
PLUGIN_LAYER = {"session", "plugin", "cli", "__main__", "__init__"}

#: The modules of ``progress`` that only read files and do arithmetic: the only ones the
#: reports may import (the sampler talks to the server, telemetry runs the device tools).
PURE_PROGRESS = {"samples", "eta", "energy", "state"}


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """Every module of this package ``path`` imports, anywhere in it, relative ones resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            # ``from package import module`` imports the module; other names, the package.
            candidates = submodules + [base] * any(sub not in MODULES for sub in submodules)
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_place_in_the_layers() -> None:
    layers = {layer_of(module) for module in MODULES}
    assert layers - set(ALLOWED) - PLUGIN_LAYER == set()


def test_only_the_plugin_layer_imports_pytest() -> None:
    offenders = [
        module
        for module, path in MODULES.items()
        if layer_of(module) not in ("session", "plugin", "suite")
        and any(name.split(".")[0] in ("pytest", "_pytest") for name in third_party_imports(path))
    ]
    assert offenders == []


def test_each_layer_imports_only_what_comes_before_it() -> None:
    offenders = []
    for module, path in MODULES.items():
        layer = layer_of(module)
        if layer in PLUGIN_LAYER:
            continue
        for target in imports_of(path):
            if layer_of(target) != layer and layer_of(target) not in ALLOWED[layer]:
                offenders.append(f"{module} imports {target}")
    assert offenders == []


def test_below_the_plugin_layer_nothing_imports_the_session() -> None:
    offenders = [
        f"{module} imports {target}"
        for module, path in MODULES.items()
        if layer_of(module) not in ("session", "plugin", "__init__")
        for target in imports_of(path)
        if layer_of(target) in ("session", "plugin")
    ]
    assert offenders == []


def test_no_two_packages_import_each_other_in_a_loop() -> None:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for target in imports_of(path):
            if layer_of(target) != layer_of(module):
                edges.setdefault(layer_of(module), set()).add(layer_of(target))
    # The package's own __init__ re-exports the public API; it is the top, not a layer.
    edges.pop("__init__", None)
    assert cycles(edges) == []


def test_no_modules_import_each_other_in_a_loop() -> None:
    """Function-level imports count: one that only dodges a loop at import time is a loop."""
    edges = {module: imports_of(path) for module, path in MODULES.items()}
    assert cycles(edges) == []


def test_the_reports_read_progress_files_but_never_sample() -> None:
    offenders = []
    for module, path in MODULES.items():
        if layer_of(module) != "reporting" and not (
            layer_of(module) == "progress" and module.rsplit(".", 1)[-1] in PURE_PROGRESS
        ):
            continue
        for target in imports_of(path):
            if layer_of(target) == "progress" and target.rsplit(".", 1)[-1] not in PURE_PROGRESS:
                offenders.append(f"{module} imports {target}")
            if layer_of(module) == "progress" and layer_of(target) in ("measure", "serving"):
                offenders.append(f"{module} imports {target}")
    assert offenders == []


def test_no_module_is_over_600_lines() -> None:
    long = {
        module: lines
        for module, path in MODULES.items()
        if (lines := len(path.read_text().splitlines())) > 600
    }
    assert long == {}


def test_no_two_modules_share_a_name() -> None:
    """A reader should never have to guess which ``progress`` or ``compare`` is meant."""
    seen: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(module)
    assert {stem: names for stem, names in seen.items() if len(names) > 1} == {}


def test_the_public_api_is_stated() -> None:
    assert pytest_longctx.__version__
    for name in pytest_longctx.__all__:
        assert hasattr(pytest_longctx, name), name
