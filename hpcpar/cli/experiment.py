"""``hpcpar experiment run CONFIG.toml | report DIR``: resumable sweeps of hpcpar jobs.

A config declares one command template and the values to sweep::

    [experiment]
    name = "allreduce-layouts"
    results = "results/allreduce-layouts"   # default: results/NAME
    timeout = 600                           # seconds per point
    oversubscribe = true                    # allow more ranks than cores
    where = "local"                         # or "vcluster", "slurm" (or run --where)

    [sweep]
    command = "bench allreduce-mpi --min-size {size} --max-size {size} --output {out}"
    ranks = [2, 4]
    layout = ["ppn:1", "ppn:2"]             # optional ("" = the real nodes)
    size = ["8", "1MiB"]                    # any other key: a parameter of the command

Every combination is a point, run with ``hpcpar launch -n RANKS [--layout L] --timeout
T -- COMMAND`` where ``{out}`` is the point's output prefix: on this machine (``local``),
on a virtual cluster of ``[vcluster] nodes`` and ``link`` (brought up for the sweep and
down after; ``--ppn RANKS/nodes``, the namespaces are the nodes), or as one Slurm batch
job per point (``[slurm] partition, time, ppn, launcher, sbatch_args, wait``; all
submitted at once, then collected). A point whose status file says ``ok`` is skipped on
a rerun (an interrupted sweep resumes; Slurm jobs still queued are collected, not
submitted again); a point that fails is recorded (exit status, log) and the sweep goes
on. All points' results (the ``results`` of each ``{out}.json``, with the point's
parameters) are gathered into ``RESULTS/results.json`` and ``.csv`` (with each point's
job wall time and, for points that differ only in ranks, its speedup over the fewest
ranks). ``report`` writes
``summary.md`` and PNG plots: time vs size (benchmark sweeps), TEPS per partition
(Graph500 sweeps), speedup vs ranks.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..plugins import Command, register
from ..runtime.env import usable_cores
from ..runtime.plots import pyplot, save
from .sweep_where import TABLE_KEYS, WHERE, check_where, run_points

__all__ = ["load_config", "points", "run_sweep", "report"]

EXPERIMENT_KEYS = {"name", "results", "timeout", "oversubscribe", "where"}
RESERVED = {"command", "ranks", "layout"}


def load_config(path: str | Path, where: str | None = None) -> dict[str, Any]:
    """Read and check a sweep config; ``where`` overrides its ``[experiment] where``.

    Raises:
        UsageError: unreadable or malformed TOML, unknown keys (named with the valid
            ones), a missing command or ranks, placeholders without values.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"experiment: cannot read {path} ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"experiment: {path} is not valid TOML: {exc}") from None
    unknown = set(doc) - {"experiment", "sweep", *TABLE_KEYS}
    if unknown:
        raise UsageError(
            f"experiment: unknown table(s) {sorted(unknown)}; valid: experiment, sweep, "
            f"{', '.join(TABLE_KEYS)}"
        )
    exp, sweep = dict(doc.get("experiment", {})), dict(doc.get("sweep", {}))
    bad = set(exp) - EXPERIMENT_KEYS
    if bad:
        raise UsageError(
            f"experiment: unknown key(s) {sorted(bad)} in [experiment]; valid: "
            f"{', '.join(sorted(EXPERIMENT_KEYS))}"
        )
    if not isinstance(sweep.get("command"), str) or not sweep["command"].strip():
        raise UsageError('experiment: [sweep] needs command = "..." (an hpcpar command)')
    ranks = sweep.get("ranks")
    if (
        not isinstance(ranks, list)
        or not ranks
        or not all(isinstance(r, int) and r >= 1 for r in ranks)
    ):
        raise UsageError("experiment: [sweep] needs ranks = [1, 2, ...] (positive integers)")
    params = {k: v if isinstance(v, list) else [v] for k, v in sweep.items() if k != "command"}
    params.setdefault("layout", [""])
    wanted = set(re.findall(r"{(\w+)}", sweep["command"])) - {"out"}
    missing = wanted - set(params)
    if missing:
        raise UsageError(
            f"experiment: the command uses {{{', '.join(sorted(missing))}}} but [sweep] "
            f"gives no values; parameters: {', '.join(sorted(params))}"
        )
    where = str(where or exp.get("where", "local"))
    settings = check_where(where, doc, params)
    oversubscribe = bool(exp.get("oversubscribe", False))
    cores = usable_cores()
    if where != "slurm" and not oversubscribe and max(ranks) > cores:
        raise UsageError(
            f"experiment: ranks up to {max(ranks)} on {cores} core(s); set oversubscribe = true "
            "in [experiment] to allow it"
        )
    name = str(exp.get("name") or path.stem)
    return {
        "name": name,
        "results": str(exp.get("results") or f"results/{name}"),
        "timeout": float(exp.get("timeout", 600)),
        "command": sweep["command"],
        "params": params,
        "source": str(path),
        "where": where,
        **settings,
    }


