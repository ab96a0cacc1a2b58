"""Mutation testing of the rules: which small change to a rule does no test notice?

Each mutant changes one operator or constant in one function of a target (or one of the
target's module constants), in a copy of the repository, and runs that target's own fast unit
tests (no real server); a mutant that every test passes "survives". Operators: comparisons
(``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``is``/``in`` and their negations),
arithmetic (``+``/``-``, ``*``/``/``, ``**`` to ``*``), ``and``/``or``, ``not`` dropped;
constants: an integer plus one, a float threshold doubled and halved. What only a message
shows (inside an f-string) is not a rule and is not mutated.

Before any mutant, a target's tests run unmutated: if they fail, nothing is judged. A mutant
the tests fail is run again: killed only when they fail twice (a flaky test kills nothing; a
mutant they fail once is reported as flaky). Survivors are compared with the committed list of
equivalent mutants (``mutation_equivalents.toml``: mutants the program behaves the same with,
each with why); an unlisted survivor, a flaky one, or a listed mutant no longer made or now
killed fails the run.

    .venv/bin/python benchmarks/mutation.py                      # every target (tens of minutes)
    .venv/bin/python benchmarks/mutation.py --only agreement,scheduling
    .venv/bin/python benchmarks/mutation.py --list               # the mutants, run nothing

The working tree is never touched: mutants live in a temporary copy. Each test run is a fork
of one process that imported pytest and the libraries already (not the package, which each
run imports from the copy, mutant included), so a run costs its tests, not a Python start.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import importlib.util
import os
import pkgutil
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")
PACKAGE = "pytest_longctx"


@dataclass(frozen=True)
class Part:
    """What to mutate in one file under pytest_longctx/."""

    file: str
    #: Functions and methods by name (a nested function goes with the one it is in); None: all.
    functions: tuple[str, ...] | None
    #: Module-level numeric constants (thresholds) mutated too.
    constants: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    parts: tuple[Part, ...]
    #: pytest arguments: the target's own fast tests.
    tests: tuple[str, ...]


def _tests(path: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{path}::{name}" for name in names)


TARGETS: dict[str, Target] = {
    "client": Target(
        (
            Part("client/result.py", ("summarize_stream", "quantile")),
            Part(
                "client/client.py",
                (
                    "_choice_tokens",
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
            ),
        ),
        (
            "tests/unit/client/test_client.py",
            "tests/unit/client/test_accuracy.py",
            "tests/unit/client/test_keepalive.py",
            "tests/unit/client/test_stream_rules.py",
        ),
    ),
    # the client's chunk and interval rules: what a chunk's count says of the stream
    "stream_rules": Target(
        (
            Part(
                "client/result.py",
                (
                    "stream_tokens",
                    "counts_exact",
                    "per_token",
                    "chunk_gaps_s",
                    "coalesced_chunks",
                    "chunk_token_counts",
                    "stream_interval",
                    "chunking",
                    "chunk_figures",
                    "infer_stream_interval",
                    "inter_token_gaps",
                ),
            ),
        ),
        (
            *_tests(
                "tests/unit/client/test_client.py",
                "test_inter_token_latencies_leave_out_chunks_a_stream_interval_1_server_coalesced",
                "test_the_stream_interval_divides_every_chunk_between_the_first_and_the_last",
                "test_chunk_counts_come_from_the_running_usage_count_when_every_chunk_has_one",
            ),
            "tests/unit/client/test_stream_rules.py",
        ),
    ),
    # the stream against the server's decode: bursts and rate
    "agreement": Target(
        (
            Part(
                "measure/agreement.py",
                ("largest_burst", "judge_stream"),
                (
                    "DEFAULT_STREAM_TOLERANCE",
                    "BURST_FACTOR",
                    "MIN_BURST_TOKENS",
                    "MIN_DISAGREEMENT_S",
                ),
            ),
        ),
        ("tests/unit/measure/test_stream_agreement.py",),
    ),
    # an interference point's windows, gaps, stall count and the server's histogram
    "interference": Target(
        (
            Part(
                "workloads/interference/windows.py",
                (
                    "window_of",
                    "span",
                    "seconds",
                    "of",
                    "figures",
                    "counted_s",
                    "background_view",
                    "_during",
                    "_top_bucket",
                    "check_server_itl",
                    "hold_any_of",
                    "check_background_requests",
                ),
            ),
        ),
        _tests(
            "tests/unit/measure/test_interference.py",
            "test_a_gap_belongs_to_the_window_its_midpoint_lies_in",
            "test_a_stalled_prefill_has_no_background_token_inside_it",
            "test_a_chunked_prefill_lets_every_stream_through_each_step",
            "test_the_servers_inter_token_histogram_confirms_or_refutes_the_streams",
            "test_a_longest_gap_outside_the_servers_top_bucket_refutes_the_streams",
            "test_the_windows_are_half_open_and_the_decode_closed",
            "test_a_windows_gap_statistics",
            "test_tokens_count_in_the_window_they_arrived_in_and_waits_in_their_requests",
            "test_the_stall_count_needs_a_prefill_longer_than_the_longest_idle_gap",
            "test_tokens_during_the_prefill_are_counted_from_the_first_slowed_gap",
            "test_the_servers_histogram_is_read_between_the_two_reads",
            "test_the_sums_disagree_beyond_the_tolerance_of_the_servers_and_not_at_it",
            "test_the_chunk_comes_from_the_servers_config_or_the_streams",
            "test_background_requests_are_checked_against_the_servers_timing_of_each",
            "test_a_request_is_judged_where_a_window_holds_it_and_at_the_rules_edges",
            "test_only_a_gap_the_figures_read_is_held_to_the_servers_top_bucket",
        ),
    ),
    # the gate's verdict per length and metric (what only its messages show is not mutated)
    "verdicts": Target(
        (
            Part(
                "gate/verdicts.py",
                (
                    "of",
                    "of_sessions",
                    "regressed",
                    "for_length",
                    "improved",
                    "missing_in_current",
                    "missing_in_baseline",
                    "passed",
                    "_with_status",
                    "session_key",
                    "session_count",
                    "compare",
                    "compare_length",
                    "_with_answers",
                    "passed_by_length",
                    "_judge_length",
                    "_figure_values",
                    "session_values",
                    "_judge_levels",
                    "_judge_metric",
                    "_stream_set_aside",
                    "_decode_source",
                    "_burst",
                    "_merged",
                    "_why_not_compared",
                    "_chunked_stream",
                    "_noise_test_for",
                    "_status_and_message",
                ),
            ),
        ),
        (
            "tests/unit/gate/test_gate.py",
            "tests/unit/measure/test_concurrency.py::test_the_gate_compares_each_levels_aggregate_with_the_same_levels",
            "tests/unit/measure/test_warm_contract.py::test_the_gate_compares_warm_points_with_warm_baseline_points_only",
        ),
    ),
    # longest points first over pytest-xdist workers, and the hand-back of a lost worker's
    "scheduling": Target(
        (Part("session/scheduling.py", None, ("ITEMS_PER_WORKER",)),),
        _tests(
            "tests/unit/session/test_distributed.py",
            "test_the_longest_points_go_first_to_every_worker",
            "test_cold_points_go_out_with_their_follow_ups_then_interference_then_concurrency",
            "test_items_alone_are_a_unit_each",
            "test_a_session_without_sweep_points_is_scheduled_as_xdist_schedules_it",
            "test_no_worker_finishes_while_a_lost_one_holds_points_it_hands_back",
            "test_no_worker_finishes_while_one_whose_server_crashed_may_hand_points_back",
            "test_a_point_no_worker_can_take_is_refused_and_the_lost_worker_gets_the_rest",
            "test_a_handed_point_no_worker_can_take_is_recorded_as_not_measured",
            "test_a_dead_workers_queue_goes_back_before_the_gate_items",
            "test_a_dead_workers_points_go_back_in_cost_order",
            "test_a_worker_out_of_points_waits_while_another_holds_points_beyond_the_one_it_runs",
            "test_an_idle_worker_waits_for_the_point_another_runs_and_finishes_after_it",
            "test_workers_that_each_hold_their_last_point_are_each_told_to_finish",
        ),
    ),
    "stats": Target(
        (Part("core/stats.py", None),),
        (
            *_tests(
                "tests/unit/reporting/test_reports.py",
                "test_mean_sample_std_and_cv_match_hand_computation",
                "test_single_value_has_zero_std_and_empty_sample_is_refused",
                "test_summaries_are_sorted_by_length_with_outcome_counts_and_reasons",
                "test_summarize_accepts_any_figure_name",
            ),
            "tests/unit/core/test_stats.py",
        ),
    ),
    # the first-token budget: from this run's records, a TTFT model, the profile's expected
    # figures, the default
    "timeouts": Target(
        (Part("measure/timeouts.py", None),),
        (
            *_tests(
                "tests/unit/client/test_client.py",
                "test_budget_override_wins",
                "test_budget_default_when_nothing_below",
                "test_budget_extrapolates_quadratically",
                "test_a_concurrency_levels_budget_covers_each_request_waiting_for_the_others",
                "test_budget_floor_and_bad_values",
                "test_budget_bounds_and_unusable_bases",
                "test_a_first_token_budget_must_be_positive",
            ),
            "tests/unit/campaign/test_budgets.py",
        ),
    ),
    "sizes": Target(
        (Part("core/sizes.py", None),),
        (
            "tests/unit/session/test_selection.py",
            "tests/unit/client/test_client.py",
            "-k",
            "parse_size or powers or sizes",
        ),
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
#: What a float constant is multiplied by: a threshold twice as far, and half as far.
_SCALES = (2.0, 0.5)


@dataclass(frozen=True)
class Mutant:
    target: str
    file: str  # under pytest_longctx/
    function: str  # Class.method, function, or a module constant's name
    line: int
    #: The original line the mutated node starts on: with the description, the mutant's name
    #: in the list of equivalents (line numbers move with every edit).
    line_text: str
    description: str
    occurrence: int  # 1, or n for the n-th mutant of the same kind on the same line
    source: str  # the whole mutated module

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.target, self.function, self.description, self.line_text, self.occurrence)

    def name(self) -> str:
        again = f" (#{self.occurrence})" if self.occurrence > 1 else ""
        return f"{self.target}.{self.function}:{self.line} {self.description}{again}"


def _skipped_nodes(scope: ast.AST) -> set[int]:
    """Nodes not mutated: annotations, and what only a message shows (f-strings)."""
    skipped: set[int] = set()
    for node in ast.walk(scope):
        roots: list[ast.AST] = []
        if isinstance(node, ast.JoinedStr):
            roots.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots += [a.annotation for a in _arguments(node.args) if a.annotation is not None]
            if node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            skipped.update(id(sub) for sub in ast.walk(root))
    return skipped


def _arguments(args: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def _sites(scope: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, what the mutation does) for every mutable spot under ``scope``."""
    skipped = _skipped_nodes(scope)
    sites: list[tuple[ast.AST, str]] = []
    for child in ast.walk(scope):
        if id(child) in skipped:
            continue
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
        elif isinstance(child, ast.Constant) and not isinstance(child.value, bool):
            if isinstance(child.value, int):
                sites.append((child, "const"))
            elif isinstance(child.value, float) and child.value != 0.0:
                sites += [(child, f"scale:{scale}") for scale in _SCALES]
    return sites


