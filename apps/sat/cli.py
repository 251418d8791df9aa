"""``hpcpar sat solve|generate|predict``: local search, random k-SAT, speedup prediction."""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from hpcpar.cli.common import add_layout_argument, integer, output_path, real
from hpcpar.plugins import Command, register
from hpcpar.runtime.plots import pyplot, save

__all__: list[str] = []

_EPILOG = """\
actions:
  solve FILE      search for a model; SAT competition output (c comments, s SATISFIABLE
                  and v lines, or s UNKNOWN); exit status 10 when satisfiable, 0 when
                  unknown. On several ranks every rank races (the portfolio).
  generate FILE   uniform random k-SAT (-n, -m or --ratio, -k, --planted)
  predict FILE    runtime distribution of --trials sequential runs (spread over the
                  ranks), fitted laws, predicted portfolio speedup at --cores, and the
                  speedup measured with the ranks there are
"""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("action", choices=("solve", "generate", "predict"))
    parser.add_argument("file", help="DIMACS CNF (plain, .gz, .xz, .bz2)")
    parser.add_argument("--algorithm", default="probsat", help="probsat, walksat or cc")
    parser.add_argument(
        "--portfolio", action="store_true", help="mix probsat, walksat and cc over the ranks"
    )
    parser.add_argument(
        "--hierarchical", action="store_true", help="portfolio: one algorithm per node"
    )
    parser.add_argument("--seed", type=integer(0), default=0)
    parser.add_argument(
        "--timeout",
        type=real(0, above=True),
        default=None,
        metavar="S",
        help="seconds: solve, the whole search; predict, each sequential run",
    )
    parser.add_argument(
        "--max-flips", type=integer(0), default=0, help="flips per rank (0: no limit)"
    )
    parser.add_argument("--restart", type=integer(0), default=0, metavar="FLIPS", help="0: never")
    parser.add_argument(
        "--cb", type=real(0, above=True), default=None, help="probSAT cb (by clause length)"
    )
    parser.add_argument("--noise", type=real(0, 1), default=0.567, help="WalkSAT noise (0.567)")
    parser.add_argument("--check-every", type=integer(1), default=20000, metavar="FLIPS")
    parser.add_argument("--checkpoint", metavar="DIR", help="one rank: checkpoint (resumes)")
    parser.add_argument("--checkpoint-every", type=integer(1), default=1_000_000, metavar="FLIPS")
    parser.add_argument(
        "-n", "--variables", type=integer(1, 1 << 31), default=200, help="generate: variables"
    )
    parser.add_argument(
        "-m", "--clauses", type=integer(0, 1 << 31), default=0, help="generate: clauses"
    )
    parser.add_argument(
        "--ratio", type=real(0, 1e6, above=True), default=4.26, help="generate: m/n if no -m"
    )
    parser.add_argument("-k", type=integer(1, 64), default=3, help="generate: literals per clause")
    parser.add_argument("--planted", action="store_true", help="generate: satisfiable")
    parser.add_argument("--trials", type=integer(1), default=100, help="predict: sequential runs")
    parser.add_argument("--cores", default="1,2,4,8,16,32,64,128,256,384", help="predict")
    parser.add_argument("--measure", type=integer(0), default=20, help="predict: portfolio runs")
    parser.add_argument(
        "--out", type=output_path, metavar="FILE", help="predict: JSON, also FILE.csv/.png"
    )
    add_layout_argument(parser)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"cb": args.cb, "noise": args.noise, "restart": args.restart}


def _run(comm: Any, args: argparse.Namespace) -> int:
    from .cnf import SatError

    if args.action == "generate":
        if comm.Get_rank() == 0:
            _generate(args)
        return 0
    from .cnf import read_dimacs

    if not Path(args.file).is_file():
        raise SatError(f"{args.file}: no such file")
    cnf = read_dimacs(args.file)
    if args.action == "predict":
        return _predict(comm, args, cnf)
    return _solve(comm, args, cnf)


def _generate(args: argparse.Namespace) -> None:
    from .cnf import random_ksat, write_dimacs

    m = args.clauses or round(args.ratio * args.variables)
    cnf, _ = random_ksat(args.variables, m, args.k, args.seed, args.planted)
    kind = "planted " if args.planted else ""
    write_dimacs(cnf, args.file, [f"{kind}uniform random {args.k}-SAT, hpcpar seed {args.seed}"])
    print(f"c wrote {args.file}: {cnf.n_vars} variables, {cnf.n_clauses} clauses")


def _fingerprint(cnf: Any) -> int:
    return zlib.crc32(cnf.lits.tobytes(), cnf.n_vars)


