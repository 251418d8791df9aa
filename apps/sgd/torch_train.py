"""``hpcpar sgd --framework torch``: a PyTorch model trained through ``DataParallel``.

The same data sets as the numpy modes (scikit-learn's bundled ones, synthetic sets, a
user's ``.npz``/``.h5``), loaded whole on every rank. Every global batch is the same
rows at any rank count (one shuffle per epoch), split over the ranks as evenly as it
goes; each rank's loss is weighted by its share, so the averaged gradient is the
global batch's mean whatever the split. Checkpoints hold the model and the optimizer
state once (``Replicated``: every rank holds the same), the data position and torch's
random state, so a killed run resumes to the same model, on any number of ranks.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from .models import SgdError

__all__ = ["TORCH_MODELS", "build_torch_model", "run_torch"]

TORCH_MODELS = ("mlp", "mlp2", "mlp4", "cnn")


def build_torch_model(name: str, n_features: int, n_classes: int, hidden: int, seed: int) -> Any:
    """A torch network by name.

    ``mlp``: one hidden tanh layer; ``mlp2``: two; ``mlp4``: four; ``cnn``: two 3x3
    convolutions on square single-channel images (digits' 8x8).

    Raises:
        SgdError: an unknown model, or ``cnn`` on rows that are not square images.
    """
    check_torch_model(name, n_features)
    import torch

    nn = torch.nn
    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, n_classes))
    if name in ("mlp2", "mlp4"):
        layers = [nn.Linear(n_features, hidden), nn.Tanh()]
        for _ in range(int(name[-1]) - 1):
            layers += [nn.Linear(hidden, hidden), nn.Tanh()]
        return nn.Sequential(*layers, nn.Linear(hidden, n_classes))
    side = math.isqrt(n_features)  # cnn, the last of TORCH_MODELS
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * side * side, n_classes),
    )


def check_torch_model(name: str, n_features: int) -> None:
    """Refuse a model ``build_torch_model`` cannot make, before torch is imported.

    Raises:
        SgdError: an unknown model, or ``cnn`` on rows that are not square images.
    """
    if name not in TORCH_MODELS:
        raise SgdError(f"unknown torch model {name!r}; choose from {', '.join(TORCH_MODELS)}")
    if name == "cnn" and math.isqrt(n_features) ** 2 != n_features:
        raise SgdError(
            f"cnn takes square single-channel images; {n_features} features "
            "per row are not a square"
        )


def my_rows(order: np.ndarray, index: int, batch: int, rank: int, size: int) -> np.ndarray:
    """This rank's rows of global batch ``index`` (the batch split as evenly as it goes)."""
    rows = order[index * batch : (index + 1) * batch]
    return np.array_split(rows, size)[rank]


def run_torch(comm: Any, args: argparse.Namespace) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Train as ``args`` says.

    Returns:
        The epochs' rows (the same on every rank) and the final parameters, flattened.

    Raises:
        SgdError: a bad model, data set or checkpoint.
    """
    from hpcpar.topology import Hierarchy

    from .data import load_dataset

    if args.mode not in ("sync", "local"):
        raise SgdError(f"--framework torch trains in mode sync or local, not {args.mode}")
    if args.zero and args.mode != "sync":
        raise SgdError("--zero shards the optimizer state of mode sync only")
    if args.mode == "local" and args.checkpoint_every and args.checkpoint_every % args.local_steps:
        raise SgdError(
            f"mode local saves when the ranks meet: --checkpoint-every "
            f"{args.checkpoint_every} must be a multiple of --local-steps "
            f"{args.local_steps}"
        )
    size = comm.Get_size()
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    data = load_dataset(args.dataset, args.seed)
    if args.batch < size:
        raise SgdError(f"--batch {args.batch} is smaller than the {size} ranks")
    n = data.y_train.size
    steps = n // args.batch
    if steps < 1:
        raise SgdError(f"{args.dataset}: {n} training rows make no batch of {args.batch}")
    check_torch_model(args.model, data.n_features)
    import torch  # after the checks: a bad run is refused without torch's import time

    net = build_torch_model(args.model, data.n_features, data.n_classes, args.hidden, args.seed)
    h = Hierarchy(comm, layout=args.layout)
    model = _data_parallel(args, net, h)
    opt = _optimizer(args, model)
    n_params = sum(p.numel() for p in net.parameters())
    ck, step, rows = _resume(args, h, model, opt)
    say(
        f"# hpcpar sgd: torch {args.model} ({n_params} parameters) on {args.dataset} "
        f"({n} training rows), {size} rank(s), global batch {args.batch}, lr {args.lr}, "
        f"buckets {_mib(args.bucket_mib)}"
    )
    if step:
        say(f"# resumed at step {step} (epoch {step // steps}, batch {step % steps})")
    tensors = (
        torch.from_numpy(np.ascontiguousarray(data.x_train, dtype=np.float32)),
        torch.from_numpy(data.y_train.astype(np.int64)),
    )
    told = False
    try:
        for e in range(step // steps, args.epochs):
            start = step % steps if e == step // steps else 0
            rows.append(_epoch(comm, args, (model, opt, ck), data, tensors, e, start, rows))
            step = (e + 1) * steps
            say(
                f"  epoch {e + 1:4d}  loss {rows[-1]['loss']:.4f}  test accuracy "
                f"{rows[-1]['test_accuracy']:.4f}  {rows[-1]['samples_per_s']:10.0f} samples/s",
                flush=True,
            )
            if not told and args.bucket_mib == "auto" and args.mode == "sync" and not args.zero:
                say(f"# buckets {model.bucket_plan}")
                told = True
        if getattr(opt, "taken", 0):  # local steps since the ranks last met: meet now
            opt.synchronize()
    finally:
        model.free()
        if ck is not None:
            import sys

            ck.close(sync=sys.exc_info()[0] is None)
    params = np.concatenate([p.detach().numpy().reshape(-1) for p in net.parameters()])
    h.free()
    return rows, params


def compression_of(args: argparse.Namespace, comm: Any) -> Any:
    """What ``DataParallel(compression=...)`` takes for ``--compression``."""
    name = getattr(args, "compression", None)
    if name != "powersgd":
        return name
    from hpcpar.powersgd import PowerSGD

    return PowerSGD(args.powersgd_rank, comm=comm, start_powerSGD_iter=args.powersgd_start)


def _data_parallel(args: argparse.Namespace, net: Any, h: Any) -> Any:
    """The model wrapped for data-parallel training as ``args`` say (buckets, compression)."""
    from .torch import DataParallel

    return DataParallel(
        net,
        comm=h,
        bucket_mib=args.bucket_mib,
        compression=compression_of(args, h),
        error_feedback=getattr(args, "error_feedback", False),
    )


def _epoch(
    comm: Any,
    args: argparse.Namespace,
    training: tuple[Any, Any, Any],
    data: Any,
    tensors: tuple[Any, Any],
    e: int,
    start: int,
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """Epoch ``e`` from batch ``start``, saving every ``--checkpoint-every`` steps."""
    import torch

    from .data import epoch_order

    model, opt, ck = training
    rank, size = comm.Get_rank(), comm.Get_size()
    n = data.y_train.size
    steps = n // args.batch
    every = args.checkpoint_every if args.checkpoint_every is not None else steps
    x, y = tensors  # the training rows as float32 and int64 tensors, made once
    f = torch.nn.functional
    order = epoch_order(args.seed, e, n)
    loss_sum, t0 = 0.0, time.perf_counter()
    for index in range(start, steps):
        mine = torch.from_numpy(my_rows(order, index, args.batch, rank, size).copy())
        # each rank's mean weighted by its share: the ranks' average is the global
        # batch's mean however it was split
        weight = mine.numel() * size / args.batch
        loss = f.cross_entropy(model(x[mine]), y[mine]) * weight
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_sum += float(loss.detach()) / weight * mine.numel()
        step = e * steps + index + 1
        if ck is not None and every and step % every == 0 and index + 1 < steps:
            ck.save(step, _state(args, model, opt, step, rows))
    row = _row(comm, args, model, data, e, loss_sum, t0, steps - start)
    step = (e + 1) * steps
    if ck is not None and every and step % every == 0:  # with the epoch's figures
        ck.save(step, _state(args, model, opt, step, [*rows, row]))
    return row


def _row(
    comm: Any,
    args: argparse.Namespace,
    model: Any,
    data: Any,
    e: int,
    loss_sum: float,
    t0: float,
    batches: int,
) -> dict[str, Any]:
    """The epoch's figures, the same on every rank (collective)."""
    seconds = comm.allreduce(time.perf_counter() - t0, op=_max())
    loss = comm.allreduce(loss_sum) / max(1, batches * args.batch)
    accuracy = _accuracy(model.module, data) if comm.Get_rank() == 0 else None
    return {
        "epoch": e + 1,
        "loss": loss,
        "test_accuracy": comm.bcast(accuracy, root=0),
        "seconds": seconds,
        "samples_per_s": batches * args.batch / seconds,
        "comm_seconds": 0.0,
    }


def _optimizer(args: argparse.Namespace, model: Any) -> Any:
    """Mode sync: SGD (``--zero``: its state sharded); local: inner SGD and outer steps."""
    import torch

    from .torch import LocalSGD, ZeroOptimizer

    def sgd(params: Any) -> Any:
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum)

    if args.mode == "local":
        outer_lr = 1.0 if args.outer_lr is None else args.outer_lr  # model averaging
        outer_momentum = args.outer_momentum or 0.0
        nesterov = outer_momentum > 0

        def outer(params: Any) -> Any:
            return torch.optim.SGD(params, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)

        return LocalSGD(model, sgd(model.parameters()), steps=args.local_steps, make_outer=outer)
    if args.zero:
        return ZeroOptimizer(model, sgd, hierarchical=args.layout is not None)
    return sgd(model.parameters())


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _accuracy(net: Any, data: Any) -> float:
    import torch

    with torch.no_grad():
        out = net(torch.from_numpy(np.ascontiguousarray(data.x_test, dtype=np.float32)))
    return float((out.argmax(dim=1).numpy() == data.y_test).mean())


