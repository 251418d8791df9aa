"""``hpcpar bench sat``: flips/s and time to solution against probSAT C and yalsat.

The peers are the probSAT C program (Balint's SC13 code), named with ``--peer-binary``,
and Armin Biere's yalsat, named with ``--yalsat-binary``, each built from its public
source outside the repository; without them only hpcpar is measured. Ratios are
against probSAT C (``vs peer``) and yalsat (``vs yalsat``). Per size n (uniform random
``--k``-SAT at ``--ratio``, or with ``--planted`` formulas satisfied by a hidden
assignment; the first instance seed whose formula hpcpar's probSAT solves within
``--budget`` flips with a seed outside the measured ones, so every solver gets the same
satisfiable instance):

- flips/s: ``--repeats`` runs of ``--flips`` flips each (seeds interleaved between
  the solvers) on a uniform instance of that size above the satisfiability threshold
  (ratio + 0.25, at least 5% over the threshold: almost surely unsatisfiable, so every
  run does all its flips); ``--rate-sizes`` are measured for this alone; each peer's
  figure is its own
  (probSAT: flips / CPU time of the search; yalsat: its reported flip rate), ours is
  flips / search seconds;
- time to solution: ``--seeds`` seeded runs each; the medians of the search time
  (ours: the compiled search; probSAT: its reported CPU time; yalsat: its flips over
  its flip rate) and of the wall time of a whole run (ours: from the parsed formula;
  the peers: the process, parsing included).

With more than one rank, also the portfolio: ``--portfolio-runs`` races of all ranks
on the smallest instance, the measured speedup (in flips of the winner, and in wall
time) against the speedup predicted from the sequential runs by order statistics.
All but rank 0 sleep while rank 0 measures the sequential figures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpcpar.bench.harness import Row, quartile_spread, rank0_printer
from hpcpar.cli.common import integer, real
from hpcpar.plugins import Benchmark, register

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(repeats=5)
    parser.add_argument("--sizes", default="200,400,600,1000", help="variables per instance")
    parser.add_argument(
        "--rate-sizes", default="", help="variables per instance measured for flips/s only"
    )
    parser.add_argument("--k", type=integer(3, 7), default=3, help="literals per clause (3)")
    parser.add_argument("--planted", action="store_true", help="planted (satisfiable) formulas")
    parser.add_argument(
        "--ratio",
        type=real(0, 1e6, above=True),
        default=None,
        help="clauses / variables (default by k: 4.26, 9.5, 20, 41, 85 for k = 3..7)",
    )
    parser.add_argument("--seeds", type=integer(1), default=20, help="runs per size (default 20)")
    parser.add_argument("--flips", type=integer(1), default=5_000_000, help="flips per rate run")
    parser.add_argument("--budget", type=integer(1), default=20_000_000, help="flips to call SAT")
    parser.add_argument("--portfolio-runs", type=integer(1), default=40)
    parser.add_argument("--peer-binary", metavar="PATH", help="probSAT built from its source")
    parser.add_argument("--yalsat-binary", metavar="PATH", help="yalsat built from its source")


# the uniform random k-SAT satisfiability thresholds (Mertens, Mezard and Zecchina), and
# the default ratios just below them
THRESHOLD = {3: 4.267, 4: 9.931, 5: 21.117, 6: 43.37, 7: 87.79}
RATIO = {3: 4.26, 4: 9.5, 5: 20.0, 6: 41.0, 7: 85.0}


def _instance(args: argparse.Namespace, n: int) -> tuple[Any, int]:
    from . import LocalSearch, random_ksat

    for seed in range(50):
        cnf, _ = random_ksat(n, round(args.ratio * n), args.k, seed=seed, planted=args.planted)
        if LocalSearch(cnf, "probsat", seed=10**6).run(args.budget):
            return cnf, seed
    raise RuntimeError(f"no satisfiable instance found for n={n} within the budget")


def _peer(binary: str, path: Path, seed: int, flips: int = 0) -> dict[str, float]:
    args = [binary]
    if flips:
        args += ["--maxflips", str(flips), "--runs", "1"]
    t0 = time.perf_counter()
    out = subprocess.run(
        [*args, str(path), str(seed)], capture_output=True, text=True, timeout=600, check=False
    ).stdout
    wall = time.perf_counter() - t0
    flips_done = float(re.search(r"numFlips\s*:\s*(\d+)", out).group(1))
    cpu = float(re.search(r"CPU Time\s*:\s*([\d.]+)", out).group(1))
    return {"flips": flips_done, "seconds": cpu, "wall": wall, "solved": "s SATISFIABLE" in out}


def _yalsat(binary: str, path: Path, seed: int, flips: int = 0) -> dict[str, float]:
    """One yalsat run; its search time from its flip count and reported flip rate."""
    args = [binary, "-v", "-n", str(path), str(seed), *([str(flips)] if flips else [])]
    t0 = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False).stdout
    wall = time.perf_counter() - t0
    found = re.search(r"c (\d+) flips, ([\d.]+) thousand flips per second", out)
    if found is None:
        raise RuntimeError(f"{binary} printed no flip statistics (is it yalsat?)")
    done, rate = float(found.group(1)), float(found.group(2)) * 1e3
    return {
        "flips": done,
        "seconds": done / rate if rate > 0 else 0.0,
        "wall": wall,
        "solved": "s SATISFIABLE" in out,
    }


def _ours(cnf: Any, seed: int, flips: int) -> dict[str, float]:
    from . import LocalSearch, check_model

    t0 = time.perf_counter()
    ls = LocalSearch(cnf, "probsat", seed=seed)
    solved = ls.run(flips)
    wall = time.perf_counter() - t0
    if solved and check_model(cnf, ls.model()) >= 0:
        raise AssertionError("false model")
    return {"flips": float(ls.flips), "seconds": ls.seconds, "wall": wall, "solved": solved}


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "spread_pct": quartile_spread(values),
    }


def _sequential(
    args: argparse.Namespace, sizes: list[int], rate_sizes: list[int], folder: Path
) -> list[dict]:
    """Rank 0: flips/s and time to solution of both solvers per size."""
    from . import write_dimacs

    docs = []
    for n in sorted({*sizes, *rate_sizes}):
        timed = n in sizes
        hard, _ = _hard(n, args.ratio, args.k)
        cnf, inst = _instance(args, n) if timed else (hard, 777)
        path = folder / f"uf{n}-{inst}.cnf"
        write_dimacs(cnf, path)
        _ours(hard, 0, 1000)  # compile outside the timing
        peers = {
            name: run
            for name, run, binary in (
                ("probsat-c", lambda p, s, f=0: _peer(args.peer_binary, p, s, f), args.peer_binary),
                (
                    "yalsat",
                    lambda p, s, f=0: _yalsat(args.yalsat_binary, p, s, f),
                    args.yalsat_binary,
                ),
            )
            if binary
        }
        rate: dict[str, list[float]] = {"hpcpar": [], **{name: [] for name in peers}}
        tts: dict[str, list[dict]] = {"hpcpar": [], **{name: [] for name in peers}}
        hard_path = folder / f"hard{n}.cnf"
        write_dimacs(hard, hard_path)
        for r in range(args.repeats):
            res = _ours(hard, 100 + r, args.flips)
            rate["hpcpar"].append(res["flips"] / res["seconds"])
            for name, run in peers.items():
                res = run(hard_path, 100 + r, args.flips)
                rate[name].append(res["flips"] / max(res["seconds"], 1e-9))
        for seed in range(1, args.seeds + 1 if timed else 1):
            tts["hpcpar"].append(_ours(cnf, seed, 10**10))
            for name, run in peers.items():
                tts[name].append(run(path, seed))
        for solver, rates in rate.items():
            if not rates:
                continue
            runs = tts[solver] or [
                {"seconds": np.nan, "wall": np.nan, "flips": np.nan, "solved": False}
            ]
            docs.append(
                {
                    "variant": solver,
                    "n": n,
                    "clauses": cnf.n_clauses,
                    "instance_seed": inst,
                    "flips_per_s": _stats(rates),
                    "time_to_solution_s": _stats([r["seconds"] for r in runs]),
                    "wall_to_solution_s": _stats([r["wall"] for r in runs]),
                    "flips_to_solution": _stats([r["flips"] for r in runs]),
                    "solved": sum(bool(r["solved"]) for r in tts[solver]),
                    "runs": len(tts[solver]),
                    "flips_sample": [r["flips"] for r in tts[solver]],
                    "k": args.k,
                    "ratio": args.ratio,
                    "planted": args.planted,
                }
            )
    return docs


def _hard(n: int, ratio: float, k: int = 3) -> tuple[Any, int]:
    """An instance for rate runs: the same size just above the threshold.

    At ratio + 0.25 and 5% over the threshold it is almost surely unsatisfiable, so
    every rate run does all its flips.
    """
    from . import random_ksat

    above = max(ratio + 0.25, 1.05 * THRESHOLD[k])
    return random_ksat(n, round(above * n), k, seed=777)[0], 777


def _portfolio(comm: Any, args: argparse.Namespace, cnf: Any, sample: list[float]) -> dict:
    from .portfolio import portfolio
    from .predict import expected_min, expected_min_empirical, fit_laws

    size = comm.Get_size()
    flips, walls = [], []
    for r in range(args.portfolio_runs):
        res = portfolio(cnf, comm, seed=5000 + 97 * r, check_every=1000)
        flips.append(res.flips)
        walls.append(res.seconds)
    fits = fit_laws(sample)
    mean = float(np.mean(sample))
    predicted = {law: expected_min(fit, 1) / expected_min(fit, size) for law, fit in fits.items()}
    predicted["empirical"] = mean / expected_min_empirical(sample, size)
    measured = mean / float(np.mean(flips))
    return {
        "ranks": size,
        "runs": len(flips),
        "measured_speedup_flips": measured,
        "predicted": predicted,
        "portfolio_flips_mean": float(np.mean(flips)),
        "portfolio_wall_median_s": statistics.median(walls),
        "measured_vs_empirical": measured / predicted["empirical"],
        "ks_pvalues": {law: fit.ks_pvalue for law, fit in fits.items()},
    }


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from hpcpar.errors import UsageError
    from hpcpar.runtime.comm import idle_barrier

    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        rate_sizes = [int(s) for s in args.rate_sizes.split(",") if s.strip()]
    except ValueError:
        raise UsageError(
            f"bench sat: --sizes and --rate-sizes take integers, not "
            f"{args.sizes!r} and {args.rate_sizes!r}"
        ) from None
    if not sizes or min(sizes + rate_sizes) < 10 or args.seeds < 3 or args.flips < 1:
        raise UsageError("bench sat: sizes >= 10, --seeds >= 3 and --flips >= 1")
    if args.ratio is None:
        args.ratio = RATIO[args.k]
    say = rank0_printer(comm, "sat", args.peer_binary)
    rank, size = comm.Get_rank(), comm.Get_size()
    kind = "planted" if args.planted else "uniform"
    say(
        f"# hpcpar bench sat: {kind} {args.k}-SAT at ratio {args.ratio}, sizes {sizes} "
        f"(flips/s only: {rate_sizes or 'none'}), "
        f"{args.seeds} seeds, rate runs {args.repeats} x {args.flips} flips; "
        f"peer {args.peer_binary or 'none (--peer-binary PATH)'}; yalsat "
        f"{args.yalsat_binary or 'none (--yalsat-binary PATH)'}; {size} rank(s)"
    )
    docs = None
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-sat-") as tmp:
        if rank == 0:
            docs = _sequential(args, sizes, rate_sizes, Path(tmp))
        idle_barrier(comm)
    docs = comm.bcast(docs, root=0)
    by = {(d["variant"], d["n"]): d for d in docs}
    say(
        f"# {'n':>5s} {'solver':10s} {'flips/s':>10s} {'spread%':>7s} {'vs peer':>7s} "
        f"{'vs yalsat':>9s} "
        f"{'tts median s':>12s} {'min':>9s} {'max':>9s} {'wall med s':>10s} {'flips med':>10s} "
        f"{'solved':>7s}"
    )
    rows = []
    for d in docs:
        for suffix, name in (("peer", "probsat-c"), ("yalsat", "yalsat")):
            other = by.get((name, d["n"]))
            d[f"flips_per_s_vs_{suffix}"] = (
                d["flips_per_s"]["median"] / other["flips_per_s"]["median"] if other else None
            )
            d[f"time_to_solution_vs_{suffix}"] = (
                other["time_to_solution_s"]["median"] / d["time_to_solution_s"]["median"]
                if other and d["time_to_solution_s"]["median"] > 0
                else None
            )
        ratio, ratio_y = d["flips_per_s_vs_peer"], d["flips_per_s_vs_yalsat"]
        t = d["time_to_solution_s"]
        vs = "-" if ratio is None else f"{ratio:.2f}"
        vs_y = "-" if ratio_y is None else f"{ratio_y:.2f}"
        say(
            f"  {d['n']:5d} {d['variant']:10s} {d['flips_per_s']['median']:10.3e} "
            f"{d['flips_per_s']['spread_pct']:7.1f} {vs:>7s} {vs_y:>9s} "
            f"{t['median']:12.4f} {t['min']:9.4f} {t['max']:9.4f} "
            f"{d['wall_to_solution_s']['median']:10.4f} "
            f"{d['flips_to_solution']['median']:10.0f} {d['solved']:4d}/{d['runs']}"
        )
        rows.append(Row({**d, "valid": d["solved"] == d["runs"]}, size_key="n"))
    if size > 1:
        from . import random_ksat

        small = min(sizes)
        inst = by[("hpcpar", small)]["instance_seed"]
        cnf, _ = random_ksat(
            small, round(args.ratio * small), args.k, seed=inst, planted=args.planted
        )
        sample = None
        if rank == 0:  # a larger sequential sample for the prediction (cheap at this size)
            sample = [
                _ours(cnf, 10**7 + i, 10**10)["flips"] for i in range(4 * args.portfolio_runs)
            ]
        idle_barrier(comm)
        sample = comm.bcast(sample, root=0)
        p = _portfolio(comm, args, cnf, sample)
        pred = ", ".join(f"{k} {v:.2f}" for k, v in p["predicted"].items())
        say(
            f"# portfolio on uf{small}: {size} ranks, {p['runs']} races: measured speedup "
            f"{p['measured_speedup_flips']:.2f} (flips of the winner); predicted: {pred}; "
            f"measured / empirical prediction {p['measured_vs_empirical']:.2f}"
        )
        rows.append(Row({"variant": "hpcpar-portfolio", "n": small, **p}, size_key="n"))
    return rows


register(
    Benchmark(
        "sat",
        "SAT local search: flips/s and time to solution vs probSAT C and yalsat; portfolio",
        _add_arguments,
        _run,
        peer="probsat-c",
    )
)
