"""Where hpcpar's core code lives on disk, as the import system says.

``setup.cfg``'s ``package_dir`` can put a subpackage outside ``hpcpar/`` (the
checkpoint package sits in the repository's ``checkpoint/`` folder, and in an installed
copy inside ``hpcpar/``); code that tells hpcpar's frames from a user's asks here
instead of assuming either.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

__all__ = ["core_folders"]

_HPCPAR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the hpcpar package
_CORE = ("hpcpar.checkpoint",)  # core subpackages that setup.cfg may place elsewhere


def core_folders() -> tuple[str, ...]:
    """The folders of ``hpcpar`` and its core subpackages, each ending in a separator.

    Found without importing the subpackages (``importlib.util.find_spec``).
    """
    found = [_HPCPAR + os.sep]
    for name in _CORE:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                found += [os.path.abspath(p) + os.sep for p in spec.submodule_search_locations]
    return tuple(dict.fromkeys(found))
