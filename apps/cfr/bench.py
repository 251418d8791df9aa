"""``hpcpar bench cfr``: time per iteration and exploitability vs time, against OpenSpiel.

Per game, in the same run: hpcpar's CFR, CFR+, DCFR and PCFR+ (on every rank of the
job), OpenSpiel's C++ ``CFRSolver`` and ``CFRPlusSolver`` (``pyspiel``) and its Python
``DCFRSolver`` (rank 0 only; the other ranks wait). Time per iteration is the median of
``--repeats`` timings of a block of iterations; the ratio is OpenSpiel C++ CFR's time
over the variant's (higher is faster). Exploitability-vs-time curves run each solver
for ``--budget`` seconds, evaluating the average policy (outside the timed part) with
hpcpar's exact best response, which the tests check against OpenSpiel's.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from hpcpar.bench.harness import Row
from hpcpar.cli.common import real
from hpcpar.plugins import Benchmark, register

__all__: list[str] = []

GAMES = {
    "kuhn_poker": "kuhn_poker",
    "leduc_poker": "leduc_poker",
    "liars_dice": "liars_dice(numdice=1,dice_sides=6)",
}
OURS = ("cfr", "cfr+", "dcfr", "pcfr+")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(repeats=5)
    parser.add_argument(
        "--games", default=",".join(GAMES), help=f"comma-separated, from {', '.join(GAMES)}"
    )
    parser.add_argument(
        "--budget",
        type=real(0, above=True),
        default=2.0,
        metavar="S",
        help="seconds per curve (default 2)",
    )
    parser.add_argument("--no-python-dcfr", action="store_true", help="skip OpenSpiel's DCFR")


def _policy_gap(solver: Any, policy: Any) -> float:
    """NashConv/2 of an OpenSpiel policy, loaded as ``solver``'s average strategy."""
    if hasattr(policy, "get_state_policy"):  # pyspiel.Policy (the C++ solvers)

        def probs(key: str) -> dict[int, float]:
            return dict(policy.get_state_policy(key))
    else:  # open_spiel.python.policy.TabularPolicy

        def probs(key: str) -> dict[int, float]:
            return dict(enumerate(policy.policy_for_key(key)))

    for p, part in enumerate(solver.parts):
        seqs = solver.tree.players[p]
        inf_of = seqs.infoset_of_seq()
        cache: dict[int, dict[int, float]] = {}
        sums = np.zeros(part.L)
        for j, s in enumerate(part.old_seqs):
            i = int(inf_of[s])
            if i not in cache:
                cache[i] = probs(str(seqs.keys[i]))
            sums[j] = cache[i].get(int(seqs.actions[s]), 0.0)
        solver.strategy_sum[p] = solver.xp.asarray(sums)
    return solver.exploitability()


def _agree(comm: Any, value: Any) -> Any:
    """Rank 0's value on every rank (loop decisions must match in collective code)."""
    return comm.bcast(value, root=0) if comm is not None else value


def _per_iteration(step: Any, repeats: int, block_s: float = 0.2, comm: Any = None) -> list[float]:
    step()  # warm-up
    t0 = time.perf_counter()
    step()
    once = max(time.perf_counter() - t0, 1e-6)
    n = _agree(comm, max(1, int(block_s / once)))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        out.append((time.perf_counter() - t0) / n)
    return out