_HISTORY = ("epoch", "loss", "test_accuracy", "seconds", "samples_per_s", "comm_seconds")


def _state(args: argparse.Namespace, model: Any, opt: Any, step: int, rows: list) -> dict[str, Any]:
    """What a resume needs.

    The model once (every rank holds the same), the optimizer's state (``--zero``: each
    rank's slice, ``Sharded``), the data position, torch's random state, and with
    ``--error-feedback`` the coding residuals (a ``Sharded`` row per rank).
    """
    import torch
    from hpcpar.checkpoint import Replicated

    net = model.module
    table = [[float(r[c]) for c in _HISTORY] for r in rows]
    extra = {"feedback": model.feedback_state()} if getattr(args, "error_feedback", 0) else {}
    return {
        **extra,
        "app": "sgd-torch",
        "model": args.model,
        "dataset": args.dataset,
        "step": step,
        "params": {k: Replicated(v.detach().numpy().copy()) for k, v in net.state_dict().items()},
        "optimizer": _optimizer_state(opt),
        "rng": Replicated(torch.get_rng_state().numpy().copy()),
        "history": Replicated(np.array(table, dtype=np.float64).reshape(len(rows), len(_HISTORY))),
    }


def _optimizer_state(opt: Any) -> dict[str, Any]:
    from hpcpar.checkpoint import Replicated, Sharded

    from .torch import LocalSGD, ZeroOptimizer

    def same(t: Any) -> Any:
        return Replicated(t.numpy().copy())

    if isinstance(opt, ZeroOptimizer):
        total = sum(opt.counts)

        def sliced(t: Any) -> Any:
            return Sharded(t.numpy().copy(), (total,), (opt.lo,)) if t.dim() else same(t)

        return {"inner": _torch_state(opt.optimizer, sliced)}
    if isinstance(opt, LocalSGD):  # saved when the ranks meet: the inner state is each rank's
        return {
            "inner": _torch_state(opt.inner, lambda t: t.numpy().copy()),
            "outer": _torch_state(opt.outer, same),
            "common": same(opt.common.detach()),
        }
    return {"inner": _torch_state(opt, same)}


