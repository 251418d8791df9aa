"""``hpcpar checkpoint ls|verify|inspect|export|inject PATH``: look at, export, damage."""

from __future__ import annotations

import argparse
from typing import Any

from ..plugins import Command, register
from .common import integer

__all__: list[str] = []

_EPILOG = """\
actions:
  ls       versions per level: committed or not, files per version, bytes
  verify   every checksum of every committed version (exit 1 if any file is bad)
  inspect  the state of one rank at one version: keys, dtypes, shapes, sizes, values,
           and how each array is laid out (sharded: its block; replicated)
  export   one version (--step, default the newest) as one HDF5 file (--to FILE.h5)
           of global arrays: sharded ones assembled, replicated ones once, per-rank
           ones along a leading rank axis; values and the step as attributes.
           --to lies outside the checkpoint; --force replaces a regular file there
  inject   damage a checkpoint on purpose (to test restores):
             --fault delete-node --node N
             --fault flip --level L --step S --rank R [--offset B]
             --fault truncate-manifest --level L --step S --rank R
           crashes inside a running job are set with HPCPAR_CHECKPOINT_FAULT, e.g.
           kill=write,step=3,rank=1 (phases: snapshot, write, before-commit,
           after-commit) or enospc=local,step=3,rank=1
"""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("action", choices=("ls", "verify", "inspect", "export", "inject"))
    parser.add_argument("path", help="the checkpoint directory")
    parser.add_argument("--local-dir", help="node-local storage, if not PATH/nodes")
    parser.add_argument(
        "--step", type=integer(0, (1 << 64) - 1), help="version (inspect: default the newest)"
    )
    parser.add_argument("--rank", type=integer(0), default=None, help="rank (default 0)")
    parser.add_argument(
        "--level",
        help="a level with files: local, partner, xor, hdf5 (inspect: default the fastest "
        "that has the version)",
    )
    parser.add_argument(
        "--fault", choices=("delete-node", "flip", "truncate-manifest"), help="inject: what"
    )
    parser.add_argument("--node", type=integer(0), help="inject delete-node: the node index")
    parser.add_argument(
        "--to", help="export: the HDF5 file to write (outside the checkpoint's folders)"
    )
    parser.add_argument(
        "--force", action="store_true", help="export: replace --to if it is a regular file"
    )
    parser.add_argument(
        "--offset", type=integer(None), default=-100, help="inject flip: byte offset"
    )


def _ls(info: dict[str, Any]) -> None:
    from ..checkpoint import LEVELS

    print(f"last used by a job of {info['ranks']} rank(s)")
    if not info["levels"]:
        print("no versions")
    for level, entry in info["levels"].items():
        print(f"{level}: committed {', '.join(map(str, entry['committed'])) or 'none'}")
        for step in sorted(set(entry["files"]) | set(entry["committed"]), reverse=True):
            files = entry["files"].get(step, [])
            kinds: dict[str, int] = {}
            for kind, _, _ in files:
                kinds[kind] = kinds.get(kind, 0) + 1
            size = sum(p.stat().st_size for _, _, p in files)
            own = kinds.get(LEVELS[level].own_kind, 0)
            extra = "".join(
                f", {n} {k}" for k, n in sorted(kinds.items()) if k in ("copy", "parity")
            )
            state = "committed" if step in entry["committed"] else "not committed"
            ranks = info["versions"].get(step, info["ranks"])
            whole = "" if own == ranks else f" (of {ranks})"
            print(f"  v{step}: {own} shard(s){whole}{extra}, {size} bytes, {state}")
        if entry["spares"]:
            size = sum(p.stat().st_size for p in entry["spares"])
            count = len(entry["spares"])
            print(f"  spares: {count} file(s), {size} bytes (the next saves write over them)")


def _inject(root: Any, args: argparse.Namespace) -> str:
    from ..checkpoint import faults
    from ..checkpoint.state import CheckpointError

    if args.fault is None:
        raise CheckpointError("inject needs --fault delete-node|flip|truncate-manifest")
    if args.fault == "delete-node":
        if args.node is None:
            raise CheckpointError("--fault delete-node needs --node N")
        return f"deleted {faults.delete_node(root, args.node, args.local_dir)}"
    if args.level is None or args.step is None:
        raise CheckpointError(f"--fault {args.fault} needs --level, --step and --rank")
    path = faults.shard_path(root, args.level, args.step, args.rank or 0)
    if args.fault == "flip":
        faults.flip_bytes(path, args.offset)
        return f"flipped a byte of {path} at offset {args.offset}"
    faults.truncate_manifest(path)
    return f"truncated the manifest of {path}"


def _export(root: Any, args: argparse.Namespace) -> str:
    from pathlib import Path

    from ..checkpoint.export import export
    from ..checkpoint.state import CheckpointError

    if not args.to:
        raise CheckpointError("export needs --to FILE.h5")
    local = Path(args.local_dir) if args.local_dir else None
    step = export(root, Path(args.to), args.step, local, force=args.force)
    return f"exported version {step} of {root} to {args.to}"


def _run(comm: Any, args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..checkpoint import CheckpointError
    from ..checkpoint.inspect import describe_state, scan, verify
    from ..checkpoint.levels import file_levels

    root = Path(args.path)
    if args.level is not None and args.level not in file_levels():
        raise CheckpointError(
            f"--level {args.level!r}: choose a level with files ({', '.join(file_levels())})"
        )
    info = scan(root, args.local_dir)  # on every rank, so a bad path fails everywhere alike
    status = 0
    if comm.Get_rank() == 0:
        if args.action == "ls":
            print(f"checkpoint {root}: ", end="")
            _ls(info)
        elif args.action == "inspect":
            level, step, rows = describe_state(
                root, args.step, args.rank or 0, args.level, args.local_dir
            )
            print(f"checkpoint {root}: version {step}, rank {args.rank or 0}, from {level}")
            print(f"{'key':30s} {'dtype':>8s} {'shape':>16s} {'bytes':>12s}  value")
            for key, dtype, shape, nbytes, value in rows:
                print(f"{key:30s} {dtype:>8s} {shape:>16s} {nbytes:12d}  {value}")
        elif args.action == "inject":
            print(_inject(root, args))
        elif args.action == "export":
            print(_export(root, args))
        else:
            results = verify(root, args.local_dir)
            bad = [r for r in results if r[4]]
            for level, step, rank, kind, why in bad:
                print(f"  {level} v{step} rank {rank} ({kind}): {why}")
            print(
                f"verified {len(results) - len(bad)} of {len(results)} file(s) of committed "
                "versions" + ("" if not bad else f"; {len(bad)} bad"),
                flush=True,
            )
            status = 1 if bad else 0
    return comm.bcast(status, root=0) if comm.Get_size() > 1 else status


register(
    Command(
        "checkpoint",
        "look at a checkpoint directory (ls, verify, inspect) or damage it (inject)",
        _add_arguments,
        _run,
    )
)
