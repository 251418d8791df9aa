"""``hpcpar cfr``: solve a game with CFR, log exploitability, checkpoint, export the policy."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hpcpar.cli.common import (
    add_checkpoint_arguments,
    add_layout_argument,
    integer,
    output_path,
    real,
)
from hpcpar.plugins import Command, register
from hpcpar.runtime.plots import pyplot, save

__all__: list[str] = []

_ALGORITHMS = ("cfr", "cfr+", "lcfr", "dcfr", "pcfr+")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--game",
        default="leduc_poker",
        help="kuhn_poker, leduc_poker (built in) or any two-player zero-sum OpenSpiel "
        "game string, e.g. 'liars_dice(numdice=1)' (default leduc_poker)",
    )
    parser.add_argument("--tree", metavar="FILE", help="load a compiled tree (.npz/.h5)")
    parser.add_argument(
        "--save-tree", type=output_path, metavar="FILE", help="save the compiled tree here"
    )
    parser.add_argument(
        "--source", choices=("auto", "builtin", "openspiel"), default="auto", help="game source"
    )
    parser.add_argument("--algorithm", choices=_ALGORITHMS, default="dcfr", help="default dcfr")
    parser.add_argument(
        "--simultaneous", action="store_true", help="simultaneous updates (cfr only)"
    )
    parser.add_argument("--alpha", type=real(), default=1.5, help="DCFR alpha (default 1.5)")
    parser.add_argument("--beta", type=real(), default=0.0, help="DCFR beta (default 0)")
    parser.add_argument("--gamma", type=real(), default=2.0, help="DCFR gamma (default 2)")
    parser.add_argument(
        "--iterations", type=integer(1), default=1000, help="at most (default 1000)"
    )
    parser.add_argument(
        "--target-exploitability", type=real(0, above=True), metavar="E", help="stop once below E"
    )
    parser.add_argument(
        "--eval-every", type=integer(1), default=10, metavar="K", help="exploitability every K (10)"
    )
    parser.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (resumes)")
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=None,
        metavar="K",
        help="save every K iterations (with --checkpoint, default: every --eval-every; "
        "0: only resume, never save)",
    )
    parser.add_argument(
        "--out",
        type=output_path,
        metavar="FILE",
        help="results JSON; also FILE.csv and, with matplotlib, FILE.png",
    )
    parser.add_argument(
        "--policy", type=output_path, metavar="FILE", help="write the average policy (JSON)"
    )
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    add_layout_argument(parser)


def _check(args: argparse.Namespace) -> None:
    from hpcpar.errors import UsageError

    if args.iterations < 1:
        raise UsageError(f"cfr: --iterations must be at least 1, not {args.iterations}")
    if args.eval_every < 1:
        raise UsageError(f"cfr: --eval-every must be at least 1, not {args.eval_every}")
    if args.checkpoint_every and not args.checkpoint:
        raise UsageError("cfr: --checkpoint-every needs --checkpoint DIR")
    if args.checkpoint_every is None:
        args.checkpoint_every = args.eval_every if args.checkpoint else 0
    if args.target_exploitability is not None and not args.target_exploitability > 0:
        raise UsageError("cfr: --target-exploitability must be positive")


def _run(comm: Any, args: argparse.Namespace) -> int:
    from hpcpar.topology import Hierarchy

    from .solver import Solver

    _check(args)
    rank = comm.Get_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    start = time.perf_counter()
    tree = _tree(args, say)
    if args.save_tree and rank == 0:
        tree.save(args.save_tree)
    h = Hierarchy(comm, layout=args.layout)
    solver = Solver(
        tree,
        args.algorithm,
        alternating=not args.simultaneous,
        alpha=args.alpha,
        beta=args.beta,
        gamma=args.gamma,
        comm=h,
        device=args.device,
    )
    built = time.perf_counter() - start
    say(
        f"# hpcpar cfr: {tree.name}, {tree.n_nodes} nodes, "
        f"{tree.players[0].n_infosets}+{tree.players[1].n_infosets} infosets; "
        f"{args.algorithm}, {comm.Get_size()} rank(s); built in {built:.2f} s",
        flush=True,
    )
    ck = None
    if args.checkpoint:
        from hpcpar.checkpoint import Checkpointer

        ck = Checkpointer(
            args.checkpoint,
            comm=h,
            levels=args.checkpoint_levels,
            local_dir=args.checkpoint_local,
        )
        if ck.versions():
            _, state = ck.restore(reshard=solver.blocks())  # saved on any number of ranks
            solver.load_state(state)
            say(f"# resumed at iteration {solver.t} (from {','.join(set(ck.restored_from))})")
    rows: list[dict[str, Any]] = []
    clock = 0.0
    try:
        while solver.t < args.iterations:
            todo = min(args.eval_every - solver.t % args.eval_every, args.iterations - solver.t)
            if args.checkpoint_every:
                todo = min(todo, args.checkpoint_every - solver.t % args.checkpoint_every)
            t0 = time.perf_counter()
            solver.iterate(todo)
            clock += time.perf_counter() - t0
            if ck is not None and args.checkpoint_every and solver.t % args.checkpoint_every == 0:
                ck.save(solver.t, solver.state())
            if solver.t % args.eval_every == 0 or solver.t == args.iterations:
                gap = solver.exploitability()
                rows.append({"iteration": solver.t, "seconds": clock, "exploitability": gap})
                say(
                    f"  iteration {solver.t:7d}  {clock:9.3f} s  exploitability {gap:.3e}",
                    flush=True,
                )
                if args.target_exploitability and gap < args.target_exploitability:
                    break
    finally:
        if ck is not None:
            ck.close(sync=sys.exc_info()[0] is None)  # no barrier on an error path
    _write(comm, args, solver, rows, h)
    h.free()
    return 0


def _tree(args: argparse.Namespace, say: Any) -> Any:
    """The game's tree, loaded or built (a line of progress every 2 s while it is built)."""
    from .tree import build_tree, load_tree

    if args.tree:
        return load_tree(args.tree)
    last = time.perf_counter()

    def building(nodes: int) -> None:
        nonlocal last
        if time.perf_counter() - last >= 2.0:
            last = time.perf_counter()
            say(f"# building the tree of {args.game}: {nodes:,} nodes walked", flush=True)

    return build_tree(args.game, args.source, building)


