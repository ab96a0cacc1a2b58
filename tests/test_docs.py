"""The docs and README against the code: every flag, make target, CLI subcommand, output file
and module path they name exists, the generated reference covers every option, the annotated
profile is one the reader accepts, and README stays short."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pytest_longctx.core.records import FAILURE_CLASSES
from pytest_longctx.plugin import RESUME_FLAG
from pytest_longctx.profiles import available_profiles, load_profile
from pytest_longctx.session.option_parsing import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import longctx_reference as reference  # noqa: E402

#: The hand-written pages: README and docs/**/*.md, not the generated reference or the build.
PAGES = [ROOT / "README.md"] + sorted(
    path
    for path in DOCS.rglob("*.md")
    if "_build" not in path.parts and "generated" not in path.parts
)
#: Files the pages name that the plugin reads or that belong to the project, not outputs.
NOT_OUTPUTS = {
    "README.md",
    "longctx-baseline.jsonl",
    "longctx.xml",
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


def test_module_paths_and_links_the_docs_name_exist() -> None:
    missing = []
    for page in PAGES:
        text = page.read_text()
        for path in re.findall(
            r"`((?:pytest_longctx|tests|benchmarks)/[\w/.-]+\.(?:py|toml))`", text
        ):
            if not (ROOT / path).exists():
                missing.append((page.name, path))
        for link in re.findall(r"\]\(([^)#:]+\.(?:md|png|jsonl))(?:#[\w-]+)?\)", text):
            if not (page.parent / link).exists() and "generated" not in link:
                missing.append((page.name, link))
    assert not missing, missing


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


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_every_reference_page_generates(page: str) -> None:
    text = reference.PAGES[page]()
    assert text.startswith("# ") and "|" in text or "```" in text
