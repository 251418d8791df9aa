"""``hpcpar checkpoint ls|verify PATH``: versions, shards and checksums of a checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from .registry import Command, register

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("ls", "verify"), help="ls: versions and shards; verify: checksums"
    )
    parser.add_argument("path", help="the checkpoint directory")


def _run(comm: Any, args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..checkpoint.inspect import scan, verify

    root = Path(args.path)
    info = scan(root)  # on every rank, so a bad path fails everywhere alike
    if comm.Get_rank() != 0:
        return 0 if args.action == "ls" else comm.bcast(None, root=0)
    if args.action == "ls":
        print(f"checkpoint {root}: written by {info['ranks']} rank(s)")
        print(f"committed versions: {', '.join(map(str, info['committed'])) or 'none'}")
        for step in sorted(info["shards"], reverse=True):
            ranks = sorted(info["shards"][step])
            size = sum(f.stat().st_size for r in ranks for f in info["shards"][step][r].iterdir())
            state = "committed" if step in info["committed"] else "not committed"
            print(f"  v{step}: {len(ranks)} shard(s), {size} bytes, {state}")
        return 0
    results = verify(root)
    bad = [(s, r, why) for s, r, why in results if why]
    for step, rank, why in bad:
        print(f"  v{step} rank {rank}: {why}")
    print(
        f"verified {len(results) - len(bad)} of {len(results)} shard(s) of committed versions"
        + ("" if not bad else f"; {len(bad)} bad"),
        flush=True,
    )
    status = 1 if bad else 0
    return comm.bcast(status, root=0) if comm.Get_size() > 1 else status


register(
    Command(
        "checkpoint",
        "inspect a checkpoint directory: ls (versions, shards) or verify (checksums)",
        _add_arguments,
        _run,
    )
)
