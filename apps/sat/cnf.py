"""CNF formulas: a strict streaming DIMACS reader, a writer, random k-SAT and a model check.

A formula is held flat: ``lits`` (int32 DIMACS literals, clause after clause) and
``starts`` (where each clause begins; ``starts[-1] == lits.size``). The reader takes
plain, gzip, xz and bzip2 files (recognised by their first bytes, not their names),
reads them line by line, and stops at the first problem with its line number: a missing
or malformed ``p cnf`` header, a token that is not an integer, a literal out of range,
an empty clause, a last clause without its terminating 0, a clause count that disagrees
with the header, or bytes that are not text. SATLIB's ``%`` end marker is accepted.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from hpcpar.errors import HpcparError

__all__ = ["CNF", "SatError", "read_dimacs", "write_dimacs", "random_ksat", "check_model"]


class SatError(HpcparError):
    """A formula, file or solver parameter the SAT app cannot use."""


@dataclass
class CNF:
    """A formula in conjunctive normal form (see the module docstring)."""

    n_vars: int
    lits: np.ndarray
    starts: np.ndarray

    @property
    def n_clauses(self) -> int:
        """Number of clauses."""
        return int(self.starts.size - 1)

    def clause(self, i: int) -> np.ndarray:
        """The DIMACS literals of clause ``i``."""
        return self.lits[self.starts[i] : self.starts[i + 1]]

    @classmethod
    def from_clauses(cls, n_vars: int, clauses: list[list[int]]) -> CNF:
        """A formula from a list of clauses (lists of non-zero DIMACS literals).

        Raises:
            SatError: an empty clause or a literal out of ``1..n_vars``.
        """
        lits = np.array([lit for c in clauses for lit in c], dtype=np.int64)
        if any(not c for c in clauses):
            raise SatError("empty clause")
        if lits.size and (np.abs(lits).max() > n_vars or np.any(lits == 0)):
            raise SatError(f"literal out of range 1..{n_vars}")
        starts = np.zeros(len(clauses) + 1, dtype=np.int64)
        starts[1:] = np.cumsum([len(c) for c in clauses])
        return cls(int(n_vars), lits.astype(np.int32), starts)


_MAGIC = ((b"\x1f\x8b", gzip.open), (b"\xfd7zXZ\x00", lzma.open), (b"BZh", bz2.open))


def _open(path: Path) -> IO[bytes]:
    try:
        with open(path, "rb") as f:
            head = f.read(6)
        for magic, opener in _MAGIC:
            if head.startswith(magic):
                return opener(path, "rb")  # type: ignore[operator]
        return open(path, "rb")
    except OSError as exc:
        raise SatError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a possibly compressed file, refusing binary data."""
    number = 0
    try:
        with _open(path) as f:
            for number, raw in enumerate(f, start=1):
                if b"\x00" in raw:
                    raise SatError(f"{path}: line {number}: binary data, not a DIMACS CNF file")
                try:
                    yield number, raw.decode("ascii")
                except UnicodeDecodeError:
                    raise SatError(
                        f"{path}: line {number}: binary data, not a DIMACS CNF file"
                    ) from None
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise SatError(f"{path}: line {number + 1}: corrupt compressed data ({exc})") from None


def _header(path: Path, number: int, tokens: list[str], text: str) -> tuple[int, int]:
    """(variables, clauses) of a ``p cnf`` line."""
    counts = (-1, -1)
    if len(tokens) == 4 and tokens[1] == "cnf":
        with contextlib.suppress(ValueError):
            counts = (int(tokens[2]), int(tokens[3]))
    if min(counts) < 0:
        raise SatError(
            f"{path}: line {number}: header must be 'p cnf VARIABLES CLAUSES' with counts "
            f">= 0, not {text.strip()[:60]!r}"
        )
    return counts


