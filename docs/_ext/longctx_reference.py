"""The reference pages, generated from the code at every docs build so they cannot drift.

Each ``*_page`` function returns one Markdown page read from what the plugin itself declares:
the options and ini keys from a pytest parser the plugin's ``pytest_addoption`` filled, the CLI
from its argparse parser, the profile schema from the profile dataclasses, the output files
from ``core/file_names.py``, the failure classes from ``core/records.py``, the JUnit properties
from the recorder, the hooks, fixtures and markers from their modules, and the package map
from the modules' docstrings. ``tests/test_docs.py`` reads the same functions.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
PACKAGE = ROOT / "pytest_longctx"
#: Where the generated pages go (git-ignored; rewritten at every build).
GENERATED = DOCS / "reference" / "generated"
#: The committed results file the README's picture is drawn from.
SAMPLE_RESULTS = DOCS / "sample" / "results.jsonl"
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


def cli_page() -> str:
    from pytest_longctx.cli import build_parser

    parts = [
        "# Command line: `python -m pytest_longctx`\n\n",
        "Generated from the argparse parser in `pytest_longctx/cli.py`.\n\n",
        "```text\n" + build_parser().format_usage() + "```\n\n",
    ]
    for name, sub in cli_subcommands().items():
        sub.prog = f"python -m pytest_longctx {name}"
        parts.append(f"## `{name}`\n\n```text\n{sub.format_help()}```\n\n")
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
            comments[(current, match.group(1))] = text
        pending = []
    return comments


def profile_page() -> str:
    from pytest_longctx.profiles import profile as module

    comments = _field_comments(inspect.getsource(module))
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
        "`pytest_longctx/profiles/profile.py`. An unknown or misspelt key is refused with the "
        'closest known one. Sizes take `"16Gi"`, `"64Mi"` or a plain number (bytes, or '
        "tokens for lengths); `[serving.env]` and `[serving.expected_versions]` are tables of "
        "strings; `[model] memory_marks` maps labels to sizes. The shipped profiles are "
        "`" + "`, `".join(module.available_profiles()) + "`.\n\n",
    ]
    for table, cls in classes.items():
        keys = sorted(module.PROFILE_KEYS.get(table) or ())
        fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
        rows = []
        for key in keys:
            name = _FIELD_OF_KEY.get((table, key), key)
            spec = fields.get(name)
            if spec is None:
                rows.append((f"`{key}`", "str", "''", "one line on what it serves, in the reports"))
                continue
            if spec.default is not dataclasses.MISSING:
                default = repr(spec.default)
            elif spec.default_factory is not dataclasses.MISSING:
                default = repr(spec.default_factory())
            else:
                default = "required"
            kind = "size" if (table, key) in _SIZES else str(spec.type)
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


class _Item:
    """What the recorder needs of a pytest item: its ``user_properties``."""

    def __init__(self) -> None:
        self.user_properties: list[tuple[str, object]] = []


def junit_point_properties() -> list[str]:
    """The properties the recorder gives a point that did not pass, with every figure."""
    from pytest_longctx.core.records import Record
    from pytest_longctx.session.recorder import PROPERTY_FIGURES, record_properties

    record = Record(
        run_id="r",
        nodeid="n",
        length=1024,
        repeat=0,
        outcome="failed",
        reason="why",
        failure_class="timeout",
        figures={figure: 1.0 for figure, _ in PROPERTY_FIGURES},
        prompt_tokens=1024,
        completion_tokens=64,
    )
    item = _Item()
    record_properties(item, record)  # type: ignore[arg-type]
    return [name for name, _ in item.user_properties]


def junit_page() -> str:
    from pytest_longctx.gate import METRICS

    gate_rows = [
        ("`longctx_gate_length`", "the length judged"),
        ("`longctx_gate_status`", "the length's verdict"),
    ]
    for metric in METRICS:
        gate_rows.append((f"`longctx_gate_{metric}`", f"{metric}: its verdict"))
        gate_rows.append((f"`longctx_gate_{metric}_change_pct`", f"{metric}: the change, %"))
        gate_rows.append((f"`longctx_gate_{metric}_tolerance_pct`", f"{metric}: the tolerance"))
    return (
        "# JUnit XML properties\n\n"
        "With `--junitxml=FILE` each point's testcase carries its figures as properties (the "
        "item's `user_properties`, as `record_property` sets them; generated from "
        "`pytest_longctx/session/recorder.py`). `longctx_failure_class` and `longctx_reason` "
        "appear only on a point that did not pass, a figure only where it was measured.\n\n"
        + _table(("point property",), [(f"`{n}`",) for n in junit_point_properties()])
        + "\nEach `test_regression[len=N]` item (with `--longctx-baseline`) carries the gate's "
        "verdicts, per gated metric:\n\n"
        + _table(("gate property", "what"), gate_rows)
        + "\nThese are testcase properties, which the strict xunit2 schema does not describe: "
        "a CI tool that validates against it may ignore them.\n"
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
        rows.append(
            (
                f"`{function.name}`",
                scope,
                ", ".join(f"`{a}`" for a in arguments),
                ast.get_docstring(function) or "",
            )
        )
    return (
        "# Fixtures\n\n"
        "Generated from `pytest_longctx/session/fixtures.py`. Asking for any of them starts the "
        "sweep's part of the session, as collecting a sweep item does.\n\n"
        + _table(("fixture", "scope", "uses", "what"), rows)
    )


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


PAGES = {
    "options": options_page,
    "cli": cli_page,
    "profile": profile_page,
    "outputs": outputs_page,
    "failure-classes": failures_page,
    "junit": junit_page,
    "hooks": hooks_page,
    "fixtures": fixtures_page,
    "markers": markers_page,
    "modules": modules_page,
}


def write_pages(folder: Path = GENERATED) -> list[Path]:
    """Write every generated page, only where its text changed (keeps rebuilds incremental)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, page in PAGES.items():
        path = folder / f"{name}.md"
        text = page()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written


def draw_sample_plots(results: Path = SAMPLE_RESULTS, folder: Path = STATIC) -> list[Path]:
    """TTFT and decode plots of the committed sample run, by the package's own plotting."""
    from pytest_longctx.core.records import read_records
    from pytest_longctx.reporting.plots import write_plots

    folder.mkdir(parents=True, exist_ok=True)
    return write_plots(folder, read_records(results).records)


def _generate(app, config) -> None:  # noqa: ANN001
    write_pages()
    draw_sample_plots()


def setup(app):  # noqa: ANN001, ANN201
    app.connect("config-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
