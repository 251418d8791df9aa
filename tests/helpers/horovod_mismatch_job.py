"""A Horovod script whose ranks disagree on one allreduce (shape or dtype), for the tests.

``python horovod_mismatch_job.py shape|dtype``: five matching allreduces, then rank 1
passes a tensor of another shape (or dtype), then 300 more matching ones; a job that
gets to the end prints ``WRONG: finished``.
"""

from __future__ import annotations

import sys

import torch

import hpcpar.horovod.torch as hvd

hvd.init()
for _ in range(5):
    hvd.allreduce(torch.ones(3))
odd = hvd.rank() == 1
if sys.argv[1] == "shape":
    x = torch.ones(4 if odd else 3)
else:
    x = torch.ones(3, dtype=torch.float64 if odd else torch.float32)
hvd.allreduce(x)
for _ in range(300):
    hvd.allreduce(torch.ones(3))
print("WRONG: finished", flush=True)