def read_dimacs(path: str | Path) -> CNF:  # noqa: PLR0912  (one pass, a check per rule)
    """Read a DIMACS CNF file (plain, .gz, .xz or .bz2), checking it strictly.

    Raises:
        SatError: naming the line and what is wrong with it.
    """
    path = Path(path)
    n_vars = n_decl = -1
    lits = array("i")  # 4 bytes a literal, not a Python int each: large files fit
    starts = array("q", [0])
    pending = 0  # literals of the clause being read
    last = 0
    for number, text in _lines(path):
        last = number
        tokens = text.split()
        if not tokens or tokens[0].startswith("c"):
            continue
        if tokens[0] == "%":  # SATLIB's end marker
            break
        if tokens[0] == "p":
            if n_vars >= 0:
                raise SatError(f"{path}: line {number}: a second 'p cnf' header")
            n_vars, n_decl = _header(path, number, tokens, text)
            continue
        if n_vars < 0:
            raise SatError(f"{path}: line {number}: clause before the 'p cnf' header")
        if pending == 0 and tokens[-1] == "0" and len(tokens) > 1:  # fast path: one clause
            try:
                values = list(map(int, tokens))
            except ValueError:
                values = []
            if values and 0 not in values[:-1] and max(map(abs, values)) <= n_vars:
                lits.extend(values[:-1])
                starts.append(len(lits))
                continue
        for token in tokens:  # the general path, which also names what is wrong
            try:
                lit = int(token)
            except ValueError:
                raise SatError(
                    f"{path}: line {number}: {token[:20]!r} is not an integer literal"
                ) from None
            if lit == 0:
                if pending == 0:
                    raise SatError(f"{path}: line {number}: empty clause (a 0 with no literals)")
                starts.append(len(lits))
                pending = 0
            elif abs(lit) > n_vars:
                raise SatError(
                    f"{path}: line {number}: literal {lit} out of range "
                    f"(the header declares {n_vars} variables)"
                )
            else:
                lits.append(lit)
                pending += 1
    if n_vars < 0:
        raise SatError(f"{path}: no 'p cnf' header (empty file or not DIMACS CNF)")
    if pending:
        raise SatError(f"{path}: line {last}: the last clause has no terminating 0")
    if len(starts) - 1 != n_decl:
        raise SatError(
            f"{path}: the header declares {n_decl} clauses but the file has {len(starts) - 1}"
        )
    return CNF(
        n_vars,
        np.frombuffer(lits, dtype=np.int32).copy(),
        np.frombuffer(starts, dtype=np.int64).copy(),
    )


def write_dimacs(cnf: CNF, path: str | Path, comments: list[str] | None = None) -> None:
    """Write ``cnf`` as DIMACS (gzip, xz or bzip2 when the name ends .gz, .xz, .bz2)."""
    path = Path(path)
    openers: dict[str, Any] = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
    lines = [f"c {c}" for c in comments or []]
    lines.append(f"p cnf {cnf.n_vars} {cnf.n_clauses}")
    for i in range(cnf.n_clauses):
        lines.append(" ".join(map(str, cnf.clause(i).tolist())) + " 0")
    data = ("\n".join(lines) + "\n").encode()
    tmp = path.with_name(path.name + ".tmp")
    with openers.get(path.suffix, open)(tmp, "wb") as f:
        f.write(data)
    tmp.replace(path)  # never a half-written formula under the final name


def random_ksat(
    n: int, m: int, k: int = 3, seed: int = 0, planted: bool = False
) -> tuple[CNF, np.ndarray | None]:
    """SATLIB-style uniform random k-SAT: m clauses of k distinct variables, random signs.

    With ``planted``, a hidden assignment is drawn first and each clause is drawn
    uniformly among those it satisfies (signs redrawn until satisfied), so the formula
    is satisfiable; the assignment is returned (bools, variable 1 first), else ``None``.

    Raises:
        SatError: ``k`` not in ``1..n`` or ``m < 1``.
    """
    if not 1 <= k <= n or m < 1:
        raise SatError(f"random k-SAT needs 1 <= k <= n and m >= 1 (n={n}, m={m}, k={k})")
    rng = np.random.default_rng(seed)
    var = rng.integers(1, n + 1, size=(m, k))
    while True:  # redraw the clauses that repeat a variable
        s = np.sort(var, axis=1)
        bad = np.flatnonzero(np.any(s[:, 1:] == s[:, :-1], axis=1)) if k > 1 else []
        if not len(bad):
            break
        var[bad] = rng.integers(1, n + 1, size=(len(bad), k))
    sign = rng.random((m, k)) < 0.5
    hidden = None
    if planted:
        hidden = rng.random(n) < 0.5
        while True:
            sat = np.any(hidden[var - 1] == sign, axis=1)
            bad = np.flatnonzero(~sat)
            if not bad.size:
                break
            sign[bad] = rng.random((bad.size, k)) < 0.5
    lits = np.where(sign, var, -var).astype(np.int32).ravel()
    return CNF(n, lits, np.arange(0, m * k + 1, k, dtype=np.int64)), hidden


def check_model(cnf: CNF, model: np.ndarray) -> int:
    """The first clause ``model`` (bools, variable 1 first) falsifies, or -1 if none.

    Raises:
        SatError: ``model`` has the wrong length.
    """
    model = np.asarray(model, dtype=bool)
    if model.shape != (cnf.n_vars,):
        raise SatError(f"model has {model.size} values for {cnf.n_vars} variables")
    if cnf.n_clauses == 0:
        return -1
    true = model[np.abs(cnf.lits) - 1] == (cnf.lits > 0)
    sat = np.logical_or.reduceat(true, cnf.starts[:-1])
    bad = np.flatnonzero(~sat)
    return int(bad[0]) if bad.size else -1
