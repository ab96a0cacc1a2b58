"""The reference pages, generated from the code and committed, so they read on GitHub too.

Each ``*_page`` function returns one Markdown page read from what the plugin itself declares:
the options and ini keys from a pytest parser the plugin's ``pytest_addoption`` filled, the CLI
from its argparse parser, the profile schema from what the profile reader gives a profile that
sets nothing, the output files from ``core/file_names.py``, the failure classes and the record
schema from ``core/records.py``, the JUnit properties from the recorder and the gate's items
given a real record of the embedded model (``docs/sample/record.jsonl``), the hooks, fixtures
and markers from their modules, and the package map from the modules' docstrings.

``python docs/_ext/longctx_reference.py`` (``make reference``) rewrites the committed pages;
the docs build warns (and so, strict, fails) and ``tests/unit/project/test_docs.py`` fails where
a committed page differs from what the code generates now.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
PACKAGE = ROOT / "pytest_longctx"
#: Where the generated pages are committed (``make reference`` rewrites them).
GENERATED = DOCS / "reference" / "generated"
#: The committed results file the README's picture is drawn from.
SAMPLE_RESULTS = DOCS / "sample" / "results.jsonl"
#: One real record of the embedded default: a passed 1Ki point of ``pytest tests/test_sweep.py
#: --longctx-to=1Ki`` (its fingerprint holds the command). The record and JUnit pages show it.
SAMPLE_RECORD = DOCS / "sample" / "record.jsonl"
#: The width the CLI page's help is wrapped at, whatever the terminal's.
HELP_WIDTH = 88
STATIC = DOCS / "_static"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- options and ini keys --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptionRow:
    """One command-line option as the plugin declared it to pytest."""

    names: tuple[str, ...]
    metavar: str | None
    help: str
    ini_key: str | None
    ini_type: str | None


def plugin_options() -> list[OptionRow]:
    """Every option of the plugin's group and its ini key, from a real pytest parser."""
    from _pytest.config.argparsing import Parser

    from pytest_longctx import plugin

    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    inis = dict(parser._inidict)  # name -> (help, type, default)
    rows: dict[str, OptionRow] = {}
    for argument in parser.getgroup("longctx").options:
        attrs = argument.attrs()
        dest = attrs["dest"]
        names = tuple(argument.names())
        if dest in rows:  # a flag's --no- form joins its row
            row = rows[dest]
            rows[dest] = dataclasses.replace(row, names=row.names + names)
            continue
        ini = inis.get(dest)
        rows[dest] = OptionRow(
            names=names,
            metavar=None
            if attrs.get("action") in ("store_true", "store_false")
            else attrs.get("metavar"),
            help=str(attrs.get("help", "")).replace("%%", "%"),
            ini_key=dest if ini else None,
            ini_type=ini[1] if ini else None,
        )
    return list(rows.values())


def option_names() -> set[str]:
    """Every ``--longctx-*`` spelling pytest accepts, ``--no-`` forms included."""
    return {name for row in plugin_options() for name in row.names}


class _GivenConfig:
    """What ``read_settings`` reads of a pytest config: these options given, no ini file."""

    def __init__(self, given: Mapping[str, object]) -> None:
        self._given = dict(given)
        self.inipath = None
        self.invocation_params = SimpleNamespace(args=())

    def getoption(self, name: str, default: object = None) -> object:
        return self._given.get(name, default)

    def getini(self, name: str) -> object:
        return None


#: Every workload at once, so that each workload's options are read rather than refused.
ALL_WORKLOADS = "cold,warm,interference,concurrency"


def reader_settings(given: Mapping[str, str] | None = None, every_workload: bool = True) -> Any:
    """The ``Settings`` the plugin's own reader makes of these options (``--longctx-`` names
    without dashes: ``{"longctx-warm-questions": "3"}``) and none other; with
    ``every_workload`` every workload is measured unless ``longctx-workload`` is given, so
    each workload's options are accepted."""
    from pytest_longctx.session.option_parsing import read_settings

    options = {**({"longctx-workload": ALL_WORKLOADS} if every_workload else {}), **(given or {})}
    config = _GivenConfig({name.replace("-", "_"): value for name, value in options.items()})
    return read_settings(config)  # type: ignore[arg-type]