def _torch_state(opt: Any, mark: Any) -> dict[str, Any]:
    import torch

    saved = opt.state_dict()
    return {
        "state": {
            str(i): {k: mark(v) if torch.is_tensor(v) else v for k, v in st.items()}
            for i, st in saved["state"].items()
        },
        "param_groups": saved["param_groups"],
    }


def _load_optimizer(opt: Any, saved: dict[str, Any]) -> None:
    import torch

    from .torch import LocalSGD, ZeroOptimizer

    def load(target: Any, state: dict[str, Any]) -> None:
        target.load_state_dict(
            {
                "state": {
                    int(i): {
                        k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v
                        for k, v in st.items()
                    }
                    for i, st in state["state"].items()
                },
                "param_groups": state["param_groups"],
            }
        )

    if isinstance(opt, ZeroOptimizer):
        load(opt.optimizer, saved["inner"])
        with torch.no_grad():  # the restored model's slice
            flat = torch.cat([p.detach().reshape(-1) for p in opt.params])
            opt.shard.copy_(flat[opt.lo : opt.hi])
    elif isinstance(opt, LocalSGD):
        load(opt.inner, saved["inner"])
        load(opt.outer, saved["outer"])
        with torch.no_grad():
            opt.common.copy_(torch.from_numpy(np.asarray(saved["common"])))
    else:
        load(opt, saved["inner"])


