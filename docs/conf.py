"""Sphinx configuration for hpcpar's documentation (built by the test suite, warnings as errors)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "hpcpar"
author = "the hpcpar developers"
copyright = "2026, the hpcpar developers"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields of the class, not entries beside its members
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures carry them; the docstrings say what they mean
autodoc_default_options = {"members": True, "undoc-members": False}
html_theme = "alabaster"
html_static_path: list[str] = []
nitpicky = False
