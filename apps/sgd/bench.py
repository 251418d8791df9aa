"""``hpcpar bench sgd``: samples/s and time to a target accuracy, against torch DDP (gloo).

In one job, for the model and data chosen: hpcpar's SGD modes (``sync``, ``local``,
``async``, ``hogwild``) on every rank, ``sync`` again on rank 0 alone (for the scaling
efficiency), PyTorch's ``DistributedDataParallel`` over gloo (``gradient_as_bucket_view``,
as PyTorch recommends) training the same network (same layers, tanh, float64, the same
initial weights, global batch, learning rate and data order) on every rank, the same torch
network through hpcpar's ``DataParallel`` (``torch-hpcpar`` as it chooses;
``torch-hpcpar-thread`` reducing its buckets on a thread during the backward pass,
``torch-hpcpar-after`` after it), and, for the linear model, scikit-learn's
``SGDClassifier`` on rank 0. Variants are interleaved over ``--repeats`` runs of
``--epochs`` epochs. ``--compression int8,1bit`` adds ``torch-hpcpar-int8`` and
``torch-hpcpar-1bit`` (gradients coded across nodes, int8 and 1bit with error feedback),
each reported with its time to the exact ``torch-hpcpar``'s final accuracy
(``powersgd``: PowerSGD at ``--powersgd-rank``, exact for ``--powersgd-start`` steps).

Figures per variant: samples/s (median over every timed epoch, min, max and the
quartile spread), time to ``--target`` test accuracy (median over the runs; training
seconds only, evaluation excluded), the share of time spent waiting for communication,
and for ``sync`` the overlap achieved: ``1 - exposed wait / blocking allreduce time``,
where the blocking time is measured in the same run on the same buckets. The ratio is
the variant's samples/s over torch DDP's (higher is faster).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Any

import numpy as np

from hpcpar.bench.harness import Row, quartile_spread
from hpcpar.bench.on_vcluster import add_vcluster_arguments, rerun_on_vcluster
from hpcpar.cli.common import integer, real
from hpcpar.plugins import Benchmark, register

from .cli import add_powersgd_arguments, bucket_bytes, bucket_mib
from .gloo import torch_group
from .torch_peer import TorchRun, state_bytes, torch_accuracy, torch_epoch

__all__: list[str] = []

MODES = ("sync", "local", "async", "hogwild")
_CODED = ("fp16", "bf16", "int8", "1bit", "powersgd")  # --compression
# the torch variants: the same network through torch DDP or hpcpar's DataParallel
_TORCH = {
    "torch-ddp-gloo": "ddp",
    "torch-hpcpar": "hpcpar",
    "torch-hpcpar-thread": "thread",
    "torch-hpcpar-after": "after",
    "torch-hpcpar-zero": "zero",
    "torch-hpcpar-zero-2l": "zero-2l",
}


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(repeats=2)
    parser.add_argument("--dataset", default="digits", help="an hpcpar sgd dataset (digits)")
    parser.add_argument("--model", default="mlp", help="softmax, mlp, mlp2 or mlp4 (default mlp)")
    parser.add_argument(
        "--hidden", type=integer(1, 1 << 20), default=64, help="hidden width (default 64)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="hpcpar modes to run")
    parser.add_argument("--epochs", type=integer(1), default=10, help="epochs per run (default 10)")
    parser.add_argument("--batch", type=integer(1), default=64, help="global batch (default 64)")
    parser.add_argument(
        "--lr", type=real(0, above=True), default=0.1, help="learning rate (default 0.1)"
    )
    parser.add_argument(
        "--bucket-mib",
        type=bucket_mib,
        default="auto",
        help="gradient buckets in MiB, or auto (default: hpcpar's DataParallel chooses; "
        "25, DDP's default, for DDP and the numpy modes)",
    )
    parser.add_argument(
        "--target",
        type=real(0, 1, above=True),
        default=0.95,
        help="test accuracy to reach (default 0.95)",
    )
    parser.add_argument(
        "--threads",
        type=integer(0, 4096),
        default=0,
        help="BLAS/torch threads per rank (default: cores/ranks)",
    )
    parser.add_argument(
        "--optimizer",
        choices=("sgd", "momentum", "adam"),
        default="sgd",
        help="the torch variants' optimizer (default sgd; momentum 0.9; adam): the state "
        "that ZeRO-1 shards",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the torch DDP peer")
    parser.add_argument(
        "--compression",
        default=None,
        metavar="S,T",
        help="also train torch-hpcpar with these gradient compressions (fp16, bf16, int8, "
        "1bit, powersgd; int8 and 1bit with error feedback) and report each one's time "
        "to the exact torch-hpcpar's final accuracy",
    )
    add_powersgd_arguments(parser)
    add_vcluster_arguments(parser, profile="HPCPAR_PROFILE")
    parser.add_argument("--seed", type=integer(0), default=0)


def _hpcpar_trainer(mode: str, model: Any, data: Any, h: Any, args: argparse.Namespace) -> Any:
    from .async_ps import AsyncTrainer
    from .hogwild import HogwildTrainer
    from .train import SyncTrainer

    size = h.comm.Get_size() if h is not None else 1
    if mode == "async":
        workers = max(1, size - 1)
        return AsyncTrainer(
            model, data, h, batch=max(1, args.batch // workers), lr=args.lr, seed=args.seed
        )
    if mode == "hogwild":
        return HogwildTrainer(
            model, data, h, batch=max(1, args.batch // size), lr=args.lr, seed=args.seed
        )
    return SyncTrainer(
        model,
        data,
        h,
        batch=args.batch,
        lr=args.lr,
        mode=mode,
        bucket_bytes=bucket_bytes(args.bucket_mib),
        seed=args.seed,
    )


def _blocking_allreduce_s(trainer: Any, steps: int) -> float:
    """Seconds per step of the sync trainer's buckets reduced one after another, blocking."""
    import hpcpar

    if trainer.comm is None:
        return 0.0
    n, b = trainer.model.n_params, trainer.bucket
    edges = [*range(n, 0, -b), 0]
    reps = max(3, min(steps, 50))
    t0 = time.perf_counter()
    for _ in range(reps):
        for hi, lo in itertools.pairwise(edges):
            hpcpar.allreduce(trainer.grad[lo:hi], out=trainer.reduced[lo:hi], comm=trainer.comm)
    return (time.perf_counter() - t0) / reps


