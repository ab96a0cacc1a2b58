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


def private_imports(source: str) -> list[str]:
    """``from <a module of this package> import _name``: another module's private name, which
    says either that the two are one module split apart or that the name is an interface."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] == ROOT
        ):
            found += [
                f"line {node.lineno}: {node.module or '.'} {alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = {
        module: found
        for module, path in MODULES.items()
        if (found := private_imports(path.read_text()))
    }
    assert offenders == {}


#: Suffixes of the files a session writes into its run folder and output root.
OUTPUT_SUFFIXES = (".jsonl", ".json", ".md", ".html", ".png", ".log")
#: Named elsewhere on purpose: the marker of a built model's folder, not a session's output.
NOT_SESSION_OUTPUTS = {".pytest-longctx-build.json"}


def output_file_names(source: str) -> list[str]:
    """Module-level names bound to an output file's name (``X = "report.md"``, also in a tuple)."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for constant in ast.walk(node.value):
            text = constant.value if isinstance(constant, ast.Constant) else None
            if (
                isinstance(text, str)
                and text.endswith(OUTPUT_SUFFIXES)
                and text not in NOT_SESSION_OUTPUTS
            ):
                found.append(f"line {node.lineno}: {text}")
    return found


def test_every_output_file_is_named_in_one_module() -> None:
    offenders = {
        module: found
        for module, path in MODULES.items()
        if module != f"{ROOT}.core.file_names" and (found := output_file_names(path.read_text()))
    }
    assert offenders == {}
    assert output_file_names((PACKAGE / "core" / "file_names.py").read_text())


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


#: The packages of pytest_longctx by name: an import alias of one of these names that is not
#: that package (``from pytest_longctx.measure import point as measure``) hides it from a reader.
PACKAGES = {layer_of(module) for module in MODULES} - {"__init__", "plugin", "cli", "__main__"}


def shadowing_aliases(source: str) -> list[str]:
    """``import X as NAME`` where NAME is a package of pytest_longctx and X is not it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        base = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        for alias in node.names:
            if alias.asname not in PACKAGES:
                continue
            imported = f"{base}.{alias.name}" if base else alias.name
            if imported != f"{ROOT}.{alias.asname}":
                found.append(f"line {node.lineno}: {imported} as {alias.asname}")
    return found


def hand_built_spreads(source: str) -> list[str]:
    """A mean and its spread put together in place (``f"{mean} ± {std}"``, ``a + " ± " + b``)
    instead of by ``core.stats.format_mean_std``; a heading's "mean ± std" is words, not this."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for index, part in enumerate(parts):
                if not (isinstance(part, ast.Constant) and "±" in str(part.value)):
                    continue
                text = str(part.value)
                before = index > 0 and isinstance(parts[index - 1], ast.FormattedValue)
                after = index + 1 < len(parts) and isinstance(parts[index + 1], ast.FormattedValue)
                if (before and text.lstrip().startswith("±")) or (
                    after and text.rstrip().endswith("±")
                ):
                    found.append(f"line {node.lineno}: f-string")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and str(side.value).strip() == "±":
                    found.append(f"line {node.lineno}: concatenation")
    return found


def test_the_layout_rules_catch_what_they_are_about() -> None:
    assert shadowing_aliases("from pytest_longctx.measure import point as measure\n")
    assert shadowing_aliases("from pytest_longctx.session import server as serving\n")
    assert shadowing_aliases("import pytest_longctx.session.items as plan\n")
    assert not shadowing_aliases("from pytest_longctx import measure as measure\n")
    assert not shadowing_aliases("from pytest_longctx.session import items as sweep_items\n")
    assert hand_built_spreads('f"{_seconds(summary.mean)} ± {_seconds(summary.std)}"\n')
    assert hand_built_spreads('f"{mean:.3f} ± {std:.3f} s"\n')
    assert hand_built_spreads('mean + " ± " + std\n')
    assert not hand_built_spreads('f"Regression gate (mean ± std); {headline}"\n')
    assert not hand_built_spreads('"TTFT (s) mean ± std"\n')
    assert private_imports("from .noise import _mean\n")
    assert private_imports("from pytest_longctx.gate.noise import DEFAULT_LEVEL, _variance\n")
    assert not private_imports("from .noise import sample_mean, __all__\n")
    assert not private_imports("from os.path import _get_sep\n")
    assert output_file_names('PLOTS = ("compare_ttft.png", "compare_decode.png")\n')
    assert output_file_names('MEASURED_BY_FILE: str = "measured-by.json"\n')
    assert not output_file_names('def f():\n    return folder / "config.json"\n')


def test_no_import_alias_takes_a_packages_name() -> None:
    offenders = {
        module: found
        for module, path in MODULES.items()
        if (found := shadowing_aliases(path.read_text()))
    }
    assert offenders == {}


def test_a_mean_and_its_spread_are_written_by_the_one_formatter() -> None:
    offenders = {
        module: found
        for module, path in MODULES.items()
        if module != f"{ROOT}.core.stats" and (found := hand_built_spreads(path.read_text()))
    }
    assert offenders == {}
