"""hpcpar.apps: the applications built on hpcpar (installed from apps/).

Each app (sgd, cfr, graph, sat) is a subpackage with its engine, its command
(``cli.py``), its benchmark against the best outside code of its field (``bench.py``)
and ``plugin.py``, which registers both and a demo step with hpcpar through the
entry-point group ``hpcpar.plugins``. The core package never imports an app.
"""

from __future__ import annotations

__all__: list[str] = []