def _mutate(tree: ast.Module, target: ast.AST, kind: str) -> str:
    """Apply one mutation to ``target`` (a node of ``tree``); describes it."""
    if kind.startswith("cmp:"):
        index = int(kind[4:])
        old = target.ops[index]  # type: ignore[attr-defined]
        target.ops[index] = _COMPARE[type(old)]()  # type: ignore[attr-defined]
        return f"{type(old).__name__} -> {type(target.ops[index]).__name__}"  # type: ignore[attr-defined]
    if kind in ("bin", "bool"):
        old = target.op  # type: ignore[attr-defined]
        target.op = (_BINARY if kind == "bin" else _BOOL)[type(old)]()  # type: ignore[attr-defined]
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
    if kind.startswith("scale:"):
        target.value = old_value * float(kind[6:])  # type: ignore[attr-defined]
        return f"{old_value!r} -> {target.value!r}"  # type: ignore[attr-defined]
    target.value = old_value + 1  # type: ignore[attr-defined]
    return f"{old_value} -> {old_value + 1}"


def _parent_of(tree: ast.AST, target: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if child is target:
                return node
    raise LookupError("node without parent")


def _scopes(tree: ast.Module, part: Part) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of each function, method and constant of ``part``, in order."""
    found: list[tuple[str, ast.AST]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                part.functions is None or node.name in part.functions
            ):
                found.append((f"{prefix}{node.name}", node))

    visit(tree.body, "")
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if any(name in part.constants for name in names):
            found.append((names[0], node.value))
    return found


def _code_of(line: str) -> str:
    """A line as it names a mutant: stripped, without an inline comment (``  # ...``)."""
    return line.split("  # ", 1)[0].strip()


def mutants(target: str, only_functions: tuple[str, ...] = ()) -> list[Mutant]:
    result: list[Mutant] = []
    for part in TARGETS[target].parts:
        result += _part_mutants(target, part, only_functions)
    return result


def _part_mutants(target: str, part: Part, only_functions: tuple[str, ...]) -> list[Mutant]:
    text = (ROOT / PACKAGE / part.file).read_text()
    lines = text.splitlines()
    pristine = ast.parse(text)
    result: list[Mutant] = []
    seen: Counter[tuple[str, str, str]] = Counter()
    for position, (name, scope) in enumerate(_scopes(pristine, part)):
        if only_functions and name.split(".")[-1] not in only_functions:
            continue
        for site_index, (node, _kind) in enumerate(_sites(scope)):
            tree = copy.deepcopy(pristine)
            twin_node, twin_kind = _sites(_scopes(tree, part)[position][1])[site_index]
            description = _mutate(tree, twin_node, twin_kind)
            line = getattr(node, "lineno", getattr(scope, "lineno", 0))
            line_text = _code_of(lines[line - 1]) if line else ""
            seen[(name, description, line_text)] += 1
            occurrence = seen[(name, description, line_text)]
            result.append(
                Mutant(
                    target,
                    part.file,
                    name,
                    line,
                    line_text,
                    description,
                    occurrence,
                    ast.unparse(tree) + "\n",
                )
            )
    return result


# -- the list of equivalent mutants ------------------------------------------------------------


@dataclass(frozen=True)
class Equivalent:
    target: str
    function: str
    mutation: str
    line: str
    reason: str
    occurrence: int = 1

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.target, self.function, self.mutation, self.line, self.occurrence)


def load_equivalents(path: Path = EQUIVALENTS) -> list[Equivalent]:
    """The committed list; an entry without a reason is refused."""
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text())
    entries = []
    for number, entry in enumerate(data.get("equivalent", []), start=1):
        missing = {"target", "function", "mutation", "line", "reason"} - set(entry)
        if missing or not str(entry.get("reason", "")).strip():
            raise SystemExit(
                f"{path}: entry {number} needs target, function, mutation, line and a "
                f"one-line reason (missing: {', '.join(sorted(missing)) or 'reason'})"
            )
        entries.append(Equivalent(**entry))
    return entries


