"""hpcpar checkpoint ls / verify / inspect / inject on a real checkpoint directory."""

from __future__ import annotations

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer, faults
from hpcpar.checkpoint.shard import decode_shard, encode_shard

from hpcpar.cli.main import main


def test_ls_verify_inspect_inject(tmp_path, capsys):
    root = tmp_path / "ck"
    with Checkpointer(root, levels=["local", "hdf5"]) as ck:
        for step in (1, 2):
            ck.save(step, {"w": np.arange(10.0) * step, "step": step, "m": {"k": np.eye(3)}}).wait()
    assert main(["checkpoint", "ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert "local: committed 2, 1" in out and "hdf5: committed 2, 1" in out
    assert "v2: 1 shard(s)" in out
    assert main(["checkpoint", "verify", str(root)]) == 0
    assert "verified 4 of 4" in capsys.readouterr().out
    assert main(["checkpoint", "inspect", str(root), "--level", "hdf5"]) == 0
    out = capsys.readouterr().out
    assert "version 2, rank 0, from hdf5" in out
    assert "m/k" in out and "(3, 3)" in out and "<f8" in out and "72" in out
    assert (
        main(
            [
                "checkpoint",
                "inject",
                str(root),
                "--fault",
                "truncate-manifest",
                "--level",
                "local",
                "--step",
                "2",
                "--rank",
                "0",
            ]
        )
        == 0
    )
    assert "truncated the manifest" in capsys.readouterr().out
    assert main(["checkpoint", "verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "local v2 rank 0 (shard):" in out and "truncated" in out and "1 bad" in out
    flip = ["--fault", "flip", "--level", "hdf5", "--step", "1", "--rank", "0", "--offset", "-1"]
    assert main(["checkpoint", "inject", str(root), *flip]) == 0
    capsys.readouterr()
    with Checkpointer(root, levels=["local", "hdf5"]) as ck:
        step, state = ck.restore()  # local v2 is damaged: HDF5 serves version 2
        assert step == 2 and ck.restored_from == ["hdf5"]
        assert np.array_equal(state["w"], np.arange(10.0) * 2)
    assert main(["checkpoint", "ls", str(tmp_path / "nothing")]) == 2
    assert "not an hpcpar checkpoint" in capsys.readouterr().err
    assert main(["checkpoint", "inject", str(root), "--fault", "delete-node"]) == 2
    assert "needs --node" in capsys.readouterr().err
    assert main(["checkpoint", "inspect", str(root), "--step", "7"]) == 2
    assert "version 7" in capsys.readouterr().err


def test_ls_counts_the_spares_pruned_versions_left(tmp_path, capsys):
    root = tmp_path / "ck"
    policy = {"keep": {"local": 1}}
    with Checkpointer(root, levels=["local"], policy=policy) as ck:
        for step in (1, 2, 3):
            ck.save(step, {"w": np.arange(1000.0) * step}).wait()
    spares = list(root.glob("nodes/node*/local/.spare/*"))
    assert len(spares) == 1  # one name per rank: version 2's file, kept for version 4
    assert main(["checkpoint", "ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert "local: committed 3" in out
    assert f"spares: 1 file(s), {spares[0].stat().st_size} bytes" in out


@pytest.mark.reliability("fault")
def test_every_truncation_and_flip_is_detected(record_property):
    rng = np.random.default_rng(3)
    flat = {"a": rng.standard_normal(50), "b/c": np.arange(7, dtype=np.int16), "n": 3, "s": "x"}
    data = encode_shard(4, 1, flat).join()
    back = decode_shard(data.copy(), 4, 1)
    assert back.keys() == flat.keys() and np.array_equal(back["a"], flat["a"])
    assert back["n"] == 3 and back["s"] == "x" and back["b/c"].dtype == np.int16
    from hpcpar.checkpoint import CheckpointError

    record_property("reliability_cases", len(range(0, data.size, 7)) + data.size)
    for cut in range(0, data.size, 7):
        with pytest.raises(CheckpointError):
            decode_shard(data[:cut].copy(), 4, 1)
    # a flipped byte is either caught, or lands in alignment padding and changes nothing
    for pos in range(data.size):
        bad = data.copy()
        bad[pos] ^= 0x5A
        try:
            got = decode_shard(bad, 4, 1)
        except CheckpointError:
            continue
        assert all(np.array_equal(got[k], flat[k]) for k in ("a", "b/c"))
        assert got["n"] == 3 and got["s"] == "x"
    with pytest.raises(CheckpointError, match="another version"):
        decode_shard(data.copy(), 5, 1)


def test_object_dtypes_in_a_manifest_are_refused(tmp_path):
    import json
    import struct
    import zlib

    from hpcpar.checkpoint import CheckpointError

    entry = {"offset": 0, "nbytes": 8, "dtype": "|O", "shape": [1], "crc32": ""}
    doc = {"format": "hpcpar-shard", "step": 1, "rank": 0, "entries": {"x": entry}}
    manifest = json.dumps(doc).encode()
    data = (
        b"\0" * 8
        + manifest
        + struct.pack("<8sQI4x", b"HPCPARS1", len(manifest), zlib.crc32(manifest))
    )
    with pytest.raises(CheckpointError, match="Python objects"):
        decode_shard(np.frombuffer(data, np.uint8).copy(), 1, 0)
    assert faults.parse_fault(None) is None
    with pytest.raises(CheckpointError, match="unknown phase"):
        faults.parse_fault("kill=later")
    with pytest.raises(CheckpointError, match="bad entry"):
        faults.parse_fault("explode=1")
    for typo, complaint in (
        ("enospc=locl,step=3", "not a level with files"),
        ("kill=write,level=xr", "not a level with files"),
        ("enospc=memory", "not a level with files"),
        ("step=3,rank=1", "no fault given"),
        ("kill=write,rank=-1", "rank must be >= 0"),
        ("kill=write,step=three", "step must be an integer"),
        ("kill=write,,rank=1", "bad entry"),
    ):
        with pytest.raises(CheckpointError, match=complaint):
            faults.parse_fault(typo)


def _shard_bytes(x, record):
    """A one-array shard written by hand with the checksum ``record`` (no hpcpar code)."""
    import json
    import struct
    import zlib

    entry = {"offset": 0, "nbytes": x.nbytes, "dtype": x.dtype.str, "shape": list(x.shape)}
    doc = {"format": "hpcpar-shard", "step": 1, "rank": 0, "entries": {"x": {**entry, **record}}}
    manifest = json.dumps(doc).encode()
    trailer = struct.pack("<8sQI4x", b"HPCPARS1", len(manifest), zlib.crc32(manifest))
    return np.frombuffer(x.tobytes() + manifest + trailer, np.uint8).copy()


def test_shards_checksummed_with_crc32c_or_zlib_crc32_both_read():
    """New shards carry CRC-32C (the crc32c package; checked here against its published
    test vector); shards written with zlib's CRC-32 by earlier versions still verify."""
    import zlib

    import crc32c
    from hpcpar.checkpoint import CheckpointError

    assert crc32c.crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value
    x = np.arange(100, dtype=np.float64)
    written = encode_shard(1, 0, {"x": x}).join()
    manifest_text = written.tobytes()
    assert b'"crc32c":"' + f"{crc32c.crc32c(x.tobytes()):08x}".encode() in manifest_text
    for record in (
        {"crc32": f"{zlib.crc32(x.tobytes()):08x}"},
        {"crc32c": f"{crc32c.crc32c(x.tobytes()):08x}"},
    ):
        data = _shard_bytes(x, record)
        assert np.array_equal(decode_shard(data.copy(), 1, 0)["x"], x)
        data[5] ^= 1  # a flipped bit in the array
        with pytest.raises(CheckpointError, match="checksum of 'x' does not match"):
            decode_shard(data, 1, 0)
    with pytest.raises(CheckpointError, match="'x' has no checksum"):
        decode_shard(_shard_bytes(x, {}), 1, 0)  # no checksum at all: refused