def is_default(option: str, value: str) -> bool:
    """Whether ``--option=value`` reads as giving nothing at all: ``value`` is the default.
    Read by the plugin's own parser, so ``1m`` and ``60s`` are the same duration."""
    every = option != "longctx-workload"
    return reader_settings({option: value}, every) == reader_settings(every_workload=every)


def options_page() -> str:
    entries = []
    for row in plugin_options():
        form = ", ".join(
            f"`{name}={row.metavar}`"
            if row.metavar and not name.startswith("--no-")
            else f"`{name}`"
            for name in row.names
        )
        if row.names[0] == "--longctx-resume":
            form = "`--longctx-resume`, `--longctx-resume=RUN_ID`"
        ini = (
            f"ini key `{row.ini_key}` ({row.ini_type})"
            if row.ini_key
            else "command line only, no ini key"
        )
        entries.append(f"{form}\n: {_cell(row.help)}\n\n  *{ini}*\n")
    return (
        "# Options and ini keys\n\n"
        "Generated from the plugin's option declarations "
        "(`pytest_longctx/session/option_parsing.py`, `pytest_longctx/plugin.py`) at every "
        "docs build. The command line wins over the ini "
        "key. A flag an ini file turns on is turned off for one session by its `--no-` form. "
        "Sizes read `1Ki`, `64Mi`, `1Gi` or a token count; durations `500ms`, `1s`, `2m`, "
        "`1h` or plain seconds; percentages `25%` or `25`. In `pyproject.toml`'s "
        "`[tool.pytest.ini_options]`, flags are `true`/`false` unquoted and `longctx_url` may "
        "be a list. Bad input stops the session before collection with one line naming the "
        "option and the accepted form.\n\n" + "\n".join(entries)
    )


# -- the CLI ---------------------------------------------------------------------------------