def _resume(args: argparse.Namespace, h: Any, model: Any, opt: Any) -> tuple[Any, int, list]:
    """The checkpointer (or None), the step to start from and the finished epochs' rows."""
    net = model.module
    if not args.checkpoint:
        return None, 0, []
    import torch
    from hpcpar.checkpoint import Checkpointer

    ck = Checkpointer(
        args.checkpoint,
        comm=h,
        levels=args.checkpoint_levels,
        local_dir=args.checkpoint_local,
    )
    if not ck.versions():
        return ck, 0, []
    from .torch import ZeroOptimizer

    if isinstance(opt, ZeroOptimizer):  # this rank's slice of the optimizer state
        _, state = ck.restore(reshard=lambda name, shape: ((opt.lo,), (opt.hi - opt.lo,)))
    else:
        _, state = ck.restore()
    state = _plain(state)
    held = f"{state.get('app')} {state.get('model')} on {state.get('dataset')}"
    if (state.get("app"), state.get("model"), state.get("dataset")) != (
        "sgd-torch",
        args.model,
        args.dataset,
    ):
        raise SgdError(
            f"{args.checkpoint} holds a checkpoint of {held}; this run trains "
            f"sgd-torch {args.model} on {args.dataset}"
        )
    try:
        net.load_state_dict(
            {k: torch.from_numpy(np.asarray(v)) for k, v in state["params"].items()}
        )
        _load_optimizer(opt, state["optimizer"])
        torch.set_rng_state(torch.from_numpy(np.asarray(state["rng"])))
        if "feedback" in state:  # what coding lost before the checkpoint is still owed
            model.load_feedback_state(state["feedback"])
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as exc:
        raise SgdError(
            f"{args.checkpoint}: the checkpoint does not fit this model ({exc})"
        ) from None
    rows = [dict(zip(_HISTORY, map(float, r), strict=True)) for r in np.asarray(state["history"])]
    for r in rows:
        r["epoch"] = int(r["epoch"])
    return ck, int(state["step"]), rows


def _plain(value: Any) -> Any:
    """A restored state with its Replicated leaves as plain arrays."""
    from hpcpar.checkpoint import Replicated, Sharded

    if isinstance(value, (Replicated, Sharded)):
        return np.asarray(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _mib(value: float | str) -> str:
    return "auto" if value == "auto" else f"of {value:g} MiB"