def _wrap(variant: str) -> str | None:
    """The ``TorchRun`` wrap of a torch variant (``torch-hpcpar-int8``: ``coded-int8``)."""
    coded = variant.removeprefix("torch-hpcpar-")
    return _TORCH.get(variant) or (f"coded-{coded}" if coded in _CODED else None)


def _train(variant: str, args: argparse.Namespace, comm: Any, h: Any, data: Any) -> dict:
    """One run of ``variant``: per-epoch figures (identical on every rank)."""
    from .models import make_model

    model = make_model(args.model, data.n_features, data.n_classes, args.hidden, args.seed)
    epochs: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    wrap = _wrap(variant)
    if wrap is not None:
        run = TorchRun(model, data, comm, h, args, wrap)
        for e in range(args.epochs):
            waited = getattr(run.ddp, "comm_seconds", 0.0)
            loss, seconds, samples = torch_epoch(run, e)
            waited = getattr(run.ddp, "comm_seconds", 0.0) - waited
            seconds = comm.allreduce(seconds, op=_max())
            loss = comm.allreduce(loss) / samples
            epochs.append(
                {
                    "seconds": seconds,
                    "samples": samples,
                    "loss": loss,
                    "accuracy": torch_accuracy(run),
                    "comm_seconds": comm.allreduce(waited, op=_max()),
                }
            )
        extra["optimizer_state_bytes"] = comm.allreduce(state_bytes(run.opt), op=_max())
        if hasattr(run.ddp, "free"):
            extra["steps_per_epoch"] = run.data.y_train.size // run.batch
            extra["threaded"] = run.ddp.overlap
            extra["buckets"] = run.ddp.bucket_plan
            run.ddp.free()
        return {"epochs": epochs, **extra}
    if variant == "sklearn-sgdclassifier":
        return _sklearn(model, data, args)
    mode = variant.removeprefix("hpcpar-").removesuffix("@1")
    alone = variant.endswith("@1")
    trainer = _hpcpar_trainer(mode, model, data, None if alone else h, args)
    try:
        for e in range(args.epochs):
            st = trainer.epoch(e)
            epochs.append(
                {
                    "seconds": st.seconds,
                    "samples": st.samples_per_s * st.seconds,
                    "loss": st.loss,
                    "accuracy": st.test_accuracy,
                    "comm_seconds": st.comm_seconds,
                }
            )
            if not alone and mode in ("sync", "local"):
                epochs[-1]["seconds"] = comm.allreduce(st.seconds, op=_max())
                epochs[-1]["comm_seconds"] = comm.allreduce(st.comm_seconds, op=_max())
        if mode == "sync" and not alone and comm.Get_size() > 1:
            extra["blocking_allreduce_s_per_step"] = comm.allreduce(
                _blocking_allreduce_s(trainer, trainer.steps_per_epoch), op=_max()
            )
            extra["steps_per_epoch"] = trainer.steps_per_epoch
    finally:
        if mode == "hogwild":
            trainer.free()
    return {"epochs": epochs, **extra}


