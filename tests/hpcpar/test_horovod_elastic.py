"""``hvd.elastic``: a job killed at 4 ranks resumes at 2 and at 3 from its last commit.

The reference is this process training the same global batches from the start; the
resumed runs must reach its model within reduction-order tolerance.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from launching import clean_env, launch

pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")
pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parents[1] / "helpers" / "elastic_job.py")
STEPS, KILL_AT = 8, 5


def _uninterrupted():
    """The job's training in this process, from the start, on the whole batches."""
    import torch
    from elastic_job import batch, make_model

    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _params(path):
    return {k: np.array(v) for k, v in json.loads(Path(path).read_text())["params"].items()}


@pytest.mark.reliability("fault")
@pytest.mark.timeout(300)
def test_killed_at_four_ranks_resumes_at_two_and_three(tmp_path):
    ck = tmp_path / "ck"
    killed = launch(
        4,
        sys.executable,
        JOB,
        str(tmp_path / "killed.json"),
        str(STEPS),
        str(KILL_AT),
        env=clean_env(HPCPAR_ELASTIC_DIR=str(ck)),
    )
    assert killed.returncode != 0 and not (tmp_path / "killed.json").exists()
    want = _uninterrupted()
    for ranks in (2, 3):
        copy = tmp_path / f"ck{ranks}"
        shutil.copytree(ck, copy)
        out = tmp_path / f"resumed{ranks}.json"
        again = launch(
            ranks,
            sys.executable,
            JOB,
            str(out),
            str(STEPS),
            env=clean_env(HPCPAR_ELASTIC_DIR=str(copy)),
        )
        assert again.returncode == 0, again.stderr
        # resumed from commit KILL_AT: the steps after it only
        assert json.loads(out.read_text())["commits"] == STEPS
        got = _params(out)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-9, atol=1e-12, err_msg=name)


def test_elastic_state_restores_its_last_commit_in_memory():
    import subprocess

    script = (
        "import torch, hpcpar.horovod.torch as hvd\n"
        "hvd.init()\n"
        "m = torch.nn.Linear(2, 1)\n"
        "s = hvd.elastic.TorchState(m, None, epoch=3, names=['a'])\n"
        "w = m.weight.detach().clone()\n"
        "s.commit()\n"
        "with torch.no_grad(): m.weight.add_(1.0)\n"
        "s.epoch = 9; s.names.append('b')\n"
        "s.restore()\n"
        "assert torch.equal(m.weight, w) and s.epoch == 3 and s.names == ['a'], 'restore'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=clean_env()
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
