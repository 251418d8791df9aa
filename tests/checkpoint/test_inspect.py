"""hpcpar checkpoint ls / verify on a real checkpoint directory."""

from __future__ import annotations

import numpy as np
from hpcpar.checkpoint import Checkpointer

from hpcpar.cli.main import main


def test_ls_and_verify(tmp_path, capsys):
    root = tmp_path / "ck"
    with Checkpointer(root, levels=["local"]) as ck:
        for step in (1, 2):
            ck.save(step, {"w": np.arange(10.0) * step, "step": step}).wait()
    assert main(["checkpoint", "ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert "committed versions: 2, 1" in out and "v2: 1 shard(s)" in out
    assert main(["checkpoint", "verify", str(root)]) == 0
    assert "verified 2 of 2" in capsys.readouterr().out
    npy = next(root.glob("local/node0/v000000000002/rank0/*.npy"))
    npy.write_bytes(npy.read_bytes()[:-3])  # truncate an array file
    assert main(["checkpoint", "verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "v2 rank 0:" in out and "checksum" in out and "1 bad" in out
    assert main(["checkpoint", "ls", str(tmp_path / "nothing")]) == 2
    assert "not an hpcpar checkpoint" in capsys.readouterr().err
