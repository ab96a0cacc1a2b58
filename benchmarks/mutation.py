"""Mutation testing of the measurement core: which small changes does no test notice?

Each mutant changes one operator or constant in one function of the core (the client's timing
and counting, stats, timeouts, sizes), in a copy of the repository, and runs the fast tests
that cover that module; a mutant that every test passes "survives". Operators: comparisons
(``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``is``/``in`` and their negations),
arithmetic (``+``/``-``, ``*``/``/``, ``**`` to ``*``), ``and``/``or``, ``not`` dropped, and
integer constants plus one.

    .venv/bin/python benchmarks/mutation.py                  # every target (tens of minutes)
    .venv/bin/python benchmarks/mutation.py --only sizes,stats
    .venv/bin/python benchmarks/mutation.py --list           # the mutants, run nothing

The working tree is never touched: mutants live in a temporary copy.
"""

from __future__ import annotations

import argparse
import ast
import copy
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"

#: Where each target's code lives, under pytest_longctx/.
FILES: dict[str, tuple[str, ...]] = {
    "client": (
        "client/result.py",
        "client/client.py",
    ),
    "stats": ("core/stats.py",),
    "timeouts": ("measure/timeouts.py",),
    "sizes": ("core/sizes.py",),
}

#: module -> (functions to mutate, None for all; the fast tests that cover it)
TARGETS: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "client": (
        (
            "_choice_tokens",
            "summarize_stream",
            "quantile",
            "_handle_event",
            "_finish",
            "measure",
            "_read_stream",
            "_preconnect",
            "open",
            "connect_tcp",
            "discard",
            "start",
            "extend",
            "_run",
            "feed",
        ),
        ("tests/test_client.py", "tests/test_accuracy.py"),
    ),
    "stats": (
        None,
        (
            "tests/test_reports.py::test_mean_sample_std_and_cv_match_hand_computation",
            "tests/test_reports.py::test_single_value_has_zero_std_and_empty_sample_is_refused",
            "tests/test_reports.py::test_summaries_are_sorted_by_length_with_outcome_counts_and_reasons",
            "tests/test_reports.py::test_summarize_accepts_any_figure_name",
        ),
    ),
    "timeouts": (None, ("tests/test_client.py", "-k", "budget")),
    "sizes": (
        None,
        ("tests/test_selection.py", "tests/test_client.py", "-k", "parse_size or powers or sizes"),
    ),
}

_COMPARE = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINARY = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.Pow: ast.Mult,
}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    module: str
    file: str  # under pytest_longctx/
    function: str
    line: int
    description: str
    source: str  # the whole mutated module