def _solve(comm: Any, args: argparse.Namespace, cnf: Any) -> int:
    from hpcpar.errors import UsageError
    from hpcpar.topology import Hierarchy

    from .portfolio import portfolio

    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"c hpcpar sat: {cnf.n_vars} variables, {cnf.n_clauses} clauses, {size} rank(s)")
    if args.checkpoint:
        if size > 1:
            raise UsageError("sat: --checkpoint is for a single run (one rank)")
        return _solve_checkpointed(args, cnf)
    algorithms = ["probsat", "walksat", "cc"] if args.portfolio else [args.algorithm]
    node = None
    if args.hierarchical:
        h = Hierarchy(comm, layout=args.layout)
        node = h.node_index
        h.free()
    result = portfolio(
        cnf,
        comm,
        algorithms=algorithms,
        seed=args.seed,
        timeout=args.timeout,
        max_flips=args.max_flips,
        check_every=args.check_every,
        node=node,
        **_options(args),
    )
    say(
        f"c {result.total_flips} flips in {result.seconds:.3f} s on {size} rank(s), "
        f"{result.flips_per_s:.3e} flips/s per rank"
    )
    if not result.satisfiable:
        say("s UNKNOWN", flush=True)
        return 0
    say(
        f"c solved by rank {result.winner} ({result.algorithm}) after {result.flips} flips; "
        f"all ranks stopped {1000 * result.stop_lag_s:.1f} ms later"
    )
    if rank == 0:
        _print_model(result.model)
    return 10


def _print_model(model: np.ndarray) -> None:
    lits = np.where(model, 1, -1) * np.arange(1, model.size + 1)
    out = ["s SATISFIABLE"]
    for i in range(0, lits.size, 10):
        out.append("v " + " ".join(map(str, lits[i : i + 10].tolist())))
    out.append("v 0")
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()


def _solve_checkpointed(args: argparse.Namespace, cnf: Any) -> int:
    from hpcpar.checkpoint import Checkpointer

    from .cnf import SatError, check_model
    from .solver import LocalSearch

    ls = LocalSearch(cnf, args.algorithm, args.seed, **_options(args))
    ck = Checkpointer(args.checkpoint, levels=["memory", "local"])
    try:
        if ck.versions():
            _, state = ck.restore()
            if "formula" not in state:
                raise SatError(f"{args.checkpoint}: checkpoint of another app, not of sat")
            if int(state["formula"]) != _fingerprint(cnf):
                raise SatError(f"{args.checkpoint}: checkpoint of another formula")
            ls.load_state(state)
            print(f"c resumed at flip {ls.flips}")
        t0 = time.time()
        every = max(1, args.checkpoint_every)
        while not ls.solved:
            target = (ls.flips // every + 1) * every
            if args.max_flips:
                target = min(target, args.max_flips)
            if ls.run(target - ls.flips):
                break
            if args.max_flips and ls.flips >= args.max_flips:
                break
            if args.timeout is not None and time.time() - t0 >= args.timeout:
                break
            ck.save(ls.flips, {**ls.state(), "formula": _fingerprint(cnf)}).wait()
    finally:
        ck.close(sync=sys.exc_info()[0] is None)  # no barrier on an error path
    print(f"c {ls.flips} flips, {ls.flips / max(ls.seconds, 1e-9):.3e} flips/s")
    if not ls.solved:
        print("s UNKNOWN", flush=True)
        return 0
    if check_model(cnf, ls.model()) >= 0:
        raise AssertionError("search reported a false model")
    _print_model(ls.model())
    return 10


def _predict(comm: Any, args: argparse.Namespace, cnf: Any) -> int:
    from hpcpar.errors import UsageError

    from .predict import fit_laws, speedup_table
    from .solver import LocalSearch

    try:
        cores = sorted({int(c) for c in args.cores.split(",")})
    except ValueError:
        raise UsageError(f"sat predict: --cores takes integers, not {args.cores!r}") from None
    if not cores or cores[0] < 1 or args.trials < 3 or args.measure < 0:
        raise UsageError("sat predict: --cores >= 1, --trials >= 3 and --measure >= 0")
    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    limit = args.max_flips or 10**9
    runs = []
    mine = range(rank, args.trials, size)
    last = time.monotonic()
    for done, trial in enumerate(mine):
        ls = LocalSearch(cnf, args.algorithm, args.seed + 1000 * trial, **_options(args))
        _bounded(ls, limit, args.timeout)
        runs.append((trial, ls.solved, ls.flips, ls.seconds))
        if time.monotonic() - last >= 5.0:  # rank 0's share stands for every rank's
            last = time.monotonic()
            say(f"c predict: {done + 1} of {len(mine)} sequential runs on rank 0 done", flush=True)
    runs = sorted(r for part in comm.allgather(runs) for r in part)
    solved = [r for r in runs if r[1]]
    if len(solved) < len(runs):
        within = f"{limit} flips" + (f" or {args.timeout:g} s" if args.timeout else "")
        say(
            f"c {len(runs) - len(solved)} of {len(runs)} trials unsolved within {within} "
            "(left out: the fits describe solved runs only)"
        )
    if len(solved) < 3:
        raise UsageError(
            f"sat predict: {len(solved)} of {len(runs)} trials solved; the fits need 3 or more "
            "(more --max-flips or --timeout, or an easier formula)"
        )
    flips = np.array([r[2] for r in solved], dtype=np.float64)
    secs = np.array([r[3] for r in solved])
    fits = fit_laws(flips)
    table = speedup_table(flips, cores)
    measured = _measure(comm, args, cnf, [c for c in cores if 1 < c <= size])
    say(
        f"c {len(solved)} sequential {args.algorithm} runs: mean {flips.mean():.0f} flips "
        f"({secs.mean():.4f} s), median {np.median(flips):.0f}, min {flips.min():.0f}"
    )
    for law, fit in fits.items():
        params = ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items())
        say(
            f"c fit {law:20s} {params:34s} loglik {fit.loglik:12.1f}  "
            f"KS D={fit.ks_statistic:.3f} p={fit.ks_pvalue:.3f}"
        )
    say(
        f"c {'cores':>6s} {'exp':>8s} {'shifted':>8s} {'lognorm':>8s} {'empir.':>8s} "
        f"{'measured':>9s} {'(wall)':>7s}   predicted / measured speedup (flips)"
    )
    for row in table:
        m = measured.get(row["cores"])
        if m:
            row.update(m)
        say(
            f"c {row['cores']:6d} {row['exponential_speedup']:8.2f} "
            f"{row['shifted_exponential_speedup']:8.2f} {row['lognormal_speedup']:8.2f} "
            f"{row['empirical_speedup']:8.2f} "
            f"{m['measured_speedup'] if m else float('nan'):9.2f} "
            f"{m['measured_wall_speedup'] if m else float('nan'):7.2f}"
        )
    if args.out and rank == 0:
        _write_predict(args, comm, fits, table, flips, secs)
    return 0