def _curve(step: Any, gap: Any, budget: float, comm: Any = None) -> list[tuple[int, float, float]]:
    points, clock, iters, block = [], 0.0, 0, 1
    while _agree(comm, clock < budget):
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        clock += time.perf_counter() - t0
        iters += block
        points.append((iters, clock, gap()))
        block = max(1, int(block * 1.5))
    return points


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from hpcpar.errors import UsageError
    from hpcpar.runtime.results import mpi_library
    from hpcpar.topology import Hierarchy

    from . import Solver, build_tree

    games = [g.strip() for g in args.games.split(",") if g.strip()]
    bad = [g for g in games if g not in GAMES]
    if bad or not games:
        raise UsageError(f"bench cfr: unknown game(s) {bad}; choose from {', '.join(GAMES)}")
    if args.budget <= 0 or args.repeats < 1:
        raise UsageError("bench cfr: --budget and --repeats must be positive")
    try:
        import pyspiel
        from open_spiel.python.algorithms import discounted_cfr
    except ImportError:
        raise UsageError("bench cfr: the peer is OpenSpiel; pip install open_spiel") from None
    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    h = Hierarchy(comm, layout=args.layout)
    say(
        f"# hpcpar bench cfr: {size} rank(s) (layout {args.layout or 'real'}); {mpi_library()}; "
        f"peer: OpenSpiel {getattr(pyspiel, '__version__', '')} C++ CFRSolver; "
        f"median of {args.repeats}; curves {args.budget:g} s each"
    )
    say(
        f"# {'game':12s} {'variant':18s} {'s/iter':>10s} {'min':>10s} {'max':>10s} "
        f"{'speedup':>8s} {'iters':>7s} {'exploit.':>10s}"
    )
    rows = []
    for name in games:
        spec = GAMES[name]
        tree = build_tree(spec, source="openspiel")  # OpenSpiel's keys, to evaluate its policies
        game = pyspiel.load_game(spec)
        results: dict[str, dict[str, Any]] = {}
        for alg in OURS:
            solver = Solver(tree, alg, comm=h)
            times = _per_iteration(solver.iterate, args.repeats, comm=comm)
            fresh = Solver(tree, alg, comm=h)
            curve = _curve(fresh.iterate, fresh.exploitability, args.budget, comm=comm)
            results[f"hpcpar-{alg}"] = {"times": times, "curve": curve}
        peers: dict[str, Any] = {
            "openspiel-cpp-cfr": pyspiel.CFRSolver,
            "openspiel-cpp-cfr+": pyspiel.CFRPlusSolver,
        }
        if not args.no_python_dcfr:
            peers["openspiel-py-dcfr"] = discounted_cfr.DCFRSolver
        judge = Solver(tree, "cfr")  # one rank: evaluates peer policies on rank 0
        for label, make in peers.items():
            if rank == 0:
                ref = make(game)
                reps = args.repeats if "cpp" in label else 1
                times = _per_iteration(ref.evaluate_and_update_policy, reps, block_s=0.5)
                ref = make(game)
                curve = _curve(
                    ref.evaluate_and_update_policy,
                    lambda ref=ref, judge=judge: _policy_gap(judge, ref.average_policy()),
                    args.budget,
                )
                results[label] = {"times": times, "curve": curve}
            comm.Barrier()
        results = comm.bcast(results if rank == 0 else None, root=0) if size > 1 else results
        base = float(np.median(results["openspiel-cpp-cfr"]["times"]))
        for label, res in results.items():
            t = res["times"]
            med = float(np.median(t))
            last = res["curve"][-1]
            say(
                f"  {name:12s} {label:18s} {med:10.2e} {min(t):10.2e} {max(t):10.2e} "
                f"{base / med:8.2f} {last[0]:7d} {last[2]:10.3e}",
                flush=True,
            )
            rows.append(
                Row(
                    {
                        "game": name,
                        "variant": label,
                        "ranks": size,
                        "nodes": tree.n_nodes,
                        "s_per_iter_median": med,
                        "s_per_iter_min": min(t),
                        "s_per_iter_max": max(t),
                        "speedup_vs_openspiel_cpp_cfr": base / med,
                        "curve": [
                            {"iteration": i, "seconds": s, "exploitability": e}
                            for i, s, e in res["curve"]
                        ],
                    },
                    size_key="game",
                )
            )
    h.free()
    return rows


register(
    Benchmark(
        "cfr",
        "CFR variants: time per iteration and exploitability vs time, against OpenSpiel",
        _add_arguments,
        _run,
        peer="openspiel-cpp-cfr",
    )
)
