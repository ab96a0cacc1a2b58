"""Sphinx configuration: Markdown pages (MyST), the furo theme, and the reference generated
from the code by ``_ext/longctx_reference.py`` at every build."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]

project = "pytest-longctx"
author = "pytest-longctx contributors"
copyright = "pytest-longctx contributors"
extensions = ["myst_parser", "longctx_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "sample", "README.md"]
html_theme = "furo"
html_title = "pytest-longctx"
html_static_path = ["_static"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# Flags such as --longctx-to appear in plain text too: keep their dashes as typed.
smartquotes = False