def points(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the swept values, each with a stable id."""
    keys = sorted(config["params"])
    out = []
    for values in itertools.product(*(config["params"][k] for k in keys)):
        point = dict(zip(keys, values, strict=True))
        slug = "_".join(
            f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '', str(point[k])) or 'real'}" for k in keys
        )
        digest = hashlib.sha1(json.dumps(point, sort_keys=True).encode()).hexdigest()[:6]
        out.append({"id": f"{slug}-{digest}", "params": point})  # cfr and cfr+ differ
    return out


def run_sweep(config: dict[str, Any], say: Any = print) -> dict[str, int]:
    """Run every point not yet finished; returns counts of ok, failed and skipped."""
    root = Path(config["results"])
    (root / "points").mkdir(parents=True, exist_ok=True)
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    every = points(config)
    index = {point["id"]: i for i, point in enumerate(every, 1)}
    todo = []
    for i, point in enumerate(every, 1):
        folder = root / "points" / point["id"]
        status_file = folder / "status.json"
        if status_file.exists() and json.loads(status_file.read_text()).get("status") == "ok":
            counts["skipped"] += 1
            say(f"[{i}/{len(every)}] {point['id']}: done before, skipped")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        command = config["command"].format(**point["params"], out=str(folder / "out"))
        todo.append((i, point, folder, shlex.split(command)))

    def done(point: dict[str, Any], status: dict[str, Any]) -> None:
        counts[status["status"]] += 1
        code, log = status["exit_code"], status["log"]
        word = "ok" if status["status"] == "ok" else f"FAILED (exit {code}, log {log})"
        took = f" in {status['seconds']:.1f} s" if status.get("seconds") is not None else ""
        say(f"[{index[point['id']]}/{len(every)}] {point['id']}: {word}{took}")

    try:
        run_points(config, todo, done)
    finally:
        gather(config)
    return counts


def gather(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per result of every point (with its parameters and status)."""
    from ..runtime.results import write_csv, write_json

    root = Path(config["results"])
    rows: list[dict[str, Any]] = []
    statuses = {}
    for point in points(config):
        folder = root / "points" / point["id"]
        statuses[point["id"]] = {"status": "not run"}
        if (folder / "status.json").exists():
            statuses[point["id"]] = json.loads((folder / "status.json").read_text())
    speedup = _speedups(points(config), statuses)
    for point in points(config):
        folder = root / "points" / point["id"]
        status = statuses[point["id"]]
        results = []
        if status["status"] == "ok" and (folder / "out.json").exists():
            doc = json.loads((folder / "out.json").read_text())["results"]
            results = doc if isinstance(doc, list) else [doc]
        base = {
            "point": point["id"],
            **point["params"],
            "status": status["status"],
            "results": len(results),
            "seconds": status.get("seconds"),
            "speedup": speedup.get(point["id"], (None, None))[0],
            "series": speedup.get(point["id"], (None, None))[1],
        }
        for r in results or [{}]:
            flat = {k: v for k, v in r.items() if not isinstance(v, (list, dict))}
            rows.append({**base, **flat})
    write_json(root / "results.json", rows, comm=None, parameters={"config": config})
    columns = sorted({k for r in rows for k in r}, key=lambda k: (k not in rows[0], k))
    write_csv(root / "results.csv", rows, columns=columns, comm=None)
    return rows


def _speedups(pts: list[dict[str, Any]], statuses: dict[str, dict]) -> dict[str, tuple]:
    """Per point: (whole-job wall time at the fewest ranks / its time, its series' label).

    Points that differ only in ``ranks`` form a series; only finished points count.
    """
    series: dict[str, list[tuple[int, str, float]]] = {}
    for p in pts:
        status = statuses[p["id"]]
        if status["status"] != "ok":
            continue
        label = ", ".join(
            f"{k}={v if v != '' else 'real'}"
            for k, v in sorted(p["params"].items())
            if k != "ranks"
        )
        series.setdefault(label or "all", []).append(
            (int(p["params"]["ranks"]), p["id"], status["seconds"])
        )
    out = {}
    for label, members in series.items():
        if len({r for r, _, _ in members}) > 1:
            base = min(members)[2]
            out.update({pid: (base / t if t > 0 else None, label) for _, pid, t in members})
    return out


def report(folder: str | Path) -> list[Path]:
    """``summary.md`` (a table per point) and PNG plots of the gathered results."""
    root = Path(folder)
    try:
        rows = json.loads((root / "results.json").read_text())["results"]
    except (OSError, ValueError, KeyError):
        raise UsageError(f"experiment report: no results.json in {root} (run the sweep)") from None
    lines = ["| point | status | result rows |", "|---|---|---|"]
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    for point, rs in by_point.items():
        lines.append(f"| {point} | {rs[0]['status']} | {rs[0]['results']} |")
    written = [root / "summary.md"]
    written[0].write_text("\n".join(lines) + "\n")
    written += _plots(root, rows)
    return written


def _plots(root: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Time vs size per variant, one PNG per (ranks, layout), where rows have them."""
    plt = pyplot()
    if plt is None:
        return []
    groups: dict[tuple[Any, Any], list[dict]] = {}
    for r in rows:
        if "size" in r and "avg_us" in r and "variant" in r:
            groups.setdefault((r.get("ranks"), r.get("layout") or "real"), []).append(r)
    out = []
    for (ranks, layout), rs in sorted(groups.items(), key=str):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for variant in sorted({r["variant"] for r in rs}):
            pts = sorted((r["size"], r["avg_us"]) for r in rs if r["variant"] == variant)
            ax.plot(*zip(*pts, strict=True), marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("microseconds")
        ax.set_title(f"{ranks} ranks, layout {layout}")
        ax.legend(fontsize=7)
        path = root / f"time-vs-size-{ranks}-{re.sub(r'[^A-Za-z0-9]+', '', str(layout))}.png"
        save(fig, path)
        out.append(path)
    return out + _teps_plots(root, rows, plt) + _speedup_plot(root, rows, plt)


def _teps_plots(root: Path, rows: list[dict[str, Any]], plt: Any) -> list[Path]:
    """Graph500 rows: harmonic-mean TEPS per partition, one bar group per (ranks, layout)."""
    keys = [
        k
        for k in ("bfs_harmonic_mean_teps", "sssp_harmonic_mean_teps")
        if any(k in r for r in rows)
    ]
    graph = [r for r in rows if "partition" in r and any(k in r for k in keys)]
    if not graph:
        return []
    groups = sorted({(r.get("ranks"), r.get("layout") or "real") for r in graph}, key=str)
    partitions = sorted({r["partition"] for r in graph})
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    width = 0.8 / max(1, len(partitions))
    for ax, key in zip(axes[0], keys, strict=True):
        for k, partition in enumerate(partitions):
            heights = [
                max(
                    (
                        r.get(key) or 0.0
                        for r in graph
                        if r["partition"] == partition
                        and (r.get("ranks"), r.get("layout") or "real") == g
                    ),
                    default=0.0,
                )
                for g in groups
            ]
            ax.bar([i + k * width for i in range(len(groups))], heights, width, label=partition)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
        ax.set_xticklabels([f"{n} ranks\n{lay}" for n, lay in groups], fontsize=7)
        ax.set_ylabel(f"{key.split('_')[0].upper()} harmonic-mean TEPS")
        ax.legend(fontsize=7)
    return [save(fig, root / "teps-per-partition.png")]


def _speedup_plot(root: Path, rows: list[dict[str, Any]], plt: Any) -> list[Path]:
    """Speedup (whole-job wall time) vs ranks, one line per series of points."""
    lines: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.get("speedup") is not None:
            lines.setdefault(r["series"], {})[int(r["ranks"])] = r["speedup"]
    if not lines:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 4))
    top = max(max(pts) for pts in lines.values())
    ax.plot([1, top], [1, top], color="grey", linestyle=":", label="ideal")
    for label, pts in sorted(lines.items()):
        ax.plot(*zip(*sorted(pts.items()), strict=True), marker="o", label=label[:50])
    ax.set_xlabel("ranks")
    ax.set_ylabel("speedup (job wall time)")
    ax.legend(fontsize=6)
    return [save(fig, root / "speedup-vs-ranks.png")]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1] if __doc__ else ""
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("path", help="run: the config (.toml); report: the results folder")
    parser.add_argument("--where", choices=WHERE, help="run: override the config's where")


def _run(_comm: Any, args: argparse.Namespace) -> int:
    if args.action == "report":
        for path in report(args.path):
            print(f"wrote {path}")
        return 0
    config = load_config(args.path, where=args.where)
    n = len(points(config))
    print(
        f"# experiment {config['name']}: {n} point(s) ({config['where']}), results in "
        f"{config['results']}",
        flush=True,
    )
    counts = run_sweep(config)
    print(
        f"# {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} done before; "
        f"{config['results']}/results.csv"
    )
    return 1 if counts["failed"] else 0


register(
    Command(
        "experiment",
        "run a resumable sweep of hpcpar jobs from a TOML config; report it",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
