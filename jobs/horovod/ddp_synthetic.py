"""Horovod's ``pytorch_synthetic_benchmark.py`` loop trained by PyTorch's DDP over gloo.

The peer of ``compare.py``: the same options, model (``torchvision.models``), fixed
fake data, optimizer (SGD, lr 0.01 x size) and timing (``timeit`` over
``--num-batches-per-iter`` steps, ``--num-iters`` times, after the warm-up), printed in
the same lines. DDP runs as PyTorch recommends: 25 MiB buckets (its default),
``gradient_as_bucket_view=True``, gloo on the loopback on one host, else on the
interface the ranks share (``apps/sgd/gloo.py``); ``--fp16-allreduce`` registers DDP's
``fp16_compress_hook``. Started under ``hpcpar launch``/``vcluster run`` (MPI gives
the ranks and the rendezvous address only).
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from hpcpar.apps.sgd.gloo import torch_group
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel
from torchvision import models


def main() -> None:
    """Parse Horovod's benchmark options and run the loop under DDP."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp16-allreduce", action="store_true", default=False)
    parser.add_argument("--model", type=str, default="resnet50")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--no-cuda", action="store_true", default=True)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    dist = torch_group(comm)
    rank, size = dist.get_rank(), dist.get_world_size()
    model = getattr(models, args.model)()
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)  # broadcasts rank 0's
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01 * size)
    data = torch.randn(args.batch_size, 3, 224, 224)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(data), target)
        loss.backward()
        optimizer.step()

    def log(s: str) -> None:
        if rank == 0:
            print(s, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {size}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
        img_secs.append(img_sec)
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