def cli_subcommands() -> dict[str, argparse.ArgumentParser]:
    from pytest_longctx.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _fixed_width(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser, wrapping its help at :data:`HELP_WIDTH` and without colours, so the page
    is the same from any terminal."""
    parser.formatter_class = functools.partial(  # type: ignore[assignment]
        argparse.HelpFormatter, width=HELP_WIDTH
    )
    parser.color = False  # type: ignore[attr-defined]  # Python 3.14's coloured help
    return parser


def cli_page() -> str:
    from pytest_longctx.cli import build_parser

    parts = [
        "# Command line: `python -m pytest_longctx`\n\n",
        "Generated from the argparse parser in `pytest_longctx/cli.py`.\n\n",
        "```text\n" + _fixed_width(build_parser()).format_usage() + "```\n\n",
    ]
    for name, sub in cli_subcommands().items():
        sub.prog = f"python -m pytest_longctx {name}"
        parts.append(f"## `{name}`\n\n```text\n{_fixed_width(sub).format_help()}```\n\n")
    return "".join(parts)


# -- the profile schema ----------------------------------------------------------------------

#: TOML keys whose dataclass field is named differently.
_FIELD_OF_KEY = {("sweep", "from"): "from_length", ("sweep", "to"): "to_length"}
_SIZES = {
    ("model", "weights_bytes"),
    ("serving", "kv_cache_memory"),
    ("sweep", "from"),
    ("sweep", "to"),
    ("sweep", "slow_from"),
    ("sweep", "very_slow_from"),
    ("hardware", "memory_per_device"),
    ("hardware", "reserve_per_device"),
}


def _markdown(text: str) -> str:
    """A docstring-style comment as Markdown: ``:data:`X``` and ````x```` become ```x```."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _field_comments(source: str) -> dict[tuple[str, str], str]:
    """``(ClassName, field) -> comment`` from the ``#:`` lines above and ``#`` after a field."""
    comments: dict[tuple[str, str], str] = {}
    current, pending = None, []
    for line in source.splitlines():
        if match := re.match(r"class (\w+)", line):
            current, pending = match.group(1), []
            continue
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        if current and (match := re.match(r"    (\w+): [^=]+?(?:= .*?)?(?:  # (.*))?$", line)):
            text = " ".join(pending + ([match.group(2)] if match.group(2) else []))
            comments[(current, match.group(1))] = _markdown(text)
        pending = []
    return comments


def reader_defaults() -> Any:
    """The profile the reader makes of a file that sets nothing but its required key: what
    each key is when a profile leaves it out (not the dataclass's default, which may differ)."""
    from pytest_longctx.profiles import load_profile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "nothing-set.toml"
        path.write_text('[model]\nsource = "embedded:tiny-llama"\n')
        return load_profile(str(path))


#: The keys a profile must set: the reader refuses a profile without them.
REQUIRED_KEYS = {("model", "source")}


def _profile_default(table: str, key: str, value: object) -> str:
    from pytest_longctx.core.sizes import format_size

    if (table, key) in REQUIRED_KEYS:
        return "required"
    if (table, key) in _SIZES and isinstance(value, int):
        return f"`{format_size(value)}`"
    if isinstance(value, Mapping):
        value = dict(value)
    return f"`{value!r}`"


def profile_page() -> str:
    from pytest_longctx.profiles import profile as module

    comments = _field_comments(inspect.getsource(module))
    defaults = reader_defaults()
    classes = {
        "profile": None,
        "model": module.ModelSpec,
        "serving": module.ServingSpec,
        "sweep": module.SweepSpec,
        "hardware": module.HardwareSpec,
        "gate": module.GateSpec,
    }
    parts = [
        "# Profile schema\n\n",
        "Generated from the profile dataclasses and the known keys in "
        "`pytest_longctx/profiles/profile.py`; each default is what the reader gives a "
        "profile that leaves the key out. An unknown or misspelt key is refused with the "
        'closest known one. Sizes take `"16Gi"`, `"64Mi"` or a plain number (bytes, or '
        "tokens for lengths); `[serving.env]` and `[serving.expected_versions]` are tables of "
        "strings; `[model] memory_marks` maps labels to sizes. A key left unset (`None`) "
        "sends vLLM no flag: vLLM's own default applies. The shipped profiles are "
        "`" + "`, `".join(module.available_profiles()) + "`.\n\n",
    ]
    for table, cls in classes.items():
        keys = sorted(module.PROFILE_KEYS.get(table) or ())
        fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
        rows = []
        for key in keys:
            name = _FIELD_OF_KEY.get((table, key), key)
            spec = fields.get(name)
            if spec is None:  # [profile] description
                value = getattr(defaults, key)
                meaning = "one line on what it serves, in the reports"
                rows.append((f"`{key}`", "str", _profile_default(table, key, value), meaning))
                continue
            value = getattr(getattr(defaults, table), name)
            kind = "size" if (table, key) in _SIZES else str(spec.type)
            default = _profile_default(table, key, value)
            rows.append((f"`{key}`", kind, default, comments.get((cls.__name__, name), "")))
        parts.append(f"## `[{table}]`\n\n")
        parts.append(_table(("key", "type", "default", "meaning"), rows) + "\n")
    return "".join(parts)


# -- outputs, failure classes, JUnit properties -----------------------------------------------


def output_files() -> dict[str, str]:
    """Every file or folder name a session or the CLI writes -> the constant naming it."""
    from pytest_longctx.core import file_names

    names: dict[str, str] = {}
    for attr, value in vars(file_names).items():
        if attr.isupper() and isinstance(value, str):
            names[value] = attr
        elif attr.isupper() and isinstance(value, tuple):
            names.update({item: attr for item in value})
    names[file_names.progress_file_name("gwN")] = "progress_file_name"
    for stem in (file_names.server_file_stem(), file_names.server_file_stem("gwN")):
        names[f"{stem}.log"] = "server_file_stem"
        names[f"{stem}.json"] = "server_file_stem"
    return names


def outputs_page() -> str:
    from pytest_longctx.core import file_names

    source = inspect.getsource(file_names)
    tree = ast.parse(source)
    notes: dict[str, str] = {}
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            above = lines[node.lineno - 2].strip()
            notes[node.targets[0].id] = above[2:].strip() if above.startswith("#:") else ""
    rows = [
        (f"`{name}`", f"`{attr}`", notes.get(attr, "")) for name, attr in output_files().items()
    ]
    return (
        "# Output files\n\n"
        "Generated from `pytest_longctx/core/file_names.py`, the one module that names them. "
        "A session writes them into `reports/<run_id>/` (`--longctx-output` sets the root) "
        "and points `reports/latest` at it; `index.html` sits beside the run folders; "
        "`python -m pytest_longctx report RUN_DIR` rewrites the reports from `results.jsonl` "
        "alone, `compare` writes its files into its `--output` folder. Under pytest-xdist, "
        "worker `gwN` writes `progress-gwN.json` and its launched server `server-gwN.log` and "
        "`server-gwN.json`.\n\n" + _table(("file", "named by", "what"), rows)
    )


def failures_page() -> str:
    from pytest_longctx.core.records import CACHE_TIERS, FAILURE_CLASSES, OUTCOMES

    return (
        "# Outcomes and failure classes\n\n"
        "Generated from `pytest_longctx/core/records.py`. Every record has one outcome: "
        + ", ".join(f"`{o}`" for o in OUTCOMES)
        + ". Every failed, error and interrupted record carries a `failure_class` and the "
        "`evidence` that shows it (`pytest_longctx/measure/outcomes.py` reads it from the HTTP "
        "status, vLLM's error frame, the server's log, its exit status and the cgroup's OOM "
        "kills). A skip carries a class only when a failure caused it.\n\n"
        + _table(("class", "meaning"), [(f"`{k}`", v) for k, v in FAILURE_CLASSES.items()])
        + "\n## Cache tiers\n\n"
        "A record whose prompt the server served in part from a cache (a warm follow-up, or a "
        "cold point that was not cold) names the tier in `cache.tier`, with the tokens per "
        "tier in `cache.served_by` and the counters they were read from in "
        "`cache.tier_counter` (see the reuse guide). Nearest the accelerator first:\n\n"
        + _table(("tier", "served from"), [(f"`{k}`", v) for k, v in CACHE_TIERS.items()])
    )


def sample_record() -> Any:
    """The committed real record (:data:`SAMPLE_RECORD`), read as the reports read it."""
    from pytest_longctx.core.records import read_records

    result = read_records(SAMPLE_RECORD)
    if result.problems or len(result.records) != 1:
        raise ValueError(f"{SAMPLE_RECORD}: expected one readable record ({result.problems})")
    return result.records[0]


class _Item:
    """What the recorder needs of a pytest item: its ``user_properties``."""

    def __init__(self) -> None:
        self.user_properties: list[tuple[str, object]] = []


def point_properties(record: Any) -> list[tuple[str, object]]:
    """The properties the recorder gives the point of ``record`` (``--junitxml``)."""
    from pytest_longctx.session.recorder import record_properties

    item = _Item()
    record_properties(item, record)  # type: ignore[arg-type]
    return item.user_properties


def _answered_wrong(record: Any, *, failed: bool) -> Any:
    """``record`` as the point would have ended had its answer been wrong: failed as
    ``wrong_answer`` under ``--longctx-fidelity=check``, passed under ``record``."""
    fidelity = {**record.fidelity, "verdict": "wrong", "answer": "0"}
    if not failed:
        return dataclasses.replace(record, fidelity={**fidelity, "mode": "record"})
    return dataclasses.replace(
        record, outcome="failed", failure_class="wrong_answer", reason="why", fidelity=fidelity
    )


def gate_item_properties() -> list[tuple[str, object]]:
    """The properties of the sample record's length's ``test_regression`` item, the record
    gated against itself with its answer made wrong (so the answers' verdict shows too)."""
    from pytest_longctx import gate
    from pytest_longctx.session.gate_items import gate_properties

    record = sample_record()
    current = _answered_wrong(record, failed=False)
    verdict = gate.compare_length([record], [current], record.length)
    return gate_properties(record.length, verdict.status, verdict.verdicts)


def _value(value: object) -> str:
    return f"`{value:.4g}`" if isinstance(value, float) else f"`{value}`"


def junit_page() -> str:
    from pytest_longctx.core.records import Record
    from pytest_longctx.gate import ANSWERS_METRIC, METRICS, VERDICT_STATUSES

    record = sample_record()
    passed = point_properties(record)
    shown = {name for name, _ in passed}
    failed = _answered_wrong(record, failed=True)
    added = [
        (
            f"`{name}`",
            next(
                f"`{f.name}`"
                for f in dataclasses.fields(Record)
                if getattr(failed, f.name) == value
            ),
        )
        for name, value in point_properties(failed)
        if name not in shown
    ]
    metrics = ", ".join(f"`{name}`" for name in [*METRICS, ANSWERS_METRIC])
    return (
        "# JUnit XML properties\n\n"
        "With `--junitxml=FILE` each point's testcase carries its figures as properties (the "
        "item's `user_properties`, as `record_property` sets them). Generated from "
        "`pytest_longctx/session/recorder.py` and `pytest_longctx/session/gate_items.py` "
        f"given the real record of `{SAMPLE_RECORD.relative_to(ROOT).as_posix()}` (a passed "
        f"{record.length}-token point of the embedded default; see the "
        "[record schema](records.md)). A figure appears only where it was measured, "
        "`longctx_fidelity` only where the prompt carried the probe.\n\n"
        "## A point\n\n"
        + _table(("property", "this record's"), [(f"`{n}`", _value(v)) for n, v in passed])
        + "\nA point that did not pass (an outcome other than `passed`) adds:\n\n"
        + _table(("property", "the record's"), added)
        + "\n## A `test_regression[len=N]` item\n\n"
        "With `--longctx-baseline`, each length's gate item carries the length, its status "
        "(see [the gate's statuses](../../concepts/gate.md#statuses)) and, per metric "
        "judged, its verdict (one of "
        + ", ".join(f"`{status}`" for status in VERDICT_STATUSES)
        + "), the change of the mean in percent (where both sides have a figure) and the "
        "tolerance. The metrics: "
        + metrics
        + " (the answers' verdict, only where the baseline's answers were all right and some "
        "are wrong now). The sample record gated against itself, its answer made wrong "
        "(`--longctx-fidelity=record`, so the point still passed):\n\n"
        + _table(("property", "value"), [(f"`{n}`", _value(v)) for n, v in gate_item_properties()])
        + "\nThese are testcase properties, which the strict xunit2 schema does not describe: "
        "a CI tool that validates against it may ignore them.\n"
    )


def records_page() -> str:
    from pytest_longctx.core import records as module

    comments = _field_comments(inspect.getsource(module))
    record = sample_record()
    rows = []
    for spec in dataclasses.fields(module.Record):
        rows.append((f"`{spec.name}`", spec.type, comments.get(("Record", spec.name), "")))
    figures = [
        (f"`{name}`", unit or "-", _value(record.figures[name]) if name in record.figures else "")
        for name, unit in module.FIGURE_UNITS.items()
    ]
    example = json.dumps(record.to_json(), indent=1, sort_keys=True)
    return (
        "# The record schema: `results.jsonl`\n\n"
        "Generated from `pytest_longctx/core/records.py`, the one module that writes and reads "
        "records. `results.jsonl` holds one JSON object per line, one per finished item, "
        "appended and flushed as each ends; every report, the gate and the CLI read only it. "
        f"Schema version {module.SCHEMA_VERSION}: a reader refuses a record of another "
        "version, and a record that does not parse is reported and skipped, never "
        "rewritten. Outcomes: "
        + ", ".join(f"`{outcome}`" for outcome in module.OUTCOMES)
        + "; the [failure classes](failure-classes.md) say why a point did not pass. "
        "A baseline file is the same lines after an optional header object whose key is "
        f"`{module.BASELINE_HEADER_KEY}`.\n\n"
        "## Keys\n\n" + _table(("key", "type", "what"), rows) + "\n## Figures\n\n"
        'Each figure is stored as `{"value": ..., "unit": ...}` under `figures`, only '
        "where it was measured. The last column is the sample record's value.\n\n"
        + _table(("figure", "unit", "sample"), figures)
        + f"\n## A real record\n\n`{SAMPLE_RECORD.relative_to(ROOT).as_posix()}`, a passed "
        "1Ki point of the embedded default on vllm-cpu (one line in the file; indented "
        "here):\n\n```json\n" + example + "\n```\n"
    )


# -- hooks, fixtures, markers ----------------------------------------------------------------


def _functions(path: Path, prefix: str = "") -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith(prefix)]