def _sklearn(model: Any, data: Any, args: argparse.Namespace) -> dict:
    """scikit-learn's SGDClassifier (log loss, constant step, one pass per epoch)."""
    from sklearn.linear_model import SGDClassifier

    clf = SGDClassifier(
        loss="log_loss", learning_rate="constant", eta0=args.lr, alpha=0.0, random_state=args.seed
    )
    classes = np.arange(data.n_classes)
    rng = np.random.default_rng(args.seed)
    epochs = []
    for _ in range(args.epochs):
        order = rng.permutation(data.y_train.size)
        x, y = data.x_train[order], data.y_train[order]
        t0 = time.perf_counter()
        clf.partial_fit(x, y, classes=classes)
        seconds = time.perf_counter() - t0
        proba = np.clip(clf.predict_proba(data.x_train), 1e-12, 1.0)
        loss = float(-np.log(proba[np.arange(y.size), data.y_train]).mean())
        epochs.append(
            {
                "seconds": seconds,
                "samples": y.size,
                "loss": loss,
                "accuracy": float(clf.score(data.x_test, data.y_test)),
                "comm_seconds": 0.0,
            }
        )
    return {"epochs": epochs}


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _summary(variant: str, runs: list[dict], args: argparse.Namespace, ranks: int) -> dict:
    rates = [ep["samples"] / ep["seconds"] for run in runs for ep in run["epochs"]]
    to_target = []
    for run in runs:
        clock = 0.0
        for ep in run["epochs"]:
            clock += ep["seconds"]
            if ep["accuracy"] >= args.target:
                to_target.append(clock)
                break
    seconds = sum(ep["seconds"] for run in runs for ep in run["epochs"])
    waited = sum(ep["comm_seconds"] for run in runs for ep in run["epochs"])
    last = runs[-1]["epochs"][-1]
    doc: dict[str, Any] = {
        "variant": variant,
        "ranks": 1 if variant.endswith("@1") or variant.startswith("sklearn") else ranks,
        "dataset": args.dataset,
        "model": args.model,
        "samples_per_s_median": statistics.median(rates),
        "samples_per_s_min": min(rates),
        "samples_per_s_max": max(rates),
        "spread_pct": quartile_spread(rates),
        "time_to_target_s": statistics.median(to_target) if len(to_target) == len(runs) else None,
        "final_loss": last["loss"],
        "final_test_accuracy": last["accuracy"],
        "comm_share": waited / seconds if seconds > 0 else 0.0,
        "valid": bool(np.isfinite(last["loss"])),
    }
    if "optimizer_state_bytes" in runs[-1]:
        doc["optimizer_state_bytes"] = runs[-1]["optimizer_state_bytes"]
    if "buckets" in runs[-1]:  # hpcpar's DataParallel: its exposed wait per step
        steps = runs[-1]["steps_per_epoch"] * len(runs[-1]["epochs"]) * len(runs)
        doc["exposed_wait_s_per_step"] = waited / steps
        doc["threaded"] = runs[-1]["threaded"]
        doc["buckets"] = runs[-1]["buckets"]
    if "blocking_allreduce_s_per_step" in runs[-1]:
        steps = runs[-1]["steps_per_epoch"] * len(runs[-1]["epochs"]) * len(runs)
        blocking = statistics.median(r["blocking_allreduce_s_per_step"] for r in runs)
        exposed = waited / steps
        doc["blocking_allreduce_s_per_step"] = blocking
        doc["exposed_wait_s_per_step"] = exposed
        doc["overlap"] = min(1.0, max(0.0, 1.0 - exposed / blocking)) if blocking > 0 else None
    return doc