def _toml_entry(mutant: Mutant) -> str:
    """A survivor as an entry to paste into the list, its reason to be written."""
    lines = [
        "[[equivalent]]",
        f"target = {_toml_string(mutant.target)}",
        f"function = {_toml_string(mutant.function)}",
        f"mutation = {_toml_string(mutant.description)}",
        f"line = {_toml_string(mutant.line_text)}",
    ]
    if mutant.occurrence > 1:
        lines.append(f"occurrence = {mutant.occurrence}")
    lines.append('reason = ""')
    return "\n".join(lines)


def _toml_string(value: str) -> str:
    return "'" + value + "'" if "'" not in value else '"' + value.replace('"', '\\"') + '"'


# -- running the tests -------------------------------------------------------------------------


def _copy_repository(destination: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "reports", "mutants", "__pycache__", "*.egg-info", ".ruff_cache"
    )
    shutil.copytree(ROOT, destination, ignore=ignore, dirs_exist_ok=True)


def _preload(work: Path) -> None:
    """Import once what every test run imports, then forget the package and the tests'
    helpers (each run imports them from the copy, the mutant included)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # every run would compile the whole package again (and pytest rewrite it): cache the
    # bytecode beside the copy, never in the repository or the virtualenv
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(work.parent / "bytecode")
    sys.path[:0] = [str(work), str(work / "tests" / "support")]
    import pytest  # noqa: F401

    for name in ("h11", "httpcore", "httpx", PACKAGE):
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            with contextlib.suppress(Exception):
                importlib.import_module(module.name)
    for name in ("xdist", "xdist.dsession", "_pytest.pytester", "pytest_html", "pytest_benchmark"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name == PACKAGE or name.startswith(f"{PACKAGE}.") or path.startswith(str(work)):
            del sys.modules[name]
    sys.path.remove(str(work / "tests" / "support"))  # pytest puts it back (pyproject's pythonpath)


@dataclass(frozen=True)
class Outcome:
    code: int  # pytest's exit code; -1 when it ran out of time
    seconds: float


def _run_tests(work: Path, tests: tuple[str, ...], timeout_s: float, log: Path) -> Outcome:
    """The tests in a fork of this process, in the copy, their output in ``log``."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setpgid(0, 0)
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir(work)
            import pytest

            args = ["-p", "no:cacheprovider", "-x", "-q", "--no-header", "-o", "addopts="]
            code = int(pytest.main([*args, *tests]))
            package = sys.modules.get(PACKAGE)
            if package is not None and not str(package.__file__).startswith(str(work)):
                print(f"the tests imported {package.__file__}, not the copy's", flush=True)
                code = 71
        except BaseException:  # noqa: BLE001 - whatever it was, the parent learns a code
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    deadline = started + timeout_s
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = 0
                return Outcome(os.waitstatus_to_exitcode(status), time.perf_counter() - started)
            if time.perf_counter() > deadline:
                return Outcome(-1, time.perf_counter() - started)  # a hang is noticed too
            time.sleep(0.01)
    finally:
        if pid:  # out of time, or this run was stopped: the tests and what they started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@dataclass
