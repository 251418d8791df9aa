"""Every ``HPCPAR_*`` setting in one table.

Each entry holds the name, kind, default, when it is read, whether the ranks must agree
on it, and what it does. Readers take their values from here (``value``, ``flag``); the
hottest paths read the raw environment under the key ``raw_key`` gives and fall back
here for anything but the plain values. ``docs/environment.md``, ``hpcpar info`` and
the ranks' agreement check (``collectives/agree.py``) come from the table, and a test
finds every ``HPCPAR_`` name in the source in it.

A value that does not parse is a one-line ``UsageError`` naming the variable
(``HPCPAR_CHECK='yes please': expected one of 1, true, yes, on, 0, false, no, off``).
Settings read when the module is imported (``read="import"``) fall back to their default
there and are checked when hpcpar first uses a communicator (``check``), so a typo
fails the job at its start, not at ``import hpcpar``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

__all__ = [
    "TRUE_WORDS",
    "FALSE_WORDS",
    "Setting",
    "TABLE",
    "lookup",
    "value",
    "flag",
    "flag_of",
    "is_set",
    "raw_key",
    "check",
    "unknown",
    "markdown_table",
    "READ_KINDS",
]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# when a setting is read
IMPORT = "import"  # once, when its module is imported
START = "start"  # once, when hpcpar first uses a communicator (or a command starts)
CALL = "call"  # on every call that uses it: it may change while a job runs
LAUNCH = "launch"  # by hpcpar launch, before any rank starts
JOBS = "jobs"  # by the batch scripts hpcpar jobs writes
TESTS = "tests"  # by the test suite


def _flag(name: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS or not word:
        return False
    raise UsageError(f"{name}={raw!r}: expected one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")


def _seconds(name: str, raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UsageError(f"{name}={raw!r}: expected a number of seconds above 0")
    return seconds


def _count(name: str, raw: str) -> int:
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{name}={raw!r}: expected a whole number of at least 1")
    return int(text)


def _whole(name: str, raw: str) -> int:
    text = raw.strip()
    if not text.isdigit():
        raise UsageError(f"{name}={raw!r}: expected a whole number of at least 0")
    return int(text)


def _text(_name: str, raw: str) -> str:
    return raw.strip()


def _choice(*words: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        word = raw.strip().lower()
        if word not in words:
            raise UsageError(f"{name}={raw!r}: expected {' or '.join(words)}")
        return word

    parse.words = words  # type: ignore[attr-defined]
    return parse


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "flag": _flag,
    "seconds": _seconds,
    "count": _count,
    "whole": _whole,
    "text": _text,
    "path": _text,
}


@dataclass(frozen=True)
class Setting:
    """One ``HPCPAR_*`` variable (``name`` ending in ``_`` names a family by prefix)."""

    name: str
    kind: str  # flag, seconds, count, whole, text, path, or choice
    default: str | None
    read: str  # import, start, call, launch, jobs or tests
    agree: bool  # the ranks of a communicator must run with the same value
    doc: str
    words: tuple[str, ...] = ()  # a choice's values

    def parse(self, name: str, raw: str) -> Any:
        """The value of ``raw`` for variable ``name`` (a family's member name)."""
        if self.kind == "choice":
            return _choice(*self.words)(name, raw)
        return _PARSERS[self.kind](name, raw)


TABLE: tuple[Setting, ...] = (
    Setting(
        "HPCPAR_LAYOUT",
        "text",
        None,
        START,
        True,
        "virtual node layout when none is given (`ppn:2`, `nodes:3,1`, `roundrobin:2`); "
        "collectives on a plain communicator read it when hpcpar first uses that "
        "communicator",
    ),
    Setting(
        "HPCPAR_TIMEOUT",
        "seconds",
        None,
        LAUNCH,
        False,
        "default `hpcpar launch --timeout`, in seconds",
    ),
    Setting(
        "HPCPAR_RESTARTS",
        "whole",
        "0",
        LAUNCH,
        False,
        "default `hpcpar launch --restarts`: start a job that failed again, up to this "
        "many times ([Recovery](recovery.md))",
    ),
    Setting(
        "HPCPAR_RESTART",
        "whole",
        "0",
        START,
        False,
        "set by `hpcpar launch` for the job: 0 at its first start, K in its K-th restart "
        "([Recovery](recovery.md))",
    ),
    Setting(
        "HPCPAR_RESTART_FAILED",
        "text",
        None,
        START,
        False,
        "set by `hpcpar launch` in a restarted job: the ranks whose failure ended the "
        "previous start, e.g. `1` or `2,3` ([Recovery](recovery.md))",
    ),
    Setting(
        "HPCPAR_MPIEXEC",
        "path",
        None,
        LAUNCH,
        False,
        "the `mpiexec` `hpcpar launch` uses, overriding the search",
    ),
    Setting(
        "HPCPAR_LAUNCHER",
        "choice",
        "auto",
        LAUNCH,
        False,
        "default `hpcpar launch --launcher`",
        ("auto", "mpiexec", "srun"),
    ),
    Setting(
        "HPCPAR_SRUN_MPI",
        "text",
        None,
        LAUNCH,
        False,
        "the `srun --mpi=` plugin (default `pmi2`, or `pmix` for Open MPI)",
    ),
    Setting(
        "HPCPAR_LOG_LEVEL",
        "text",
        None,
        START,
        False,
        "log level on every rank (a name such as `DEBUG`, or a number)",
    ),
    Setting(
        "HPCPAR_ABORT_ON_ERROR",
        "flag",
        "1",
        START,
        False,
        "`0` keeps Python's exception behaviour (default `1`: an uncaught exception "
        "aborts the job)",
    ),
    Setting(
        "HPCPAR_WATCHDOG",
        "seconds",
        None,
        START,
        False,
        "seconds a rank may wait in one call before the watchdog reports every rank's "
        "state and ends the job with status 4 (`hpcpar launch --watchdog S` sets it; "
        "[Troubleshooting](troubleshooting.md#a-job-hangs))",
    ),
    Setting(
        "HPCPAR_WATCHDOG_ACTION",
        "choice",
        "abort",
        START,
        False,
        "`abort` (default) or `report`: print the report and let the job go on",
        ("abort", "report"),
    ),
    Setting(
        "HPCPAR_INTERCEPT_SKIP",
        "text",
        None,
        START,
        True,
        "collectives an intercepted program leaves to the MPI library, e.g. "
        "`Allreduce,Bcast` ([Existing mpi4py programs](intercept.md))",
    ),
    Setting(
        "HPCPAR_INTERCEPT_REPORT",
        "path",
        None,
        START,
        False,
        "`-`: at exit rank 0 of an intercepted program prints which calls went to hpcpar "
        "and which to the MPI library, and why; a folder: every rank writes "
        "`intercept<R>.json` there",
    ),
    Setting(
        "HPCPAR_TRACE",
        "path",
        None,
        IMPORT,
        False,
        "a folder: every rank records each call and writes `rank<R>.json` there at "
        "exit, for `hpcpar trace` ([Troubleshooting](troubleshooting.md#tracing-a-job))",
    ),
    Setting(
        "HPCPAR_FLIGHT",
        "flag",
        "1",
        IMPORT,
        False,
        "`0` turns the flight record off (default on: each rank keeps its last 512 "
        "calls, [Troubleshooting](troubleshooting.md))",
    ),
    Setting(
        "HPCPAR_CHECK",
        "flag",
        "0",
        CALL,
        True,
        "`1` checks every collective's arguments across ranks (one small allgather a call)",
    ),
    Setting(
        "HPCPAR_COPY_THREADS",
        "count",
        None,
        START,
        False,
        "threads for one large copy (packing, checkpoint snapshots); default: the "
        "cores this rank may use divided by the ranks on its node",
    ),
    Setting(
        "HPCPAR_AUTOTUNE",
        "flag",
        "0",
        CALL,
        True,
        "`1`: `auto` allreduce times its best candidates on the first call of each "
        "size class and keeps the fastest",
    ),
    Setting(
        "HPCPAR_ALGORITHM_",
        "text",
        None,
        CALL,
        True,
        "the algorithm `auto` uses for that collective, e.g. `HPCPAR_ALGORITHM_ALLREDUCE=ring`",
    ),
    Setting(
        "HPCPAR_PROFILE",
        "path",
        None,
        CALL,
        True,
        "machine profile (JSON from `hpcpar calibrate`) that `auto` and `explain` "
        "use; ranks compare its content",
    ),
    Setting(
        "HPCPAR_RULES",
        "path",
        None,
        CALL,
        True,
        "a rules file of fixed algorithm choices by size, ranks and nodes, ahead of "
        "the model; ranks compare its content",
    ),
    Setting(
        "HPCPAR_SEGMENT_BYTES",
        "count",
        "262144",
        CALL,
        True,
        "segment size of the `pipelined` algorithms, in bytes (default 256 KiB)",
    ),
    Setting(
        "HPCPAR_VCLUSTER_DIR",
        "path",
        "/run/hpcpar-vcluster",
        CALL,
        False,
        "where `vcluster` keeps its state and launcher wrapper",
    ),
    Setting(
        "HPCPAR_ELASTIC_DIR",
        "path",
        None,
        CALL,
        False,
        "a folder: `hvd.elastic` state commits are checkpointed there, and "
        "`hvd.elastic.run` resumes from the newest, at any rank count "
        "([Horovod scripts](horovod.md#elastic))",
    ),
    Setting(
        "HPCPAR_CHECKPOINT_FAULT",
        "text",
        None,
        CALL,
        False,
        "inject a fault into checkpoint saves: `kill=PHASE` or `enospc=LEVEL`, with "
        "`step=`, `rank=` or `node=`, `level=`, `restart=`; several separated by `;` "
        "([Checkpointing](checkpointing.md))",
    ),
    Setting(
        "HPCPAR_EXIT_DIR",
        "path",
        None,
        START,
        False,
        "set by `hpcpar launch` for the job: where ranks mark that they started and "
        "exited normally, and where `faulthandler` writes a rank's fatal signal "
        "(unless the program enabled faulthandler itself)",
    ),
    Setting(
        "HPCPAR_RESULTS",
        "path",
        "results",
        JOBS,
        False,
        "where the batch scripts of `hpcpar jobs` (and `jobs/slurm/*.sbatch`) write their results",
    ),
    Setting(
        "HPCPAR_PLOTS",
        "flag",
        "1",
        CALL,
        False,
        "`0` skips the PNG plots that commands draw beside their results files",
    ),
    Setting(
        "HPCPAR_NO_GPU",
        "flag",
        "0",
        TESTS,
        False,
        "tests: `1` skips the GPU tests even where a GPU is found",
    ),
    Setting(
        "HPCPAR_TEST_GRACE",
        "seconds",
        "15",
        TESTS,
        False,
        "tests: seconds a rank whose test failed waits for the others",
    ),
    Setting(
        "HPCPAR_RELIABILITY_DIR",
        "path",
        None,
        TESTS,
        False,
        "tests: where each pytest session writes its reliability tallies "
        "(`python3 dev.py test` sets it and prints the totals)",
    ),
)

_BY_NAME = {s.name: s for s in TABLE}
_FAMILIES = tuple(s for s in TABLE if s.name.endswith("_"))


def lookup(name: str) -> Setting | None:
    """The table's entry for ``name`` (a family's member included), or None."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    return next((s for s in _FAMILIES if name.startswith(s.name) and name != s.name), None)


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of setting ``name``, its default when unset or empty.

    Raises:
        UsageError: a value that does not parse, naming the variable.
        KeyError: ``name`` is not in the table.
    """
    setting = lookup(name)
    if setting is None:
        raise KeyError(name)
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return None if setting.default is None else setting.parse(name, setting.default)
    return setting.parse(name, raw)


def flag(name: str, environ: Mapping[str, str] | None = None, strict: bool = True) -> bool:
    """A flag setting's value; ``strict=False`` takes a typo for the default (import)."""
    try:
        return bool(value(name, environ))
    except UsageError:
        if strict:
            raise
        return _flag(name, lookup(name).default or "0")  # type: ignore[union-attr]


def flag_of(name: str, raw: str | None) -> bool:
    """Flag ``name``'s value from its raw text (None: unset), for readers on every call.

    Raises:
        UsageError: a word that is neither true nor false, naming the variable.
    """
    if raw is None:
        return False
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS or not word:
        return False
    return _flag(name, raw)  # raises


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether setting ``name`` has a value (not unset, not empty), parsed or not."""
    if lookup(name) is None:
        raise KeyError(name)
    return bool((os.environ if environ is None else environ).get(name, "").strip())


def raw_key(name: str) -> bytes:
    """``name`` as the key of the raw environment (``runtime.env.RAW_ENVIRON``)."""
    if lookup(name) is None:
        raise KeyError(name)
    return os.fsencode(name)


def check(environ: Mapping[str, str] | None = None) -> None:
    """Parse every setting that is set (a typo fails here, at the start of a job).

    Raises:
        UsageError: the first value that does not parse, naming the variable.
    """
    env = os.environ if environ is None else environ
    for name in sorted(env):
        setting = lookup(name) if name.startswith("HPCPAR_") else None
        if setting is not None and setting.read not in (TESTS, JOBS) and env[name].strip():
            setting.parse(name, env[name])


READ_KINDS = {
    IMPORT: "at import",
    START: "at start",
    CALL: "every call",
    LAUNCH: "by `hpcpar launch`",
    JOBS: "by the batch scripts",
    TESTS: "by the tests",
}


def markdown_table() -> str:
    """The table as ``docs/environment.md`` shows it (a test keeps the two the same)."""
    rows = ["| variable | read | ranks agree | default | meaning |", "|---|---|---|---|---|"]
    for s in TABLE:
        name = f"{s.name}<COLLECTIVE>" if s.name.endswith("_") else s.name
        default = f"`{s.default}`" if s.default is not None else ""
        agree = "yes" if s.agree else ""
        rows.append(f"| `{name}` | {READ_KINDS[s.read]} | {agree} | {default} | {s.doc} |")
    return "\n".join(rows)


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``HPCPAR_*`` variables set that are no setting (a misspelt name, say)."""
    env = os.environ if environ is None else environ
    return sorted(n for n in env if n.startswith("HPCPAR_") and lookup(n) is None)