def hook_names() -> list[str]:
    return [f.name for f in _functions(PACKAGE / "session" / "hookspecs.py", "pytest_longctx_")]


def hooks_page() -> str:
    from pytest_longctx.session import hookspecs

    parts = [
        "# Hooks\n\n",
        "Generated from `pytest_longctx/session/hookspecs.py`. Implement them in a "
        "`conftest.py` or a plugin of your own.\n\n",
    ]
    for name in hook_names():
        function = getattr(hookspecs, name)
        signature = str(inspect.signature(function)).replace("'", "")
        spec = getattr(function, "pytest_spec", {})
        first = (
            " The first implementation that returns a value wins."
            if spec.get("firstresult")
            else ""
        )
        parts.append(
            f"## `{name}`\n\n```python\ndef {name}{signature}\n```\n\n"
            f"{inspect.getdoc(function)}{first}\n\n"
        )
    return "".join(parts)


def fixture_names() -> list[str]:
    return [f.name for f in _fixture_defs()]


def _fixture_defs() -> list[ast.FunctionDef]:
    found = []
    for function in _functions(PACKAGE / "session" / "fixtures.py"):
        for decorator in function.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ast.unparse(target) == "pytest.fixture":
                found.append(function)
    return found


def public_types() -> list[type]:
    """The classes ``pytest_longctx`` exports that a fixture or a hook hands a test: dataclasses."""
    import pytest_longctx

    found = [getattr(pytest_longctx, name) for name in pytest_longctx.__all__]
    return [cls for cls in found if isinstance(cls, type) and dataclasses.is_dataclass(cls)]


