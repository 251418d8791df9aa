"""``hpcpar sgd``: data-parallel training with per-epoch figures, checkpoints and resume."""

from __future__ import annotations

import argparse
import sys
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


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        default="digits",
        help="digits, breast_cancer, wine (scikit-learn's), synthetic, synthetic_sparse",
    )
    parser.add_argument(
        "--framework",
        choices=("numpy", "torch"),
        default="numpy",
        help="numpy: hpcpar's own models and modes; torch: a PyTorch model through "
        "hpcpar.apps.sgd.torch.DataParallel (mode sync or local)",
    )
    parser.add_argument(
        "--model",
        default="mlp",
        help="numpy: softmax, mlp, mlp2 or mlp4; torch: mlp, mlp2, mlp4 or cnn (default mlp)",
    )
    parser.add_argument(
        "--momentum", type=real(0, 1), default=0.0, help="torch: SGD momentum (default 0)"
    )
    parser.add_argument(
        "--zero",
        action="store_true",
        help="torch, mode sync: shard the optimizer state over the ranks (ZeRO stage 1; "
        "two-level scatter and gather with --layout)",
    )
    parser.add_argument(
        "--compression",
        choices=("fp16", "bf16", "int8", "1bit", "powersgd"),
        default=None,
        help="torch, mode sync: code the gradients across nodes (hpcpar's compressed "
        "allreduce; exact inside a node), or powersgd (low-rank, with error feedback); "
        "default exact",
    )
    add_powersgd_arguments(parser)
    parser.add_argument(
        "--error-feedback",
        action="store_true",
        help="with --compression: add what coding lost to the next step's gradients",
    )
    parser.add_argument(
        "--outer-lr",
        type=real(0, above=True),
        default=None,
        help="torch, mode local: outer learning rate (default 1: model averaging)",
    )
    parser.add_argument(
        "--outer-momentum",
        type=real(0, 1),
        default=None,
        help="torch, mode local: outer Nesterov momentum (DiLoCo: --outer-lr 0.7 "
        "--outer-momentum 0.9; default 0)",
    )
    parser.add_argument(
        "--hidden", type=integer(1, 1 << 20), default=64, help="hidden width (default 64)"
    )
    parser.add_argument(
        "--mode", default="sync", help="sync, local, async or hogwild (default sync)"
    )
    parser.add_argument(
        "--clip", type=real(0, above=True), default=5.0, help="async: gradient norm clip (5)"
    )
    parser.add_argument(
        "--local-steps", type=integer(1), default=8, help="local mode: steps per average"
    )
    parser.add_argument("--epochs", type=integer(1), default=10)
    parser.add_argument("--batch", type=integer(1), default=64, help="global batch (default 64)")
    parser.add_argument("--lr", type=real(0, above=True), default=0.1)
    parser.add_argument(
        "--bucket-mib",
        type=bucket_mib,
        default="auto",
        help="gradient bucket in MiB, or auto (default): with --framework torch chosen from "
        "the cost model and the first backward pass, 25 for the numpy modes",
    )
    parser.add_argument("--reproducible", action="store_true", help="bitwise reductions")
    parser.add_argument("--seed", type=integer(0), default=0)
    parser.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (resumes)")
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=None,
        metavar="K",
        help="steps between checkpoints (async and hogwild: epochs, saved at epoch ends); "
        "with --checkpoint, default: every epoch's end; 0: only resume, never save",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bar on rank 0 (auto: when stdout is a terminal)",
    )
    parser.add_argument(
        "--full-data",
        action="store_true",
        help="every rank loads all training rows and batches follow one global shuffle "
        "(default: each rank loads only its shard and shuffles it; async always loads all)",
    )
    parser.add_argument(
        "--out", type=output_path, metavar="FILE", help="results JSON; also FILE.csv, FILE.png"
    )
    add_layout_argument(parser)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from hpcpar.topology import Hierarchy

    from .data import load_dataset
    from .models import make_model

    _check(args)
    if args.framework == "torch":
        from types import SimpleNamespace

        from .torch_train import run_torch

        rows, params = run_torch(comm, args)
        _write(comm, args, rows, SimpleNamespace(params=params))
        return 0
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    size = comm.Get_size()
    sharded = size > 1 and not args.full_data and args.mode != "async"
    shard = (comm.Get_rank(), size) if sharded else None
    data = load_dataset(args.dataset, args.seed, shard=shard, comm=comm)
    model = make_model(args.model, data.n_features, data.n_classes, args.hidden, args.seed)
    h = Hierarchy(comm, layout=args.layout)
    ck, step, epoch, start, rows = _resume(args, h, model)
    trainer = _trainer(args, model, data, h)
    trainer.step = step
    say(
        f"# hpcpar sgd: {args.model} ({model.n_params} parameters) on {args.dataset} "
        f"({data.n_total} training rows{', one shard per rank' if sharded else ''}), "
        f"mode {args.mode}, {size} rank(s), "
        f"global batch {args.batch}, lr {args.lr}"
    )
    if step:
        say(f"# resumed at step {step} (epoch {epoch}, batch {start})")
    try:
        _train(args, trainer, model, ck, rows, (epoch, start), comm)
    finally:
        if ck is not None:
            ck.close(sync=sys.exc_info()[0] is None)  # no barrier on an error path
        if args.mode == "hogwild":
            trainer.free()
    _write(comm, args, rows, model)
    h.free()
    return 0


