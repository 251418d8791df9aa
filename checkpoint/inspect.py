"""Looking at a checkpoint directory without the job: versions per level, files, checksums."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .levels import LEVELS, file_levels
from .naming import parse_marker, parse_version
from .shard import decode_shard, read_bytes
from .state import CheckpointError, layouts_of, user_entries

__all__ = ["scan", "verify", "describe_state", "MAX_RANKS"]

MAX_RANKS = 1 << 24  # a rank count beyond any machine: a damaged or crafted description
_FILE = re.compile(r"^(rank|copy-rank)(\d+)\.(shard|parity|h5)$")


def _job(root: Path) -> dict[str, Any]:
    job = root / "hpcpar-checkpoint.json"
    try:
        doc = json.loads(job.read_text())
    except (OSError, ValueError):
        raise CheckpointError(
            f"{root} is not an hpcpar checkpoint (no readable {job.name})"
        ) from None
    except RecursionError:
        raise CheckpointError(f"{job} is not an hpcpar checkpoint description") from None
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != "hpcpar-checkpoint"
        or isinstance(ranks, bool)
        or not isinstance(ranks, int)
        or not 1 <= ranks <= MAX_RANKS
    ):
        raise CheckpointError(f"{job} is not an hpcpar checkpoint description")
    return doc


def scan(root: Path, local_dir: Path | None = None) -> dict[str, Any]:
    """Rank count, and per level: committed versions and every file found.

    Returns:
        ``{"ranks": N, "versions": {step: ranks that saved it}, "levels": {level:
        {"committed": [...], "files": {step: [(kind, rank, path)]}, "spares": [path,
        ...]}}}`` where kind is ``shard``, ``copy``, ``parity`` or ``h5``, and spares are
        pruned files kept for the next versions to write over (README, "Recycled
        files"). ``ranks`` is the last job's; a version saved by another number of ranks
        says so in ``versions``.

    Raises:
        CheckpointError: not an hpcpar checkpoint directory.
    """
    doc = _job(root)
    nodes = Path(local_dir) if local_dir is not None else root / "nodes"
    levels: dict[str, Any] = {}
    versions: dict[int, int] = {}
    for level in file_levels():
        cls = LEVELS[level]
        markers = root / "commits" / level
        found = {parse_marker(p.name): p for p in markers.glob("v*.committed")}
        committed = sorted((s for s in found if s is not None), reverse=True)
        for step in committed:
            versions.setdefault(step, _saved_ranks(found[step], doc["ranks"]))
        base, pattern = (nodes, f"node*/{level}/v*/*") if cls.node_local else (root / level, "v*/*")
        files: dict[int, list[tuple[str, int, Path]]] = {}
        if base.is_dir():
            for path in sorted(base.glob(pattern)):
                match = _FILE.match(path.name)
                version = parse_version(path.parent.name)
                if not match or version is None:
                    continue
                kind = {"shard": "shard", "parity": "parity", "h5": "h5"}[match.group(3)]
                if match.group(1) == "copy-rank":
                    kind = "copy"
                files.setdefault(version, []).append((kind, int(match.group(2)), path))
        spares = sorted(p for p in nodes.glob(f"node*/{level}/.spare/*") if p.is_file())
        if committed or files or spares:
            levels[level] = {"committed": committed, "files": files, "spares": spares}
    return {"ranks": doc["ranks"], "versions": versions, "levels": levels}


def _saved_ranks(marker: Path, default: int) -> int:
    """How many ranks saved the version a commit marker commits (its JSON says)."""
    try:
        doc = json.loads(marker.read_text())
    except (OSError, ValueError, RecursionError):
        return default
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    ok = isinstance(ranks, int) and not isinstance(ranks, bool) and 1 <= ranks <= MAX_RANKS
    return ranks if ok else default


def _check(level: str, kind: str, step: int, rank: int, path: Path) -> str:
    try:
        if kind == LEVELS[level].own_kind:
            LEVELS[level].read(path, step, rank)
        else:  # a partner's copy or parity: shards either way
            decode_shard(read_bytes(path), step, rank, where=str(path))
    except CheckpointError as exc:
        return str(exc)
    return ""


def verify(root: Path, local_dir: Path | None = None) -> list[tuple[str, int, int, str, str]]:
    """Check every file of every committed version.

    Returns:
        ``(level, step, rank, kind, problem or "")`` per file expected or found; a rank
        with no own shard (or HDF5 file) at a committed version is reported missing.
    """
    info = scan(root, local_dir)
    out = []
    for level, entry in info["levels"].items():
        own = LEVELS[level].own_kind
        for step in entry["committed"]:
            files = entry["files"].get(step, [])
            have = {r for kind, r, _ in files if kind == own}
            ranks = info["versions"].get(step, info["ranks"])
            out += [(level, step, r, own, "missing") for r in range(ranks) if r not in have]
            for kind, rank, path in files:
                out.append((level, step, rank, kind, _check(level, kind, step, rank, path)))
    return out


def _rows(flat: dict[str, Any]) -> list[tuple[str, str, str, int, str]]:
    layouts = layouts_of(flat)
    rows = []
    for key in sorted(set(user_entries(flat)) | set(layouts)):
        value, layout = flat.get(key), layouts.get(key, {})
        if layout.get("kind") == "sharded":
            offset, glob = tuple(layout.get("offset", ())), tuple(layout.get("global", ()))
            text = f"sharded: block at {offset} of {glob}"
        elif layout.get("kind") == "replicated":
            text = "replicated" + ("" if value is not None else " (kept in rank 0's file)")
        else:
            text = ""
        if isinstance(value, np.ndarray):
            rows.append((key, value.dtype.str, str(tuple(value.shape)), value.nbytes, text))
        elif value is None and text:
            rows.append((key, "", "", 0, text))
        else:
            rows.append((key, type(value).__name__, "", 0, repr(value)[:40]))
    return rows


def describe_state(
    root: Path, step: int | None, rank: int, level: str | None, local_dir: Path | None = None
) -> tuple[str, int, list[tuple[str, str, str, int, str]]]:
    """The entries of one rank's state at a version: name, dtype, shape, bytes, value.

    A declared leaf's value column gives its layout (``sharded: block at OFFSET of
    GLOBAL``, ``replicated``); the reserved entries (the tree, the layouts) are not rows.

    Args:
        root: The checkpoint root.
        step: The version (None: the newest committed one).
        rank: The rank.
        level: The level to read (None: the fastest that holds the version).
        local_dir: Node-local storage, if not ``root/nodes``.

    Returns:
        ``(level, step, rows)``.

    Raises:
        CheckpointError: no such version, rank or level, or the file is damaged.
    """
    info = scan(root, local_dir)
    choices = [level] if level else list(info["levels"])
    for name in choices:
        entry = info["levels"].get(name)
        if entry is None or not entry["committed"]:
            continue
        version = entry["committed"][0] if step is None else step
        if version not in entry["committed"]:
            continue
        ranks = info["versions"].get(version, info["ranks"])
        if not 0 <= rank < ranks:
            raise CheckpointError(f"rank {rank}: version {version} was saved by {ranks} ranks")
        kind = LEVELS[name].own_kind
        path = next(
            (p for k, r, p in entry["files"].get(version, []) if k == kind and r == rank), None
        )
        if path is None:
            raise CheckpointError(f"{name}: rank {rank} has no file of version {version}")
        flat = LEVELS[name].read(path, version, rank)
        return name, version, _rows(flat)
    what = f"version {step}" if step is not None else "no committed version"
    raise CheckpointError(f"{root}: {what} at {level or 'any level'}")