def _object_rows(cls: type) -> list[tuple[object, ...]]:
    """A dataclass's fields (type, ``#:`` or trailing comment) and properties (docstring)."""
    comments = _field_comments(inspect.getsource(sys.modules[cls.__module__]))
    rows: list[tuple[object, ...]] = [
        (f"`{spec.name}`", spec.type, comments.get((cls.__name__, spec.name), ""))
        for spec in dataclasses.fields(cls)
    ]
    for name, member in sorted(vars(cls).items()):
        if isinstance(member, property) and not name.startswith("_"):
            kind = member.fget.__annotations__.get("return", "") if member.fget else ""
            doc = (inspect.getdoc(member) or "").split("\n\n")[0]
            rows.append((f"`{name}` (property)", kind, _markdown(doc)))
    return rows


def fixtures_page() -> str:
    rows = []
    for function in _fixture_defs():
        scope = "function"
        for decorator in function.decorator_list:
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "scope":
                        scope = ast.literal_eval(keyword.value)
        arguments = [a.arg for a in function.args.args if a.arg not in ("request", "pytestconfig")]
        gives = ast.unparse(function.returns) if function.returns else ""
        gives = re.sub(r"^(?:Iterator|Generator)\[(\w+).*\]$", r"\1", gives)
        rows.append(
            (
                f"`{function.name}`",
                scope,
                f"`{gives}`" if gives else "",
                ", ".join(f"`{a}`" for a in arguments),
                ast.get_docstring(function) or "",
            )
        )
    parts = [
        "# Fixtures\n\n"
        "Generated from `pytest_longctx/session/fixtures.py`. Asking for any of them starts the "
        "sweep's part of the session, as collecting a sweep item does.\n\n",
        _table(("fixture", "scope", "gives", "uses", "what"), rows),
        "\n## What they give\n\n"
        "The classes `pytest_longctx` exports (`from pytest_longctx import Point`), frozen "
        "dataclasses; each field as its module declares it.\n\n",
    ]
    for cls in public_types():
        doc = inspect.getdoc(cls) or ""
        summary = "" if doc.startswith(f"{cls.__name__}(") else doc.split("\n\n")[0]
        parts.append(f"### `{cls.__name__}`\n\n{_markdown(' '.join(summary.split()))}\n\n")
        parts.append(_table(("name", "type", "what"), _object_rows(cls)) + "\n")
    return "".join(parts)