def _time_to_exact(docs: list[dict], runs: dict[str, list[dict]], say: Any) -> None:
    """Each compressed variant's time to the exact ``torch-hpcpar``'s final accuracy."""
    exact = next((d for d in docs if d["variant"] == "torch-hpcpar"), None)
    if exact is None:
        return
    goal = exact["final_test_accuracy"]

    def reach(variant: str) -> float | None:
        times = []
        for run in runs[variant]:
            clock = 0.0
            for ep in run["epochs"]:
                clock += ep["seconds"]
                if ep["accuracy"] >= goal:
                    times.append(clock)
                    break
        return statistics.median(times) if len(times) == len(runs[variant]) else None

    base = reach("torch-hpcpar")
    for d in docs:
        if d["variant"].startswith("torch-hpcpar-") and d["variant"].split("-")[-1] in _CODED:
            t = reach(d["variant"])
            d["time_to_exact_accuracy_s"] = t
            d["speedup_to_exact_accuracy"] = base / t if base and t else None
            say(
                f"# {d['variant']}: to torch-hpcpar's final accuracy {goal:.4f} in "
                + ("-" if t is None else f"{t:.3f} s")
                + f" (exact {'-' if base is None else f'{base:.3f} s'}"
                + ("" if not (base and t) else f", {base / t:.2f}x shorter")
                + f"); final accuracy {d['final_test_accuracy']:.4f} "
                f"({100 * (d['final_test_accuracy'] - goal):+.2f} points)",
                flush=True,
            )


