"""``python -m hpcpar``: the same command line as the ``hpcpar`` entry point."""

from __future__ import annotations

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