def _train(
    args: argparse.Namespace,
    trainer: Any,
    model: Any,
    ck: Any,
    rows: list[dict[str, Any]],
    begin: tuple[int, int],
    comm: Any,
) -> None:
    """The epochs from ``begin`` (epoch, batch), saving every ``--checkpoint-every``.

    A save due at an epoch's last step waits until that epoch's row exists, so the
    checkpoint carries every finished epoch's figures (``_history``).
    """
    epoch, start = begin
    rank0 = comm.Get_rank() == 0
    say = print if rank0 else (lambda *a, **k: None)
    per_epoch = args.mode in ("async", "hogwild")  # these modes meet only at epoch ends
    if args.checkpoint_every is None:  # with --checkpoint: at every epoch's end
        args.checkpoint_every = 1 if per_epoch else trainer.steps_per_epoch
    progress = _Progress(args, rank0 and not per_epoch)

    def save(e: int, index: int, last: bool) -> None:
        from hpcpar.checkpoint import Replicated

        # sync training keeps one model on every rank: saved once, it restores on any
        # number of ranks (the data position is global); the other modes' models differ
        # by rank. The figures are rank 0's (their timings differ by rank).
        params = Replicated(model.params) if args.mode == "sync" else model.params
        history = Replicated(comm.bcast(_history(rows), root=0))
        state = {
            "app": "sgd",
            "model": args.model,
            "dataset": args.dataset,
            "params": params,
            "step": trainer.step,
            "epoch": e + 1 if last else e,
            "next": 0 if last else index + 1,
            "history": history,
        }
        ck.save(trainer.step, state)

    def due() -> bool:
        return bool(ck and args.checkpoint_every and trainer.step % args.checkpoint_every == 0)

    epoch_end_due = [False]  # an epoch's last step was due: saved once its row exists

    def after_step(e: int, index: int) -> None:
        progress.show(e, index + 1, trainer.steps_per_epoch)
        if due():
            if index + 1 == trainer.steps_per_epoch:
                epoch_end_due[0] = True
            else:
                save(e, index, False)

    for e in range(epoch, args.epochs):
        if per_epoch:
            stats = trainer.epoch(e)
            trainer.step += 1
            epoch_end_due[0] = due() and e + 1 < args.epochs
        else:
            stats = trainer.epoch(e, start, after_step)
        start = 0
        rows.append(_row(e, stats))
        if epoch_end_due[0]:
            epoch_end_due[0] = False
            save(e, 0, True)
        progress.clear()
        say(
            f"  epoch {e + 1:4d}  loss {stats.loss:.4f}  test accuracy "
            f"{stats.test_accuracy:.4f}  {stats.samples_per_s:10.0f} samples/s",
            flush=True,
        )


def add_powersgd_arguments(parser: argparse.ArgumentParser) -> None:
    """``--powersgd-rank`` and ``--powersgd-start``."""
    parser.add_argument(
        "--powersgd-rank", type=integer(1), default=4, help="PowerSGD's rank (default 4)"
    )
    parser.add_argument(
        "--powersgd-start",
        type=integer(0),
        default=10,
        help="PowerSGD: exact steps before the approximation starts (default 10)",
    )