def _sites(node: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, what the mutation does) for every mutable spot under ``node``."""
    sites = []
    for child in ast.walk(node):
        if isinstance(child, ast.Compare):
            for index, op in enumerate(child.ops):
                if type(op) in _COMPARE:
                    sites.append((child, f"cmp:{index}"))
        elif isinstance(child, ast.BinOp) and type(child.op) in _BINARY:
            sites.append((child, "bin"))
        elif isinstance(child, ast.BoolOp):
            sites.append((child, "bool"))
        elif isinstance(child, ast.UnaryOp) and isinstance(child.op, ast.Not):
            sites.append((child, "not"))
        elif (
            isinstance(child, ast.Constant)
            and isinstance(child.value, int)
            and not isinstance(child.value, bool)
        ):
            sites.append((child, "const"))
    return sites


def _mutate(tree: ast.Module, target: ast.AST, kind: str) -> str:
    """Apply one mutation to ``target`` (a node of ``tree``); describes it."""
    if kind.startswith("cmp:"):
        index = int(kind[4:])
        old = target.ops[index]  # type: ignore[attr-defined]
        target.ops[index] = _COMPARE[type(old)]()  # type: ignore[attr-defined]
        return f"{type(old).__name__} -> {type(target.ops[index]).__name__}"  # type: ignore[attr-defined]
    if kind == "bin":
        old = target.op  # type: ignore[attr-defined]
        target.op = _BINARY[type(old)]()  # type: ignore[attr-defined]
        return f"{type(old).__name__} -> {type(target.op).__name__}"  # type: ignore[attr-defined]
    if kind == "bool":
        old = target.op  # type: ignore[attr-defined]
        target.op = _BOOL[type(old)]()  # type: ignore[attr-defined]
        return f"{type(old).__name__} -> {type(target.op).__name__}"  # type: ignore[attr-defined]
    if kind == "not":
        parent = _parent_of(tree, target)
        for field, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, field, target.operand)  # type: ignore[attr-defined]
            elif isinstance(value, list):
                for position, item in enumerate(value):
                    if item is target:
                        value[position] = target.operand  # type: ignore[attr-defined]
        return "not dropped"
    old_value = target.value  # type: ignore[attr-defined]
    target.value = old_value + 1  # type: ignore[attr-defined]
    return f"{old_value} -> {old_value + 1}"


def _parent_of(tree: ast.AST, target: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if child is target:
                return node
    raise LookupError("node without parent")


def _functions(tree: ast.Module, names: tuple[str, ...] | None) -> list[ast.FunctionDef]:
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and (names is None or node.name in names)
    ]
    return sorted(found, key=lambda node: node.lineno)


def mutants(module: str, only_functions: tuple[str, ...] = ()) -> list[Mutant]:
    names, _ = TARGETS[module]
    if only_functions:
        names = tuple(n for n in (names or only_functions) if n in only_functions)
    result = []
    for file in FILES[module]:
        result += _file_mutants(module, file, names)
    return result


def _file_mutants(module: str, file: str, names: tuple[str, ...] | None) -> list[Mutant]:
    pristine = ast.parse((ROOT / "pytest_longctx" / file).read_text())
    result = []
    for function in _functions(pristine, names):
        for site_index, (node, _kind) in enumerate(_sites(function)):
            if _in_docstring_or_annotation(function, node):
                continue
            tree = copy.deepcopy(pristine)
            twin = _functions(tree, (function.name,))
            twin_function = next(f for f in twin if f.lineno == function.lineno)
            twin_node, twin_kind = _sites(twin_function)[site_index]
            description = _mutate(tree, twin_node, twin_kind)
            line = getattr(node, "lineno", function.lineno)
            result.append(
                Mutant(module, file, function.name, line, description, ast.unparse(tree) + "\n")
            )
    return result


def _in_docstring_or_annotation(function: ast.FunctionDef, node: ast.AST) -> bool:
    annotations = [a.annotation for a in function.args.args if a.annotation is not None]
    if function.returns is not None:
        annotations.append(function.returns)
    return any(node is sub for a in annotations for sub in ast.walk(a))


def _copy_repository(destination: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "reports", "mutants", "__pycache__", "*.egg-info", ".ruff_cache"
    )
    shutil.copytree(ROOT, destination, ignore=ignore, dirs_exist_ok=True)


def run(selected: list[str], timeout_s: float, functions: tuple[str, ...] = ()) -> int:
    survivors: list[Mutant] = []
    total = killed = 0
    with tempfile.TemporaryDirectory(prefix="longctx-mutation-") as scratch:
        work = Path(scratch) / "repo"
        _copy_repository(work)
        for module in selected:
            _, tests = TARGETS[module]
            module_mutants = mutants(module, functions)
            started = time.perf_counter()
            print(f"== {module}: {len(module_mutants)} mutants, tests: {' '.join(tests)}")
            for mutant in module_mutants:
                path = work / "pytest_longctx" / mutant.file
                original = path.read_text()
                path.write_text(mutant.source)
                try:
                    outcome = subprocess.run(
                        [
                            str(PYTHON),
                            "-m",
                            "pytest",
                            "-p",
                            "no:cacheprovider",
                            "-x",
                            "-q",
                            "--no-header",
                            "-o",
                            "addopts=",
                            *tests,
                        ],
                        cwd=work,
                        capture_output=True,
                        timeout=timeout_s,
                    ).returncode
                except subprocess.TimeoutExpired:
                    outcome = -1  # a hang is noticed too
                finally:
                    path.write_text(original)
                total += 1
                if outcome == 0:
                    survivors.append(mutant)
                    print(
                        f"   SURVIVED {module}.{mutant.function}:{mutant.line} "
                        f"{mutant.description}",
                        flush=True,
                    )
                else:
                    killed += 1
            print(f"   {module}: {time.perf_counter() - started:.0f} s", flush=True)
    print(f"\n{killed} of {total} mutants killed, {len(survivors)} survived")
    return 1 if survivors else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated modules")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per mutant")
    parser.add_argument("--functions", default="", help="comma-separated: only these functions")
    args = parser.parse_args()
    selected = [name for name in args.only.split(",") if name]
    unknown = set(selected) - set(TARGETS)
    if unknown:
        raise SystemExit(f"unknown module(s): {', '.join(sorted(unknown))}; known: {list(TARGETS)}")
    functions = tuple(name for name in args.functions.split(",") if name)
    if args.list:
        for module in selected:
            for mutant in mutants(module, functions):
                print(f"{module}.{mutant.function}:{mutant.line} {mutant.description}")
        return
    sys.exit(run(selected, args.timeout, functions))


if __name__ == "__main__":
    main()
