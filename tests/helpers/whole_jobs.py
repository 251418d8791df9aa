"""Which tests start a whole job, read from their source: the harness marks them slow.

A test starts a whole job when it calls, directly or through a function of its own
module, one of the launching helpers (``launch``, ``killed_and_resumed``,
``resumed_after_one_kill``), ``hpcpar("launch", ...)``, or runs ``mpiexec``, ``srun`` or
``sbatch`` through ``subprocess``. ``tests/conftest.py`` marks those tests ``slow``
(left out of ``--quick``) at collection, and fails a test not so marked that starts
``mpiexec`` or ``hpcpar launch`` anyway.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["LAUNCHERS", "launches", "launching_functions", "starts_a_job"]

LAUNCHERS = {"launch", "killed_and_resumed", "resumed_after_one_kill", "run_job"}
_PROGRAMS = ("mpiexec", "mpirun", "srun", "sbatch")
_SPAWNERS = {"run", "Popen", "check_call", "check_output", "call"}  # subprocess's


def _strings(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _launches_directly(node: ast.AST) -> bool:
    """A call of a launching helper, or a process started by a function whose words
    (its string constants, the command line built in a variable included) make a job."""
    called = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        called.add(
            call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
        )
    if called & LAUNCHERS:
        return True
    if not called & (_SPAWNERS | {"hpcpar", "main"}):
        return False
    words = _strings(node)
    if any(w.split("/")[-1] in _PROGRAMS for w in words):
        return True
    return (
        "launch" in words
        and "--dry-run" not in words
        and ("hpcpar" in words or bool(called & {"hpcpar", "main"}))
    )


def launches(argv: list[str]) -> bool:
    """Whether a command line starts a whole job (what the runtime check looks for)."""
    words = [str(a) for a in argv]
    if any(w.split("/")[-1] in _PROGRAMS for w in words):
        return True
    return "launch" in words and "--dry-run" not in words and any("hpcpar" in w for w in words)


@functools.cache
def launching_functions(path: str) -> frozenset[str]:
    """The module-level functions of a test module that start a whole job."""
    tree = ast.parse(Path(path).read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {
        name: {
            c.func.id
            for c in ast.walk(fn)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in functions
        }
        for name, fn in functions.items()
    }
    found = {name for name, fn in functions.items() if _launches_directly(fn)}
    while True:
        more = {name for name, callees in calls.items() if callees & found} - found
        if not more:
            return frozenset(found)
        found |= more


def starts_a_job(path: str, function: str) -> bool:
    """Whether test ``function`` of module ``path`` starts a whole job."""
    return function in launching_functions(path)