def markers() -> list[tuple[str, str]]:
    """The markers the plugin registers, as ``pytest --markers`` lists them in a bare folder."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + sys.path))
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = []
    for line in listed.splitlines():
        if match := re.match(r"@pytest\.mark\.(longctx[^:]*): (.*)", line):
            found.append((match.group(1), match.group(2)))
    return found


def markers_page() -> str:
    return (
        "# Markers\n\n"
        "Generated from the markers the plugin registers (`pytest_longctx/plugin.py`); "
        "`pytest --markers` lists the same. Sweep items also take `len` and `rep` comparisons "
        'in `-m` and `-k` (`-m "len<=4Ki and rep==0"`).\n\n'
        + _table(("marker", "meaning"), [(f"`{m}`", text) for m, text in markers()])
    )


# -- the package map -------------------------------------------------------------------------


def modules_page() -> str:
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.split("\n\n")[0]
        rows.append((f"`{relative}`", first))
    return "# Every module\n\nGenerated from each module's docstring.\n\n" + _table(
        ("module", "what it is for"), rows
    )


def vllm_versions_page() -> str:
    """The supported vLLM releases, from the release table the product plans and launches
    with (``profiles/vllm_releases.py``, each row held to its release's source by
    ``tests/unit/profiles/test_vllm_releases.py``)."""
    from pytest_longctx.profiles import vllm_releases as table

    rows = []
    for row in table.RELEASES:
        flags = ", ".join(f"`{flag}`" for flag in table.PLUGIN_FLAG_FIELDS if row.accepts(flag))
        rows.append(
            (
                f"**{row.version}**",
                f"{len(row.serve_options)}",
                f"`{row.parser_module}`",
                f"`{row.allocator_module.rsplit('.', 1)[-1]}`",
                flags,
                "on" if row.hybrid_prefix_caching else "**off**",
                "128" if row.hybrid_mla_block_128 else "the backend's",
                "16,384" if row.batched_tokens_160gib else "8,192",
                "on" if row.env_default_on("VLLM_ROCM_USE_AITER_FP4BMM") else "off",
                "yes" if "vllm:prompt_tokens_cached_by_source_total" in row.metrics else "no",
            )
        )
    env_rows = [(f"`{name}`", meaning) for name, meaning in table.ENV_MEANINGS.items()]
    return (
        "# Supported vLLM versions\n\n"
        f"pytest-longctx supports vLLM `{table.SUPPORTED}` and has checked `{table.CHECKED}` "
        f"(the `gpu` extra installs one of them; the embedded default runs vllm-cpu "
        f"{table.EMBEDDED_DEFAULT}). Generated from "
        "the release table the plan, the launch and the capacity cross-check read "
        "(`pytest_longctx/profiles/vllm_releases.py`); "
        "`tests/unit/profiles/test_vllm_releases.py` checks every entry against the facts read "
        "from each release's source distribution (committed with its sha256, so the checks "
        "run offline; `tests/support/vllm_sources.py` reads them from the package index "
        "again). A version between two rows is read as the row below it, and the plan says "
        "so; a version newer than the newest row is planned as that row, with a warning "
        "naming both; a version older than the oldest row stops a launch before anything "
        "starts, naming it.\n\n"
        "`--longctx-plan` names the release it planned for and how it knows it: the vLLM "
        "installed here where it is built for the profile's device, else the profile's pin "
        "(`[serving.expected_versions] vllm`), else the embedded default's. It checks the "
        "server command's flags with that release's own parser where it is installed here and "
        "can be built, else against the release's published `serve` options (every option "
        "string of its parser, listed from its source), and says which way and why; a flag "
        "pytest-longctx adds that the release lacks is left out of the printed command as of "
        "the launch.\n\n"
        "## What changes between releases\n\n"
        + _table(
            (
                "release",
                "`serve` options",
                "`serve` parser",
                "allocator module",
                "flags pytest-longctx adds it accepts",
                "prefix caching for hybrids",
                "hybrid MLA block",
                "default chunk from 160 GiB",
                "AITER FP4 BMM by default",
                "per-tier cached tokens",
            ),
            rows,
        )
        + "\n\nIn every release here: a step that outlasts `VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS` "
        "kills the engine; on ROCm, `HIP_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` set apart "
        "stop the server (the device slots set both alike), and `ROCR_VISIBLE_DEVICES` is read "
        "nowhere; `--enable-per-request-metrics` sends each request's own timing on its "
        "stream's last chunk.\n\n"
        "## The `serve` options each release adds and removes\n\n"
        + _table(("release", "added", "removed"), _serve_option_changes(table.RELEASES))
        + "\n\n## The environment variables it knows\n\n"
        + _table(("variable", "what it does"), env_rows)
        + "\n"
    )


def _serve_option_changes(rows: Sequence[Any]) -> list[tuple[object, ...]]:
    """Each release's ``serve`` options against the release before it."""
    out: list[tuple[object, ...]] = []
    for before, row in zip(rows, rows[1:], strict=False):
        added = sorted(row.serve_options - before.serve_options)
        removed = sorted(before.serve_options - row.serve_options)
        out.append(
            (
                f"**{row.version}**",
                ", ".join(f"`{flag}`" for flag in added) or "none",
                ", ".join(f"`{flag}`" for flag in removed) or "none",
            )
        )
    return out