def _bounded(ls: Any, flips: int, timeout: float | None) -> None:
    """Run ``ls`` for at most ``flips`` flips and ``timeout`` seconds (None: no limit)."""
    if timeout is None:
        ls.run(flips)
        return
    deadline = time.monotonic() + timeout
    step = 100_000
    while not ls.solved and ls.flips < flips and time.monotonic() < deadline:
        ls.run(min(step, flips - ls.flips))


def _measure(comm: Any, args: argparse.Namespace, cnf: Any, cores: list[int]) -> dict:
    """Measured portfolio speedups (flips of the winner, and wall time) at ``cores``."""
    from hpcpar.runtime.comm import idle_barrier

    from .portfolio import portfolio
    from .solver import LocalSearch

    out: dict[int, dict[str, float]] = {}
    if not cores or not args.measure:
        return out
    base_flips, base_secs = [], []  # sequential reference, same seeds' family
    if comm.Get_rank() == 0:
        for r in range(args.measure):
            ls = LocalSearch(cnf, args.algorithm, 10**6 + r, **_options(args))
            _bounded(ls, args.max_flips or 10**9, args.timeout)
            base_flips.append(ls.flips)
            base_secs.append(ls.seconds)
    base = comm.bcast((float(np.mean(base_flips or [0])), float(np.mean(base_secs or [0]))))
    for n in cores:
        sub = comm.Split(0 if comm.Get_rank() < n else 1, comm.Get_rank())
        flips, secs = [], []
        if comm.Get_rank() < n:
            for r in range(args.measure):
                res = portfolio(
                    cnf,
                    sub,
                    algorithms=[args.algorithm],
                    timeout=args.timeout,
                    seed=2 * 10**6 + 1000 * r,
                    max_flips=args.max_flips,
                    check_every=args.check_every,
                    **_options(args),
                )
                flips.append(res.flips)
                secs.append(res.seconds)
        sub.Free()
        idle_barrier(comm)
        result = comm.bcast((flips, secs), root=0)
        out[n] = {
            "measured_speedup": base[0] / float(np.mean(result[0])),
            "measured_wall_speedup": base[1] / float(np.mean(result[1])),
            "measured_runs": len(result[0]),
        }
    return out


def _write_predict(
    args: argparse.Namespace, comm: Any, fits: Any, table: list, flips: Any, secs: Any
) -> None:
    from hpcpar.runtime.results import write_csv, write_json

    params = {k: v for k, v in vars(args).items() if k != "hpcpar_command"}
    doc = {
        "fits": {k: vars(f) for k, f in fits.items()},
        "table": table,
        "runtimes_flips": flips.tolist(),
        "runtimes_s": secs.tolist(),
    }
    write_json(args.out, doc, comm=None, layout=args.layout, parameters=params)
    base = Path(args.out).with_suffix("")
    write_csv(f"{base}.csv", table, comm=None)

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5.5, 4))
    cores = [r["cores"] for r in table]
    for law in ("exponential", "shifted_exponential", "lognormal", "empirical"):
        ax.plot(cores, [r[f"{law}_speedup"] for r in table], label=law.replace("_", " "))
    meas = [(r["cores"], r["measured_speedup"]) for r in table if "measured_speedup" in r]
    if meas:
        ax.plot(*zip(*meas, strict=True), "ko", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("cores (portfolio runs)")
    ax.set_ylabel("speedup")
    ax.legend()
    save(fig, f"{base}.png")


register(
    Command(
        "sat",
        "SAT local search: solve (portfolio), generate, predict speedup",
        _add_arguments,
        _run,
    )
)