def _check(args: argparse.Namespace) -> None:
    from hpcpar.errors import UsageError

    if args.epochs < 1:
        raise UsageError(f"sgd: --epochs must be at least 1, not {args.epochs}")
    if args.checkpoint_every and not args.checkpoint:
        raise UsageError("sgd: --checkpoint-every K needs --checkpoint DIR")
    outer = [
        f"--{name.replace('_', '-')}"
        for name in ("outer_lr", "outer_momentum")
        if getattr(args, name, None) is not None
    ]
    if getattr(args, "error_feedback", False) and getattr(args, "compression", None) in (
        None,
        "powersgd",
    ):
        raise UsageError(
            "sgd: --error-feedback needs --compression fp16, bf16, int8 or 1bit "
            "(powersgd keeps its own)"
        )
    if getattr(args, "compression", None) and (
        args.framework != "torch" or args.mode != "sync" or args.zero
    ):
        raise UsageError(
            "sgd: --compression codes the gradients of --framework torch --mode sync "
            "(without --zero)"
        )
    if outer and (args.framework != "torch" or args.mode != "local"):
        raise UsageError(
            f"sgd: {' and '.join(outer)} set the outer steps of --framework torch --mode "
            f"local; this run is --framework {args.framework} --mode {args.mode}"
        )


def _resume(
    args: argparse.Namespace, h: Any, model: Any
) -> tuple[Any, int, int, int, list[dict[str, Any]]]:
    """The checkpointer (or ``None``), the step, epoch and batch to start from, the epochs' rows.

    The parameters are restored before the trainer exists (hogwild shares them); the
    rows of the epochs finished before the checkpoint come back with them, so a resumed
    run's results and plot cover the whole run.
    """
    if not args.checkpoint:
        return None, 0, 0, 0, []
    import numpy as np
    from hpcpar.checkpoint import Checkpointer, Replicated, Sharded

    ck = Checkpointer(
        args.checkpoint,
        comm=h,
        levels=args.checkpoint_levels,
        local_dir=args.checkpoint_local,
    )
    if not ck.versions():
        return ck, 0, 0, 0, []
    _, state = ck.restore()
    state = {
        k: (np.asarray(v) if isinstance(v, (Replicated, Sharded)) else v) for k, v in state.items()
    }
    _check_resumable(args, state, model)
    model.params[:] = state["params"]
    history = state.get("history")
    rows = [] if history is None else [_unrow(values) for values in history]
    return ck, int(state["step"]), int(state["epoch"]), int(state["next"]), rows


def _check_resumable(args: argparse.Namespace, state: dict[str, Any], model: Any) -> None:
    """Refuse a checkpoint of another app, model or dataset (one line, on every rank).

    Raises:
        SgdError: naming what the checkpoint holds and what this run trains.
    """
    from .models import SgdError

    params = state.get("params")
    wanted = f"{args.model} ({model.n_params} parameters) on {args.dataset}"
    if state.get("app", "sgd") != "sgd" or not hasattr(params, "shape"):
        raise SgdError(f"{args.checkpoint} holds a checkpoint of another app, not of sgd")
    held = f"{state.get('model', '?')} ({params.size} parameters) on {state.get('dataset', '?')}"
    same_data = state.get("dataset", args.dataset) == args.dataset
    if params.shape != model.params.shape or not same_data:
        raise SgdError(f"{args.checkpoint} holds a checkpoint of {held}; this run trains {wanted}")


_HISTORY = ("epoch", "loss", "test_accuracy", "seconds", "samples_per_s", "comm_seconds")


def _history(rows: list[dict[str, Any]]) -> Any:
    """The finished epochs' figures as one float array (what a checkpoint holds)."""
    import numpy as np

    table = [[float(r[c]) for c in _HISTORY] for r in rows]
    return np.array(table, dtype=np.float64).reshape(len(rows), len(_HISTORY))