PAGES = {
    "vllm-versions": vllm_versions_page,
    "options": options_page,
    "cli": cli_page,
    "profile": profile_page,
    "outputs": outputs_page,
    "failure-classes": failures_page,
    "junit": junit_page,
    "records": records_page,
    "hooks": hooks_page,
    "fixtures": fixtures_page,
    "markers": markers_page,
    "modules": modules_page,
}


def stale_pages(folder: Path = GENERATED, names: Iterable[str] = PAGES) -> list[str]:
    """The committed pages (of ``names``) that differ from what the code generates now, or
    are missing."""
    stale = []
    for name in names:
        page = PAGES[name]
        path = folder / f"{name}.md"
        if not path.exists() or path.read_text(encoding="utf-8") != page():
            stale.append(
                path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            )
    return stale


def write_pages(folder: Path = GENERATED, names: Iterable[str] = PAGES) -> list[Path]:
    """Write the generated pages (of ``names``), only where the text changed; return the
    pages written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = folder / f"{name}.md"
        text = PAGES[name]()
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def draw_sample_plots(results: Path = SAMPLE_RESULTS, folder: Path = STATIC) -> list[Path]:
    """TTFT and decode plots of the committed sample run, by the package's own plotting."""
    from pytest_longctx.core.records import read_records
    from pytest_longctx.reporting.plots import write_plots

    folder.mkdir(parents=True, exist_ok=True)
    return write_plots(folder, read_records(results).records)


#: What to run where a committed page drifted from the code.
REGENERATE = "make reference (python docs/_ext/longctx_reference.py)"


def _check_pages(app, config) -> None:  # noqa: ANN001
    """Warn (a strict build fails) where a committed reference page is not what the code
    generates; the pages themselves are rewritten only by :data:`REGENERATE`."""
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    for page in stale_pages():
        logger.warning(f"{page} differs from what the code generates: run {REGENERATE}")
    draw_sample_plots()


def setup(app):  # noqa: ANN001, ANN201
    app.connect("config-inited", _check_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path in write_pages():
        print(path.relative_to(ROOT))