def _torch_overlap(docs: list[dict]) -> None:
    """The DataParallel variants' overlap: ``1 - exposed wait / the after-the-pass wait``.

    Reducing every bucket after the backward pass exposes all of the communication
    (on a core the pass no longer uses), so its wait per step, measured in the same run,
    is the blocking time the threaded variants hide a share of.
    """
    by = {d["variant"]: d for d in docs}
    after = by.get("torch-hpcpar-after")
    if after is None or not after["exposed_wait_s_per_step"] > 0:
        return
    blocking = after["exposed_wait_s_per_step"]
    for name in ("torch-hpcpar-thread", "torch-hpcpar"):
        d = by.get(name)
        if d is not None and d["threaded"]:
            d["blocking_allreduce_s_per_step"] = blocking
            d["overlap"] = min(1.0, max(0.0, 1.0 - d["exposed_wait_s_per_step"] / blocking))


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:  # noqa: PLR0912, PLR0915
    from threadpoolctl import threadpool_limits

    from hpcpar.errors import UsageError
    from hpcpar.runtime.comm import idle_barrier
    from hpcpar.runtime.results import mpi_library
    from hpcpar.topology import Hierarchy

    from .data import load_dataset

    if args.vcluster:
        return rerun_on_vcluster(comm, args, "sgd", "ranks")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(f"bench sgd: --modes takes {', '.join(MODES)}, not {args.modes!r}")
    if args.epochs < 1 or args.repeats < 1 or not 0 < args.target <= 1:
        raise UsageError("bench sgd: --epochs, --repeats >= 1 and 0 < --target <= 1")
    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    data = load_dataset(args.dataset, args.seed)
    h = Hierarchy(comm, layout=args.layout)
    threads = args.threads or max(1, (os.cpu_count() or 1) // h.node.Get_size())
    variants = [f"hpcpar-{m}" for m in modes]
    if size > 1 and "sync" in modes:
        variants.append("hpcpar-sync@1")
    dist = None if args.no_torch else torch_group(comm)
    coded = [c.strip() for c in (args.compression or "").split(",") if c.strip()]
    if any(c not in _CODED for c in coded):
        raise UsageError(f"bench sgd: --compression takes {', '.join(_CODED)}, not {coded}")
    if dist is not None:
        import torch

        torch.set_num_threads(threads)
        variants.extend(_TORCH)
    if coded:
        if dist is None:
            raise UsageError("bench sgd: --compression trains torch variants: pip install torch")
        for c in coded:
            variants.append(f"torch-hpcpar-{c}")
    if args.model == "softmax" and not hasattr(data.x_train, "tocsr"):
        variants.append("sklearn-sgdclassifier")
    peer = "torch-ddp-gloo" if dist is not None else variants[0]
    say(
        f"# hpcpar bench sgd: {args.model} (hidden {args.hidden}) on {args.dataset}, "
        f"{size} rank(s) (layout {args.layout or 'real'}), {threads} thread(s) per rank; "
        f"{mpi_library()}; global batch {args.batch}, lr {args.lr}, {args.epochs} epochs x "
        f"{args.repeats} runs; peer {peer}"
        + ("" if dist is not None else " (torch not installed: pip install torch)")
    )
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with threadpool_limits(limits=threads):
        for _ in range(args.repeats):
            for variant in variants:
                on_rank0 = variant.endswith("@1") or variant.startswith("sklearn")
                if on_rank0:
                    result = _train(variant, args, comm, h, data) if rank == 0 else None
                    idle_barrier(comm)
                    result = comm.bcast(result, root=0)
                else:
                    result = _train(variant, args, comm, h, data)
                runs[variant].append(result)
    docs = [_summary(v, runs[v], args, size) for v in variants]
    _torch_overlap(docs)
    _time_to_exact(docs, runs, say)
    base = next(d for d in docs if d["variant"] == peer)["samples_per_s_median"]
    alone = next((d for d in docs if d["variant"] == "hpcpar-sync@1"), None)
    say(
        f"# {'variant':22s} {'ranks':>5s} {'samples/s':>11s} {'min':>10s} {'max':>10s} "
        f"{'spread%':>7s} {'vs peer':>7s} {'to target s':>11s} {'acc':>6s} {'comm%':>6s} "
        f"{'overlap':>7s}"
    )
    rows = []
    for d in docs:
        d["vs_peer"] = d["samples_per_s_median"] / base
        if d["variant"] == "hpcpar-sync" and alone is not None:
            d["scaling_efficiency"] = d["samples_per_s_median"] / (
                size * alone["samples_per_s_median"]
            )
        tt = d["time_to_target_s"]
        ov = d.get("overlap")
        say(
            f"  {d['variant']:22s} {d['ranks']:5d} {d['samples_per_s_median']:11.0f} "
            f"{d['samples_per_s_min']:10.0f} {d['samples_per_s_max']:10.0f} "
            f"{d['spread_pct']:7.1f} {d['vs_peer']:7.2f} "
            f"{'-' if tt is None else f'{tt:.3f}':>11s} {d['final_test_accuracy']:6.3f} "
            f"{100 * d['comm_share']:6.1f} {'-' if ov is None else f'{ov:.2f}':>7s}",
            flush=True,
        )
        rows.append(Row(d, size_key="ranks"))
    for d in docs:
        if "buckets" in d and "zero" not in d["variant"]:
            say(
                f"# {d['variant']}: {d['buckets']}; waited "
                f"{1e3 * d['exposed_wait_s_per_step']:.2f} ms a step after the backward pass"
            )
    state = {d["variant"]: d["optimizer_state_bytes"] for d in docs if "optimizer_state_bytes" in d}
    if state.get("torch-hpcpar"):
        say(
            f"# {args.optimizer} state per rank (the largest): "
            + ", ".join(
                f"{v} {b / 2**20:.2f} MiB ({b / state['torch-hpcpar']:.2f})"
                for v, b in state.items()
            )
        )
    if alone is not None and rank == 0:
        eff = next(d for d in docs if d["variant"] == "hpcpar-sync")["scaling_efficiency"]
        print(f"# sync scaling efficiency 1 -> {size} ranks: {eff:.2f}", flush=True)
    h.free()
    if dist is not None:
        dist.destroy_process_group()
    return rows


register(
    Benchmark(
        "sgd",
        "SGD modes: samples/s and time to accuracy, against torch DDP (gloo) and sklearn",
        _add_arguments,
        _run,
        peer="torch-ddp-gloo",
    )
)