class Tally:
    made: int = 0
    killed: int = 0
    equivalent: int = 0
    survived: int = 0
    flaky: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def _mutated(work: Path, mutant: Mutant) -> Iterator[None]:
    path = work / PACKAGE / mutant.file
    original = path.read_text()
    path.write_text(mutant.source)
    _forget_bytecode(path)
    try:
        yield
    finally:
        path.write_text(original)
        _forget_bytecode(path)


def _forget_bytecode(path: Path) -> None:
    """Drop the module's cached bytecode (Python's and pytest's rewritten one): a cache
    checks the source's size and mtime in seconds, which a mutant written within the same
    second as the source before it, at the same size, would match."""
    cached = Path(importlib.util.cache_from_source(str(path)))
    for pyc in cached.parent.glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


def run(
    selected: list[str], timeout_s: float, functions: tuple[str, ...], equivalents: list[Equivalent]
) -> int:
    # stopped (SIGTERM), the copy is removed and the tests running are ended all the same
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    listed = {entry.key: entry for entry in equivalents}
    tallies: dict[str, Tally] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="longctx-mutation-") as scratch:
        work = Path(scratch) / "repo"
        _copy_repository(work)
        _preload(work)
        log = Path(scratch) / "pytest.log"
        for target in selected:
            tests = TARGETS[target].tests
            print(f"== {target}: tests {' '.join(tests)}", flush=True)
            baseline = _run_tests(work, tests, max(timeout_s, 600.0), log)
            if baseline.code != 0:
                print(log.read_text()[-6000:])
                print(
                    f"the tests of {target} fail unmutated (exit {baseline.code}): fix them first"
                )
                return 2
            limit = max(timeout_s, 10 * baseline.seconds)
            target_mutants = mutants(target, functions)
            tally = tallies[target] = Tally(made=len(target_mutants))
            started = time.perf_counter()
            print(
                f"   {len(target_mutants)} mutants; unmutated tests pass in "
                f"{baseline.seconds:.1f} s (limit per run {limit:.0f} s)",
                flush=True,
            )
            made_keys = set()
            for mutant in target_mutants:
                made_keys.add(mutant.key)
                with _mutated(work, mutant):
                    first = _run_tests(work, tests, limit, log)
                    again = _run_tests(work, tests, limit, log) if first.code != 0 else None
                entry = listed.get(mutant.key)
                if again is not None and again.code != 0:
                    tally.killed += 1
                    if entry is not None:
                        failures.append(f"{mutant.name()}: listed as equivalent, but killed")
                        print(f"   KILLED, LISTED {mutant.name()}", flush=True)
                elif again is not None:
                    tally.flaky += 1
                    failures.append(f"{mutant.name()}: the tests failed once, then passed")
                    print(f"   FLAKY {mutant.name()}", flush=True)
                elif entry is not None:
                    tally.equivalent += 1
                else:
                    tally.survived += 1
                    failures.append(f"{mutant.name()}: survived\n{_toml_entry(mutant)}")
                    print(f"   SURVIVED {mutant.name()}  [{mutant.line_text}]", flush=True)
            if not functions:
                for entry in equivalents:
                    if entry.target == target and entry.key not in made_keys:
                        failures.append(
                            f"{target}.{entry.function} {entry.mutation} [{entry.line}]: listed "
                            "as equivalent, but no such mutant is made (the code changed)"
                        )
            tally.seconds = time.perf_counter() - started
            print(
                f"   {target}: {tally.made} made, {tally.killed} killed, {tally.equivalent} "
                f"equivalent (listed), {tally.survived} survived, {tally.flaky} flaky; "
                f"{tally.seconds:.0f} s",
                flush=True,
            )
    print("\ntarget         made  killed  equivalent  survived  flaky")
    for target, tally in tallies.items():
        print(
            f"{target:<13} {tally.made:>5} {tally.killed:>7} {tally.equivalent:>11} "
            f"{tally.survived:>9} {tally.flaky:>6}"
        )
    if failures:
        print("\n" + "\n\n".join(failures))
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument(
        "--timeout", type=float, default=60, help="seconds per run at least (else 10x unmutated)"
    )
    parser.add_argument("--functions", default="", help="comma-separated: only these functions")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS, help="the list")
    args = parser.parse_args()
    selected = [name for name in args.only.split(",") if name]
    unknown = set(selected) - set(TARGETS)
    if unknown:
        raise SystemExit(f"unknown target(s): {', '.join(sorted(unknown))}; known: {list(TARGETS)}")
    functions = tuple(name for name in args.functions.split(",") if name)
    equivalents = load_equivalents(args.equivalents)
    if args.list:
        for target in selected:
            keys = {entry.key for entry in equivalents}
            for mutant in mutants(target, functions):
                mark = " (listed as equivalent)" if mutant.key in keys else ""
                print(f"{mutant.name()}  [{mutant.line_text}]{mark}")
        return
    sys.exit(run(selected, args.timeout, functions, equivalents))


if __name__ == "__main__":
    main()
