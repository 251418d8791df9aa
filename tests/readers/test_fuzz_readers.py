"""Every reader of a file a user (or a damaged disk) hands hpcpar, fed random and mutated
input: each either reads it or refuses it with hpcpar's own error, never a traceback of
another kind, a hang, or executed code.

The number of inputs each property runs in CI is ``EXAMPLES`` (``READER_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcpar.errors import HpcparError

EXAMPLES = 150
READER_EXAMPLES = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


pytestmark = pytest.mark.reliability("bad_input")


@pytest.fixture(autouse=True)
def _cases(request, record_property):
    """Each property tries EXAMPLES inputs (the pickle test, a handful)."""
    if hasattr(request.function, "hypothesis"):
        record_property("reliability_cases", EXAMPLES)


def refused_cleanly(read, *args) -> None:
    """``read(*args)`` returns, or raises an HpcparError; anything else fails the test."""
    with contextlib.suppress(HpcparError):
        read(*args)


# ---- checkpoint shards and manifests ----------------------------------------------------

from hpcpar.checkpoint.shard import decode_shard, encode_shard  # noqa: E402

_TRAILER = struct.Struct("<8sQI4x")


FLAT = {"w": np.arange(6.0).reshape(2, 3), "step": 3, "name": "x", "ok": True}


def _valid_shard() -> bytes:
    return encode_shard(3, 0, FLAT).join().tobytes()


def _with_manifest(data: bytes, manifest: bytes) -> bytes:
    _, length, _ = _TRAILER.unpack(data[-_TRAILER.size :])
    body = data[: len(data) - _TRAILER.size - length]
    return body + manifest + _TRAILER.pack(b"HPCPARS1", len(manifest), zlib.crc32(manifest))


@READER_EXAMPLES
@given(st.binary(max_size=512))
def test_random_bytes_are_refused_as_a_shard(data):
    refused_cleanly(decode_shard, np.frombuffer(data, np.uint8).copy(), 3, 0)


@READER_EXAMPLES
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_a_flipped_byte_is_caught(where, value):
    data = bytearray(_valid_shard())
    where %= len(data)
    if data[where] == value:
        return
    data[where] = value
    try:
        got = decode_shard(np.frombuffer(bytes(data), np.uint8).copy(), 3, 0)
    except HpcparError:
        return
    # a byte of alignment padding, covered by no checksum: the state must still be exact
    assert got.keys() == FLAT.keys() and np.array_equal(got["w"], FLAT["w"])
    assert all(got[k] == FLAT[k] for k in ("step", "name", "ok"))


@READER_EXAMPLES
@given(
    st.sampled_from(["w", "step", "name", "ok"]),
    st.sampled_from(["offset", "nbytes", "dtype", "shape", "value", "crc32c", None]),
    JSON,
)
def test_a_manifest_with_a_valid_checksum_but_crafted_fields(entry, field, value):
    data = _valid_shard()
    _, length, _ = _TRAILER.unpack(data[-_TRAILER.size :])
    doc = json.loads(data[len(data) - _TRAILER.size - length : len(data) - _TRAILER.size])
    if field is None:
        doc["entries"][entry] = value
    else:
        doc["entries"][entry][field] = value
    crafted = _with_manifest(data, json.dumps(doc).encode())
    refused_cleanly(decode_shard, np.frombuffer(crafted, np.uint8).copy(), 3, 0)


@READER_EXAMPLES
@given(JSON)
def test_a_manifest_that_is_any_json(doc):
    crafted = _with_manifest(_valid_shard(), json.dumps(doc).encode())
    refused_cleanly(decode_shard, np.frombuffer(crafted, np.uint8).copy(), 3, 0)


# ---- checkpoint directories: the description, HDF5 files -----------------------------


@READER_EXAMPLES
@given(JSON)
def test_a_checkpoint_description_that_is_any_json(tmp_path_factory, doc):
    from hpcpar.checkpoint.inspect import scan, verify

    root = tmp_path_factory.mktemp("ck")
    (root / "hpcpar-checkpoint.json").write_text(json.dumps(doc))
    refused_cleanly(scan, root)
    refused_cleanly(verify, root)


@READER_EXAMPLES
@given(st.binary(max_size=2048))
def test_random_bytes_are_refused_as_an_hdf5_shard(tmp_path_factory, data):
    from hpcpar.checkpoint.levels.hdf5 import read_h5

    path = tmp_path_factory.mktemp("h5") / "rank0.h5"
    path.write_bytes(data)
    refused_cleanly(read_h5, path, 3, 0)


# ---- cost-model profiles and rules files ------------------------------------------------


@READER_EXAMPLES
@given(JSON)
def test_a_profile_that_is_any_json(tmp_path_factory, doc):
    from hpcpar.runtime.profile import load_profile

    path = tmp_path_factory.mktemp("profile") / "p.json"
    path.write_text(json.dumps(doc))
    refused_cleanly(load_profile, path)


_TRACE_ENTRY = {
    "comm": "world",
    "seq": 0,
    "operation": "allreduce",
    "algorithm": "mpi",
    "count": 3,
    "dtype": "float64",
    "op": "SUM",
    "root": None,
    "site": "x.py:1 in f",
    "start": 1.0,
    "end": 2.0,
    "calls": 1,
}


@READER_EXAMPLES
@given(JSON, st.sampled_from(sorted(_TRACE_ENTRY)), JSON)
def test_a_trace_file_that_is_any_json_or_has_a_crafted_field(tmp_path_factory, doc, field, value):
    from hpcpar.runtime import trace

    folder = tmp_path_factory.mktemp("trace")
    (folder / "rank0.json").write_text(json.dumps(doc))
    refused_cleanly(trace.load, folder)
    entry = {**_TRACE_ENTRY, field: value}
    good = {"format": "hpcpar-trace", "version": 1, "rank": 0, "host": "h", "entries": [entry]}
    (folder / "rank0.json").write_text(json.dumps(good))
    with contextlib.suppress(HpcparError):
        loaded = trace.load(folder)
        trace.first_divergence(loaded)  # what a trace that loads goes through
        trace.slow_ranks(loaded)
        trace.chrome_trace(loaded)


@READER_EXAMPLES
@given(JSON)
def test_a_rules_file_that_is_any_json(tmp_path_factory, doc):
    from hpcpar.collectives.cost.rules import load_rules

    path = tmp_path_factory.mktemp("rules") / "r.json"
    path.write_text(json.dumps(doc))
    refused_cleanly(load_rules, path)


# ---- experiment configs ---------------------------------------------------------------


@READER_EXAMPLES
@given(st.text(max_size=300))
def test_an_experiment_config_that_is_any_text(tmp_path_factory, text):
    from hpcpar.cli.experiment import load_config

    path = tmp_path_factory.mktemp("exp") / "e.toml"
    path.write_text(text)
    refused_cleanly(load_config, path)


# ---- application inputs ---------------------------------------------------------------


@READER_EXAMPLES
@given(st.text(alphabet="pcnf 0123456789-\n%c", max_size=200))
def test_dimacs_that_is_any_text(tmp_path_factory, text):
    from hpcpar.apps.sat import read_dimacs

    path = tmp_path_factory.mktemp("cnf") / "f.cnf"
    path.write_text(text)
    refused_cleanly(read_dimacs, path)


@READER_EXAMPLES
@given(st.text(alphabet="0123456789 .-e\n#x", max_size=200), st.none() | st.integers(-5, 10**13))
def test_an_edge_list_that_is_any_text(tmp_path_factory, text, vertices):
    from hpcpar.apps.graph.edgefile import read_edges

    from hpcpar.runtime.comm import default_comm

    path = tmp_path_factory.mktemp("edges") / "e.txt"
    path.write_text(text)
    refused_cleanly(read_edges, path, default_comm(), vertices)


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


ARRAYS = st.dictionaries(
    st.sampled_from(["x", "y", "a", "src", "dst", "weight", "meta"]),
    st.builds(
        lambda shape, kind: np.zeros(shape, dtype=kind),
        st.lists(st.integers(0, 4), max_size=3).map(tuple),
        st.sampled_from(["f8", "i8", "u1", "?", "U3", "c16"]),
    ),
    max_size=4,
)


@READER_EXAMPLES
@given(ARRAYS)
def test_training_data_that_is_any_npz(tmp_path_factory, arrays):
    from hpcpar.apps.sgd.data import load_file

    path = tmp_path_factory.mktemp("data") / "d.npz"
    path.write_bytes(_npz(arrays))
    refused_cleanly(load_file, str(path))


@READER_EXAMPLES
@given(ARRAYS)
def test_an_edge_array_that_is_any_npy(tmp_path_factory, arrays):
    from hpcpar.apps.graph.edgefile import read_edges

    from hpcpar.runtime.comm import default_comm

    path = tmp_path_factory.mktemp("edges") / "e.npy"
    np.save(path, next(iter(arrays.values()), np.zeros(0)))
    refused_cleanly(read_edges, path, default_comm(), None)


@READER_EXAMPLES
@given(ARRAYS | st.binary(max_size=300).map(lambda b: {"raw": b}))
def test_a_cfr_tree_file_that_is_anything(tmp_path_factory, arrays):
    from hpcpar.apps.cfr import load_tree

    path = tmp_path_factory.mktemp("tree") / "t.npz"
    if "raw" in arrays and isinstance(arrays["raw"], bytes):
        path.write_bytes(arrays["raw"])
    else:
        path.write_bytes(_npz(arrays))
    refused_cleanly(load_tree, path)


def test_pickles_are_never_loaded(tmp_path):
    """A file holding a pickle (object arrays) is refused by every array reader."""
    from hpcpar.apps.cfr import load_tree
    from hpcpar.apps.sgd.data import load_file

    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([Path("x")], dtype=object), y=np.array([0]))
    for read in (lambda: load_file(str(path)), lambda: load_tree(path)):
        with pytest.raises(HpcparError):
            read()