def _unrow(values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {c: float(v) for c, v in zip(_HISTORY, values, strict=True)}
    row["epoch"] = int(row["epoch"])
    return row


def _row(e: int, stats: Any) -> dict[str, Any]:
    """One epoch's line of the CSV."""
    return {
        "epoch": e + 1,
        "loss": stats.loss,
        "test_accuracy": stats.test_accuracy,
        "seconds": stats.seconds,
        "samples_per_s": stats.samples_per_s,
        "comm_seconds": stats.comm_seconds,
        **stats.extra,
    }


class _Progress:
    """A one-line progress bar on rank 0 (steps of the epoch, rate), redrawn in place."""

    def __init__(self, args: argparse.Namespace, enabled: bool) -> None:
        import time

        tty = sys.stdout.isatty()
        self.on = enabled and (args.progress == "on" or (args.progress == "auto" and tty))
        self.epochs, self.clock, self.t0, self.last = args.epochs, time.perf_counter, 0.0, 0.0
        self.width = 0

    def show(self, epoch: int, done: int, steps: int) -> None:
        if not self.on:
            return
        now = self.clock()
        if done == 1:
            self.t0 = now
        if now - self.last < 0.1 and done < steps:
            return
        self.last = now
        bar = "#" * (24 * done // steps)
        rate = (done - 1) / (now - self.t0) if now > self.t0 else 0.0
        line = f"\r  epoch {epoch + 1}/{self.epochs} [{bar:24s}] {done}/{steps} {rate:8.0f} steps/s"
        self.width = len(line)
        print(line, end="", flush=True)

    def clear(self) -> None:
        if self.on and self.width:
            print("\r" + " " * self.width + "\r", end="", flush=True)
            self.width = 0


def _trainer(args: argparse.Namespace, model: Any, data: Any, h: Any) -> Any:
    """The trainer of ``--mode``."""
    from .train import SyncTrainer

    if args.mode == "async":
        from .async_ps import AsyncTrainer

        trainer = AsyncTrainer(
            model, data, h, batch=args.batch, lr=args.lr, clip=args.clip, seed=args.seed
        )
    elif args.mode == "hogwild":
        from .hogwild import HogwildTrainer

        trainer = HogwildTrainer(model, data, h, batch=args.batch, lr=args.lr, seed=args.seed)
    else:
        trainer = SyncTrainer(
            model,
            data,
            h,
            batch=args.batch,
            lr=args.lr,
            bucket_bytes=bucket_bytes(args.bucket_mib),
            reproducible=args.reproducible,
            seed=args.seed,
            mode=args.mode,
            local_steps=args.local_steps,
        )
    return trainer


def _write(comm: Any, args: argparse.Namespace, rows: list, model: Any) -> None:
    if not args.out:
        return
    import numpy as np

    from hpcpar.runtime.results import write_csv, write_json

    params = {k: v for k, v in vars(args).items() if k != "hpcpar_command"}
    write_json(args.out, {"epochs": rows}, comm=comm, layout=args.layout, parameters=params)
    base = Path(args.out).with_suffix("")
    write_csv(f"{base}.csv", rows, comm=comm)
    if comm.Get_rank() == 0:
        np.save(f"{base}.npy", model.params, allow_pickle=False)  # the final model
        _plot(rows, f"{base}.png")


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    """Training loss and test accuracy per epoch."""
    plt = pyplot()
    if plt is None or not rows:
        return
    epochs = [r["epoch"] for r in rows]
    fig, (loss, accuracy) = plt.subplots(1, 2, figsize=(8, 3.5))
    loss.plot(epochs, [r["loss"] for r in rows], marker="o")
    loss.set_yscale("log")
    loss.set_ylabel("training loss")
    accuracy.plot(epochs, [r["test_accuracy"] for r in rows], marker="o", color="tab:green")
    accuracy.set_ylabel("test accuracy")
    for ax in (loss, accuracy):
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
    save(fig, path)


register(
    Command(
        "sgd",
        "data-parallel SGD on numpy models (sync, local, async, hogwild)",
        _add_arguments,
        _run,
    )
)


def bucket_mib(text: str) -> float | str:
    """An argparse ``type``: ``auto`` or a bucket size in MiB."""
    return "auto" if text.strip().lower() == "auto" else real(0, 1 << 20, above=True)(text)


def bucket_bytes(value: float | str) -> int:
    """Bytes per bucket for the numpy trainers (``auto``: 25 MiB, like DDP's default)."""
    return int((25.0 if value == "auto" else float(value)) * 2**20)