def _write(comm: Any, args: argparse.Namespace, solver: Any, rows: list, h: Any) -> None:
    from hpcpar.runtime.results import atomic_write, write_csv, write_json

    policy = solver.average_policy()  # collective
    rank = comm.Get_rank()
    if args.out:
        params = {k: v for k, v in vars(args).items() if k != "hpcpar_command"}
        summary = {
            "game": solver.tree.name,
            "algorithm": solver.algorithm,
            "iterations": solver.t,
            "exploitability": rows[-1]["exploitability"] if rows else None,
            "curve": rows,
        }
        write_json(args.out, summary, comm=comm, layout=args.layout, parameters=params)
        base = Path(args.out).with_suffix("")
        write_csv(f"{base}.csv", rows, comm=comm)
        if rank == 0:
            _plot(rows, f"{base}.png", solver)
    if args.policy and rank == 0:
        doc = {"game": solver.tree.name, "players": policy}
        atomic_write(Path(args.policy), json.dumps(doc) + "\n")


def _plot(rows: list[dict[str, Any]], path: str, solver: Any) -> None:
    """Exploitability against iterations and against seconds, on log axes."""
    plt = pyplot()
    if plt is None or not rows:
        return
    fig, (by_iteration, by_time) = plt.subplots(1, 2, figsize=(8, 3.5), sharey=True)
    gaps = [r["exploitability"] for r in rows]
    by_iteration.loglog([r["iteration"] for r in rows], gaps, marker=".")
    by_iteration.set_xlabel("iterations")
    by_iteration.set_ylabel("exploitability")
    by_time.loglog([max(r["seconds"], 1e-6) for r in rows], gaps, marker=".")
    by_time.set_xlabel("seconds")
    for ax in (by_iteration, by_time):
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # decades only: no crowded labels
    fig.suptitle(f"{solver.algorithm} on {solver.tree.name}")
    save(fig, path)


register(
    Command(
        "cfr",
        "solve a two-player zero-sum game with CFR (cfr, cfr+, lcfr, dcfr, pcfr+)",
        _add_arguments,
        _run,
    )
)
