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
    "rendering": {"core"},
    # Each workload's whole: its points, server, measurement, record and report sections.
    "workloads": {
        "core",
        "client",
        "prompts",
        "profiles",
        "capacity",
        "plan",
        "measure",
        "rendering",
    },
    # The gate: it iterates the registered workloads' metrics.
    "gate": {"core", "workloads"},
    # The report shell: it iterates the registered workloads' sections.
    "reporting": {"core", "capacity", "gate", "progress", "rendering", "workloads"},
    "campaign": {
        "core",
        "client",
        "prompts",
        "profiles",
        "capacity",
        "plan",
        "measure",
        "serving",
        "progress",
        "gate",
        "workloads",
    },
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


def test_the_campaign_runs_without_pytest() -> None:
    """The campaign (its state, the server's lifecycle, a point's setup, measurement and
    judgement) imports neither pytest nor the pytest layer, directly or through what it
    imports: the session layer drives it, and a test drives it with fakes."""
    import subprocess
    import sys

    campaign = sorted(module for module in MODULES if layer_of(module) == "campaign")
    direct = [
        module
        for module in campaign
        if any(
            name.split(".")[0] in ("pytest", "_pytest")
            for name in third_party_imports(MODULES[module])
        )
    ]
    assert campaign and direct == []
    script = (
        "import sys\n"
        "sys.modules['pytest'] = sys.modules['_pytest'] = None\n"
        "import importlib\n"
        f"for name in {campaign!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pytest_longctx.session', "
        "'pytest_longctx.plugin')) or m.split('.')[0] in ('pytest', '_pytest') and "
        "sys.modules[m] is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


#: Where each workload lives: its folder (workloads/<name>/) and the registry that lists them
#: (workloads/__init__.py).
WORKLOAD_HOMES = f"{ROOT}.workloads"
#: Attributes that say what kind of point, plan or record something is.
WORKLOAD_ATTRIBUTES = {"warm", "interference", "concurrent", "concurrency", "cold"}
#: The workloads' names, as a string says them.
WORKLOAD_NAMES = {"cold", "warm", "interference", "concurrency"}
#: The constants that name a workload or its mark.
WORKLOAD_CONSTANTS = {name.upper() for name in WORKLOAD_NAMES} | {
    f"{name.upper()}_MARK" for name in WORKLOAD_NAMES
}
#: What may still name a workload outside its folder and the registry, and why: the names and
#: each workload's settings are defined in the plan (``plan/points.py``, below the workloads)
#: and parsed by the options' table; the records' core reads its workload sections by name;
#: a gated metric reads cold points unless its workload says otherwise (``core/metrics.py``);
#: the benchmark JSON, the depth map and request timing key their tables by workload; the
#: budgets read a point's workload. Each line moved into a workload's folder lowers this count.
MOST_WORKLOAD_NAMINGS_OUTSIDE_HOMES = 73


def workload_attribute_tests(path: Path) -> list[int]:
    """Lines of ``path`` whose truth value is a workload attribute (``point.warm``,
    ``plan.interference``, ``not record.warm``, ``any(p.concurrent for p in ...)``)."""

    def tests_an_attribute(node: ast.AST) -> bool:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return tests_an_attribute(node.operand)
        if isinstance(node, ast.BoolOp):
            return any(tests_an_attribute(value) for value in node.values)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("any", "all"):
            return any(
                tests_an_attribute(getattr(arg, "elt", arg))
                or any(tests_an_attribute(i) for g in getattr(arg, "generators", ()) for i in g.ifs)
                for arg in node.args
            )
        return isinstance(node, ast.Attribute) and node.attr in WORKLOAD_ATTRIBUTES

    truths: list[ast.AST] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            truths.append(node.test)
        elif isinstance(node, ast.comprehension):
            truths += node.ifs
        elif isinstance(node, ast.BoolOp):
            truths += node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            truths.append(node.operand)
    return sorted({node.lineno for node in truths if tests_an_attribute(node)})


def workload_namings(path: Path) -> list[int]:
    """Lines of ``path`` that name a workload: a test of a workload attribute (above), a string
    that is a workload's name (``cache_state == "warm"``, a table keyed ``"interference"``) or a
    constant that names one or its mark (``WARM in settings.workload``, an import of
    ``CONCURRENCY``)."""
    found = set(workload_attribute_tests(path))

    def names_one(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in WORKLOAD_NAMES
        if isinstance(node, ast.ImportFrom):
            return any((alias.asname or alias.name) in WORKLOAD_CONSTANTS for alias in node.names)
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        return name in WORKLOAD_CONSTANTS

    found |= {node.lineno for node in ast.walk(ast.parse(path.read_text())) if names_one(node)}
    return sorted(found)


def test_outside_their_homes_workloads_are_not_named() -> None:
    """The session, the campaign, the server and the reports ask a point's or a record's
    workload (``workloads.workload_of``, ``workloads.report_sections``) what it needs; only the
    counted lines outside the workloads' folders and the registry name one."""
    found = {
        module: lines
        for module, path in MODULES.items()
        if not module.startswith(WORKLOAD_HOMES) and (lines := workload_namings(path))
    }
    count = sum(len(lines) for lines in found.values())
    assert count <= MOST_WORKLOAD_NAMINGS_OUTSIDE_HOMES, found


def test_the_workload_rule_catches_what_it_is_about(tmp_path: Path) -> None:
    source = tmp_path / "dispatch.py"
    source.write_text(
        "def measure(point, plan, records):\n"
        "    if point.interference:\n"
        "        return 1\n"
        "    cold = [r for r in records if not r.warm]\n"
        "    return 2 if plan.concurrency and any(p.concurrent for p in cold) else 3\n"
        "    return workload_of(point).measure(point)\n"
    )
    assert workload_attribute_tests(source) == [2, 4, 5]
    source.write_text(
        "from pytest_longctx.plan.points import WARM, Point\n"
        "def measure(point, record, settings):\n"
        "    if record.cache_state == 'interference':\n"
        "        return 1\n"
        "    if WARM in settings.workload:\n"
        "        return 2\n"
        "    marks = {points.CONCURRENCY_MARK: 3}\n"
        "    return 'a warm question' if point.warm else workload_of(point).name\n"
    )
    assert workload_namings(source) == [1, 3, 5, 7, 8]


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
#: Files the package writes outside a session (the embedded model's build marker) or ships and
#: only reads (the release table's published serve options).
NOT_SESSION_OUTPUTS = {".pytest-longctx-build.json", "vllm_serve_options.json"}


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


def test_every_public_name_imports_in_a_python_without_pytest() -> None:
    """Outside a pytest session (a script reading records, the docs build) nothing has
    imported the plugin's modules ahead: each public name still loads."""
    import subprocess
    import sys

    script = (
        "import sys, pytest_longctx\n"
        "for name in pytest_longctx.__all__: getattr(pytest_longctx, name)\n"
        "print('plugin' if 'pytest_longctx.plugin' in sys.modules else 'no plugin')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no plugin"


#: The packages of pytest_longctx by name: an import alias of one of these names that is not
#: that package (``from pytest_longctx.measure import measurement as measure``) hides it from a
#: reader.
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
    assert shadowing_aliases("from pytest_longctx.measure import measurement as measure\n")
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


#: A session's state objects: the mutable classes of the session layer and the campaign. Each
#: holds at most a dozen fields and is written from at most three modules, so its owner is
#: plain to see.
STATE_PACKAGES = {"session", "campaign"}
MAX_STATE_FIELDS = 12
MAX_STATE_WRITERS = 3
#: Calls that change a list, dict or set in place.
MUTATING_METHODS = {
    "append",
    "extend",
    "insert",
    "update",
    "add",
    "pop",
    "popitem",
    "clear",
    "setdefault",
    "discard",
    "remove",
}


def _is_frozen_dataclass(node: ast.ClassDef) -> bool:
    return any(
        isinstance(decorator, ast.Call)
        and any(
            keyword.arg == "frozen" and getattr(keyword.value, "value", False)
            for keyword in decorator.keywords
        )
        for decorator in node.decorator_list
    )


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    return {node.id for node in ast.walk(annotation) if isinstance(node, ast.Name)}


def state_classes(sources: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """The mutable classes of ``sources`` (module -> text): class -> field -> the names in its
    annotation. Fields: a dataclass's annotated class attributes and every ``self.x``
    assigned in a method; exceptions, protocols and frozen dataclasses hold no state."""
    classes: dict[str, dict[str, set[str]]] = {}
    for source in sources.values():
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef) or _is_frozen_dataclass(node):
                continue
            bases = {getattr(base, "id", getattr(base, "attr", "")) for base in node.bases}
            if bases & {"Protocol", "Exception", "ValueError"} or any(
                name.endswith(("Error", "Failure", "Exception")) for name in bases
            ):
                continue
            fields: dict[str, set[str]] = {}
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    fields[statement.target.id] = _annotation_names(statement.annotation)
            for inner in ast.walk(node):
                targets: list[ast.expr] = []
                if isinstance(inner, ast.Assign):
                    targets = inner.targets
                elif isinstance(inner, (ast.AnnAssign, ast.AugAssign)):
                    targets = [inner.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        annotation = getattr(inner, "annotation", None)
                        fields.setdefault(target.attr, set()).update(_annotation_names(annotation))
            classes[node.name] = fields
    return classes


def state_writes(sources: dict[str, str]) -> dict[str, dict[str, int]]:
    """Where each state class of ``sources`` is written: class -> module -> sites.

    A site assigns a field (``run.f = ...``, ``run.f[k] = ...``, ``run.f += ...``, ``del
    run.f[k]``) or changes
    one in place (``run.f.append(...)`` and the like, unless the field is itself a state
    object, whose own methods are its writers). The object written is known by name: ``self``
    in its class's methods, a parameter or attribute annotated with its class anywhere in
    ``sources`` (``run: Run``, ``lifecycle: ServerLifecycle``), and the attributes that hold one
    (``self.run = run``, a field annotated with it)."""
    classes = state_classes(sources)
    names: dict[str, str] = {}  # a variable's or attribute's name -> the state class it holds
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    for name in _annotation_names(arg.annotation) & set(classes):
                        names.setdefault(arg.arg, name)
    for fields in classes.values():
        for field, annotation in fields.items():
            for name in annotation & set(classes):
                names.setdefault(field, name)

    def class_of(node: ast.expr, owner: str | None) -> str | None:
        if isinstance(node, ast.Name):
            return owner if node.id == "self" and owner else names.get(node.id)
        if isinstance(node, ast.Attribute):
            return names.get(node.attr) if class_of(node.value, owner) else None
        return None

    writes: dict[str, dict[str, int]] = {}

    def note(target: ast.expr, owner: str | None, module: str, in_place: bool) -> None:
        while isinstance(target, ast.Subscript):
            target = target.value
        if not isinstance(target, ast.Attribute):
            return
        written = class_of(target.value, owner)
        if written is None or target.attr not in classes[written]:
            return
        if in_place and classes[written][target.attr] & set(classes):
            return  # a state object's own method: counted where that method is
        counts = writes.setdefault(written, {})
        counts[module] = counts.get(module, 0) + 1

    def visit(node: ast.AST, owner: str | None, module: str) -> None:
        if isinstance(node, ast.ClassDef):
            owner = node.name if node.name in classes else owner
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                    note(part, owner, module, in_place=False)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and (
            not isinstance(node, ast.AnnAssign) or node.value is not None
        ):
            note(node.target, owner, module, in_place=False)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                note(target, owner, module, in_place=False)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATING_METHODS
        ):
            note(node.func.value, owner, module, in_place=True)
        for child in ast.iter_child_nodes(node):
            visit(child, owner, module)

    for module, source in sources.items():
        visit(ast.parse(source), None, module)
    return writes


def session_sources() -> dict[str, str]:
    return {
        module: path.read_text()
        for module, path in MODULES.items()
        if layer_of(module) in STATE_PACKAGES
    }


def test_each_session_state_object_is_small_and_has_few_writers() -> None:
    """No state object of the session layer or the campaign holds more than a dozen fields or
    is written from more than three modules: each piece of state has an owner a reader can
    find."""
    sources = session_sources()
    too_big = {
        name: len(fields)
        for name, fields in state_classes(sources).items()
        if len(fields) > MAX_STATE_FIELDS
    }
    too_shared = {
        name: sorted(modules)
        for name, modules in state_writes(sources).items()
        if len(modules) > MAX_STATE_WRITERS
    }
    assert (too_big, too_shared) == ({}, {})


def test_the_state_rules_catch_what_they_are_about() -> None:
    owner = (
        "from dataclasses import dataclass, field\n"
        "@dataclass\nclass Bag:\n    a: int = 0\n    b: list = field(default_factory=list)\n"
        "    def reset(self) -> None:\n        self.a = 0\n"
        "@dataclass\nclass Holder:\n    bag: Bag\n"
        "@dataclass(frozen=True)\nclass Fixed:\n    a: int\n"
    )
    one = "def f(bag: Bag) -> None:\n    bag.a = 1\n"
    two = "def g(holder: Holder) -> None:\n    holder.bag.b.append(2)\n    holder.bag.reset()\n"
    three = "def h(bag) -> None:\n    bag.b[0] = 3\n    bag.a += 1\n    del bag.b[0]\n"
    sources = {"m.owner": owner, "m.one": one, "m.two": two, "m.three": three}
    assert set(state_classes(sources)) == {"Bag", "Holder"}
    assert state_classes(sources)["Bag"].keys() == {"a", "b"}
    assert state_writes(sources) == {"Bag": {"m.owner": 1, "m.one": 1, "m.two": 1, "m.three": 3}}
    assert state_writes({**sources, "m.four": "def k(x: Holder):\n    x.bag = Bag()\n"})[
        "Holder"
    ] == {"m.four": 1}


# -- the tests, laid out like the package ------------------------------------------------------

#: The tests' root: ``unit/<package or module>/``, ``e2e/``, ``support/`` and the conftest.
TESTS = Path(__file__).resolve().parents[2]
#: At the tests' root besides the folders: the conftest, and the worked example a user copies
#: (the sweep, ``pytest`` at the repository's root runs it).
TESTS_AT_THE_ROOT = {Path("conftest.py"), Path("test_sweep.py")}
#: ``tests/unit/`` folders named after no module: the repository as a whole.
UNIT_BESIDES_MODULES = {"project"}


def unit_folders() -> set[str]:
    """A unit folder per package, and per top-level module (``plugin``, ``cli``)."""
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    modules = {path.stem for path in PACKAGE.glob("*.py") if not path.stem.startswith("__")}
    return packages | modules | UNIT_BESIDES_MODULES


def asks_for_a_real_server(path: Path, fixtures: set[str]) -> list[str]:
    """What in a test file asks for real vLLM: a real server's fixture taken by any of its
    functions (tests and fixtures alike), or the ``vllm`` mark."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{node.name}({a.arg})" for a in arguments if a.arg in fixtures]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "vllm"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
        ):
            found.append("pytest.mark.vllm")
    return found


def test_the_tests_are_laid_out_like_the_package() -> None:
    """A module's tests are found from its name: every test file under ``unit/<package>/``
    (needing no real server) or ``e2e/`` (real vLLM; the worked example, the sweep, at the
    root), the helpers only under ``support/``, no
    two files of one name (pytest imports each by its name alone) and no ``__init__.py``."""
    from server_pool import FIXTURES  # tests/support: the real servers' fixtures

    real_servers = {*FIXTURES, "longctx_server"}
    folders = unit_folders()
    misplaced, real_in_unit, names = [], {}, {}
    for path in sorted(TESTS.rglob("*")):
        relative = path.relative_to(TESTS)
        if path.is_dir() or "__pycache__" in relative.parts or relative in TESTS_AT_THE_ROOT:
            continue
        names.setdefault(path.name, []).append(str(relative))
        where = relative.parts
        if path.name.startswith("test_") and path.suffix == ".py":
            if where[0] == "unit" and len(where) == 3 and where[1] in folders:
                if found := asks_for_a_real_server(path, real_servers):
                    real_in_unit[str(relative)] = found
            elif where[0] != "e2e" or len(where) != 2:
                misplaced.append(str(relative))
        elif where[0] != "support" or path.name == "__init__.py":
            misplaced.append(str(relative))
    same_name = {n: p for n, p in names.items() if len(p) > 1 and n.endswith(".py")}
    assert (misplaced, real_in_unit, same_name) == ([], {}, {})
    assert set(names) >= {"longctx_testing.py", "test_package_layout.py", "test_e2e_warm.py"}
    assert all((TESTS / path).is_file() for path in TESTS_AT_THE_ROOT)
