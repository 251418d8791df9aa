"""Data-parallel training of PyTorch models over hpcpar's collectives.

An ordinary training loop becomes data-parallel by wrapping the model; each rank feeds
its own part of every global batch::

    from hpcpar.apps.sgd.torch import DataParallel

    model = DataParallel(net)                        # parameters from rank 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in my_batches:                          # this rank's rows
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()                              # gradients averaged over ranks
        opt.step()

Gradients are grouped into buckets of about ``bucket_mib`` MiB (or a size chosen from the
cost model and the first backward pass: see ``plan_buckets``), in the reverse order of
the parameters' registration (the order in which the backward pass produces them). A
parameter's gradient is copied into its bucket as soon as autograd has accumulated it;
a full bucket is handed to a communication thread that reduces it with
``hpcpar.iallreduce`` (any algorithm, ``auto`` by default, over real or virtual nodes)
while the backward pass goes on computing the next ones (where the host has a core to
spare for the thread: see ``overlap``). Buckets are reduced in the same order on every
rank; at the end of the backward pass the rest are sent, and the averaged gradients are
written back before ``backward()`` returns.

Why a thread: an MPI library progresses a nonblocking collective only inside MPI calls,
and the backward pass makes none, so ``iallreduce`` started from a hook would mostly
run when the pass ends. The thread makes those calls while autograd computes, sleeping
a few microseconds between them (mpi4py and ``time.sleep`` release the GIL), so the
data moves while the core stays with the backward pass. The thread uses its own
duplicate of the communicator, so the program's own collectives on ``comm`` never
interleave with it. ``overlap=False`` reduces every bucket after the backward pass
instead; ``hpcpar bench sgd`` measures both against PyTorch's
``DistributedDataParallel``.

CPU tensors reach hpcpar without copies (their numpy views); CUDA tensors go the same
way as cupy arrays (DLPack). Parameters that a rank did not use in a backward pass
contribute zeros; a parameter that no rank used keeps its gradient as it was.
"""

from __future__ import annotations

from hpcpar.gradients import plan_buckets

from .data_parallel import DataParallel
from .local_sgd import LocalSGD
from .zero import ZeroOptimizer

__all__ = ["DataParallel", "LocalSGD", "ZeroOptimizer", "plan_buckets"]
