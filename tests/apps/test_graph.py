"""The graph app on one process: files, statistics, search keys, the CLI and its errors."""

from __future__ import annotations

import json
import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hpcpar.apps.graph import GraphError, kronecker
from hpcpar.apps.graph.driver import output_block, run, statistics
from hpcpar.apps.graph.edgefile import read_edges, write_h5
from hpcpar.apps.graph.graph import DistGraph
from hpcpar.apps.graph.search import bfs
from scipy.sparse import csgraph

import hpcpar
from hpcpar.cli.main import main
from hpcpar.errors import LayoutError
from hpcpar.layout import node_assignment


@pytest.fixture
def comm():
    return hpcpar.default_comm()


@pytest.mark.parametrize("sizes", [[16, 8, 3], [13, 6, 21], [1, 0, 9, 7], [30, 30, 30]])
def test_joined_bitmaps_are_the_concatenated_masks(sizes):
    from hpcpar.apps.graph.kernels import bitmap, frontier_bits, join_bits

    rng = np.random.default_rng(len(sizes) + sum(sizes))
    masks = [rng.random(s) < 0.5 for s in sizes]
    got = np.concatenate([frontier_bits(np.flatnonzero(m), m.size) for m in masks])
    whole = np.concatenate(masks)
    joined = join_bits(
        got, np.array(sizes, dtype=np.int64), np.zeros(-(-whole.size // 8), np.uint8)
    )
    assert np.array_equal(joined, bitmap(whole))


def test_light_ends_and_the_weight_table_match_numpy(comm):
    g = DistGraph.build(kronecker(9, 8, seed=4), comm=comm)
    rows = np.split(g.weight, g.indptr[1:-1])
    for delta in (0.0, 1 / 16, 0.5, np.inf):
        want = g.indptr[:-1] + [np.searchsorted(r, delta) for r in rows]
        assert np.array_equal(g.light_ends(delta), want)
    cdf = g.weight_cdf()
    assert cdf[-1] == g.weight.max() and cdf.size == 1026
    steps = np.linspace(0.0, cdf[-1], 1025)
    exact = np.searchsorted(np.sort(g.weight), steps) / g.weight.size
    assert np.abs(cdf[:-1] - exact).max() < 0.03  # 4,096 draws: a few sigma
    g.free()


@pytest.mark.parametrize("direction", ["auto", "push", "pull"])
def test_sssp_takes_infinite_and_zero_weights(comm, direction):
    from hpcpar.apps.graph.kronecker import EdgeList
    from hpcpar.apps.graph.search import sssp

    src, dst = np.array([0, 1, 2, 3, 0, 5]), np.array([1, 2, 3, 4, 4, 6])
    w = np.array([0.5, np.inf, 0.2, 0.0, 3.0, 1.0])
    g = DistGraph.build(EdgeList(src, dst, w, 7, 6, 0), comm=comm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = sssp(g, 0, delta=0.1, direction=direction)
    assert found.dist.tolist() == [0.0, 0.5, 3.2, 3.0, 3.0, np.inf, np.inf]
    assert found.parent.tolist() == [0, 0, 3, 4, 0, -1, -1]
    assert np.isfinite(g.weight_cdf()).all()
    g.free()


def test_statistics_are_the_reference_implementations():
    x = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0]
    s = statistics(x)
    xx = sorted(x)  # get_statistics in the reference main.c, by hand for n = 6
    assert s["firstquartile"] == (xx[1] + xx[1]) / 2
    assert s["median"] == (xx[2] + xx[3]) / 2
    assert s["thirdquartile"] == (xx[4] + xx[4]) / 2
    assert s["stddev"] == pytest.approx(np.std(x, ddof=1))
    assert (s["min"], s["max"], s["mean"]) == (1.0, 9.0, 4.0)


def test_a_run_prints_the_specification_block_and_harmonic_mean(comm, capsys):
    result = run(comm, kinds=("bfs", "sssp"), scale=8, roots=8)
    text = output_block(result)
    for key in (
        "SCALE:",
        "NBFS:",
        "bfs  harmonic_mean_TEPS:     !  ",
        "sssp median_TEPS:",
        "construction_time:",
        "bfs  max_validate:",
        "median_nedge:",
    ):
        assert key in text
    assert all(len(line.split(":")[0]) < 32 for line in text.splitlines())
    secs = np.array(result.times["bfs"]) / np.array(result.nedge)
    assert result.harmonic_teps("bfs") == pytest.approx(1 / secs.mean())
    assert len(result.roots) == 8 and len(set(result.roots)) == 8


def test_search_keys_have_edges_and_are_all_used_when_few(comm):
    src, dst = np.array([0, 1, 3, 3, 6]), np.array([1, 2, 3, 3, 7])  # 3: self-loops only
    path = None
    from hpcpar.apps.graph import EdgeList

    edges = EdgeList(src, dst, np.ones(5), 10, 5, 0)
    g = DistGraph.build(edges, comm=comm)
    from hpcpar.apps.graph.driver import search_keys

    assert search_keys(g, 64, seed=1) == [0, 1, 2, 6, 7]
    picked = search_keys(g, 3, seed=1)
    assert len(set(picked)) == 3 and set(picked) <= {0, 1, 2, 6, 7}
    with pytest.raises(GraphError, match="degree 0"):
        bfs(g, 3)
    with pytest.raises(GraphError, match="outside"):
        bfs(g, 10)
    del path
    g.free()


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_text_npy_and_h5_files_give_the_same_edges(comm, tmp_path):
    e = kronecker(6, 4, seed=2)
    lines = "# a comment\n% another\n\n" + "".join(
        f"{u} {v} {float(w)!r}\n" for u, v, w in zip(e.src, e.dst, e.weight, strict=True)
    )
    txt = _write(tmp_path, "g.txt", lines)
    npy = tmp_path / "g.npy"
    np.save(npy, np.stack([e.src, e.dst, e.weight], axis=1))
    h5 = tmp_path / "g.h5"
    write_h5(h5, e, comm, {"scale": 6})
    for path in (txt, npy, h5):
        got = read_edges(path, comm, None if path != txt else 64)
        assert got.n_vertices == 64 and got.n_edges == e.n_edges
        np.testing.assert_array_equal(got.src, e.src)
        np.testing.assert_array_equal(got.dst, e.dst)
        np.testing.assert_array_equal(got.weight, e.weight)
    two = _write(tmp_path, "two.txt", "0 1\n1 2\n")
    got = read_edges(two, comm)
    assert got.n_vertices == 3 and list(got.weight) == [1.0, 1.0]


@pytest.mark.parametrize(
    "text, match",
    [
        ("0 1\n1 x\n", r"bad\.txt:2: bad token in '1 x'"),
        ("0 1\n1 2 0.5\n", r"bad\.txt:2: expected 2 columns"),
        ("0\n", r"bad\.txt:1: expected 2 or 3 columns"),
        ("0 1 nan\n", r"bad\.txt:1: weight nan is not finite"),
        ("0 -1\n", r"vertex -1, outside \[0, "),
        ("# only a comment\n", "no vertices"),
    ],
)
def test_malformed_text_files_are_refused_with_the_line(comm, tmp_path, text, match):
    path = _write(tmp_path, "bad.txt", text)
    with pytest.raises(GraphError, match=match):
        read_edges(path, comm)


def test_bad_binary_files_and_ids_beyond_the_vertex_count(comm, tmp_path):
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([[0, 1]], dtype=object), allow_pickle=True)
    with pytest.raises(GraphError, match=r"not a readable \.npy"):
        read_edges(obj, comm)  # object arrays would need pickle: never loaded
    frac = tmp_path / "frac.npy"
    np.save(frac, np.array([[0, 1.5]]))
    with pytest.raises(GraphError, match="row 0: vertex ids must be integers"):
        read_edges(frac, comm)
    shape = tmp_path / "shape.npy"
    np.save(shape, np.zeros((3, 4)))
    with pytest.raises(GraphError, match=r"\(m, 2\) or \(m, 3\)"):
        read_edges(shape, comm)
    fake = _write(tmp_path, "fake.h5", "not hdf5")
    with pytest.raises(GraphError, match="not a readable HDF5"):
        read_edges(fake, comm)
    ok = _write(tmp_path, "ok.txt", "0 5\n")
    with pytest.raises(GraphError, match=r"vertex 5, outside \[0, 4\)"):
        read_edges(ok, comm, n_vertices=4)
    with pytest.raises(GraphError, match="no such file"):
        read_edges(tmp_path / "missing.txt", comm)


def test_graph_files_never_unpickle(tmp_path):
    evil = tmp_path / "evil.npy"
    evil.write_bytes(pickle.dumps([[0, 1]]))
    with pytest.raises(GraphError):
        read_edges(evil, hpcpar.default_comm())


def test_map_layouts_and_hierarchy_split(comm):
    assert node_assignment("map:3,3,1,0", 4) == [0, 0, 1, 2]  # renumbered by lowest rank
    with pytest.raises(LayoutError, match="names the node of 2"):
        node_assignment("map:0,1", 3)
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        sub = h.split(0, comm.Get_rank())
        assert sub.node_of == [0] and sub.layout == "map:0"
        sub.free()
        sub.comm.Free()


def _cli(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_runs_bfs_and_sssp_and_writes_json(capsys, tmp_path):
    out = tmp_path / "r.json"
    status, text, _ = _cli(
        capsys,
        "graph",
        "all",
        "--scale",
        "7",
        "--roots",
        "4",
        "--partition",
        "1d-edge",
        "--out",
        str(out),
    )
    assert status == 0 and "sssp harmonic_mean_TEPS:     !" in text
    doc = json.loads(out.read_text())
    assert doc["results"]["bfs_harmonic_mean_teps"] > 0 and doc["results"]["n"] == 128


def test_cli_generate_then_search_the_file_matches_scipy(capsys, tmp_path):
    h5 = tmp_path / "k.h5"
    assert _cli(capsys, "graph", "generate", "--scale", "7", "--out", str(h5))[0] == 0
    status, text, _ = _cli(capsys, "graph", "bfs", "--input", str(h5), "--roots", "2")
    assert status == 0 and "SCALE:                          file" in text
    e = kronecker(7, 16, seed=1)
    keep = e.src != e.dst
    a = sp.coo_matrix((np.ones(keep.sum()), (e.src[keep], e.dst[keep])), shape=(128, 128))
    reach = csgraph.breadth_first_order(a + a.T, int(e.src[keep][0]), directed=False)[0]
    g = DistGraph.build(read_edges(h5, hpcpar.default_comm()), comm=hpcpar.default_comm())
    found = bfs(g, int(e.src[keep][0]))
    assert set(np.flatnonzero(found.parent >= 0)) == set(reach)
    g.free()


@pytest.mark.parametrize(
    "argv, match",
    [
        (["bfs", "--scale", "38"], "GiB is available"),
        (["bfs", "--scale", "0"], "--scale: expected an integer from 1 to 40"),
        (["bfs", "--scale", "6", "--root", "100000"], "outside"),
        (["bfs", "--scale", "6", "--roots", "0"], "--roots: expected an integer from 1"),
        (["bfs", "--scale", "6", "--partition", "2d", "--grid", "3x3"], "does not have"),
        (["bfs", "--scale", "6", "--grid", "axb", "--partition", "2d"], "RxC"),
        (["sssp", "--scale", "6", "--delta", "-1"], "--delta: expected a number above 0"),
        (["generate", "--scale", "6"], "needs --out"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(capsys, argv, match):
    status, _, err = _cli(capsys, "graph", *argv)
    assert status == 2 and match in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_negative_weights_are_refused_for_sssp_only(capsys, tmp_path):
    path = _write(tmp_path, "neg.txt", "0 1 0.5\n1 2 -0.25\n")
    status, _, err = _cli(capsys, "graph", "sssp", "--input", str(path))
    assert status == 2 and "negative weight -0.25" in err
    status, text, _ = _cli(capsys, "graph", "bfs", "--input", str(path), "--roots", "3")
    assert status == 0 and "NBFS:                           3" in text


def _fake_gap(folder, seconds):
    """Stand-ins for GAP's bfs and sssp that print its lines (the parser's reference)."""
    folder.mkdir()
    for kernel in ("bfs", "sssp"):
        script = folder / kernel
        trials = "".join(f"echo 'Trial Time:          {s:.5f}'\n" for s in seconds)
        script.write_text(
            f'#!/bin/sh\necho "$@" > {folder / kernel}.args\n'
            f"echo 'Build Time:          0.25000'\n{trials}"
            "echo 'Average Time:        0.00000'\n"
        )
        script.chmod(0o755)


def test_bench_graph_against_gap_and_its_memory_per_edge(tmp_path):
    from launching import hpcpar

    _fake_gap(tmp_path / "gap", [0.002, 0.004])
    gap = str(tmp_path / "gap")
    proc = hpcpar(
        "bench",
        "graph",
        "--scales",
        "9",
        "--roots",
        "2",
        "--partitions",
        "1d-vertex",
        "--no-scipy",
        "--gap-binary",
        gap,
        "--output",
        str(tmp_path / "g"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "g.json").read_text())["results"]
    by = {(r["variant"], r["kernel"]): r for r in rows}
    assert "scipy" not in {r["variant"] for r in rows}
    for kernel in ("bfs", "sssp"):
        ours, gap = by[("hpcpar-1d-vertex", kernel)], by[("gap", kernel)]
        # GAP's trials in Graph500 edges: the harmonic mean is edges / mean time
        edges = gap["teps"]["harmonic_mean"] * 0.003
        assert gap["teps"]["max"] == pytest.approx(edges / 0.002)
        assert gap["construction_s"] == 0.25
        assert ours["vs_gap"] == pytest.approx(ours["teps"]["harmonic_mean"] / (edges / 0.003))
        # the graph: 4-byte targets, 8-byte weights and an 8-byte offset per column vertex
        assert ours["graph_bytes"] >= 12 * 2 * 16 * 2**9 * 0.9
        assert ours["peak_bytes_per_edge"] > ours["graph_bytes"] / (16 * 2**9)
    # run as GAP's own benchmark runs its Kronecker graph: sssp with -d2
    assert (tmp_path / "gap" / "bfs.args").read_text().split() == ["-g", "9", "-k", "16", "-n", "2"]
    assert (tmp_path / "gap" / "sssp.args").read_text().split()[-2:] == ["-d", "2"]
    assert by[("gap", "sssp")]["delta"] == 2.0
    assert "bytes per input edge" in proc.stdout


def test_bench_graph_sweeps_gaps_delta_and_compares_with_the_fastest(tmp_path):
    """``--gap-delta 1,2,4``: GAP's sssp once per delta (a row each); hpcpar's ratio is
    to the fastest of them, GAP's own rows' ratios to it too."""
    from launching import hpcpar

    folder = tmp_path / "gap"
    _fake_gap(folder, [0.002])
    seconds = {"1": 0.004, "2": 0.001, "4": 0.002}  # -d2 fastest
    cases = "".join(f"  {d}) t={t};;\n" for d, t in seconds.items())
    (folder / "sssp").write_text(
        f'#!/bin/sh\necho "$@" >> {folder}/sssp.args\nfor a; do d=$a; done\n'
        f'case $d in\n{cases}esac\necho "Trial Time:          $t"\n'
    )
    run = ["bench", "graph", "--scales", "8", "--roots", "1", "--partitions", "1d-vertex"]
    gap = ["--gap-binary", str(folder), "--gap-delta", "1,2,4"]
    proc = hpcpar(*run, "--kernels", "sssp", "--no-scipy", *gap, "--output", str(tmp_path / "g"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "g.json").read_text())["results"]
    by = {r["variant"]: r for r in rows}
    assert {"gap-d1", "gap-d2", "gap-d4"} <= set(by)
    assert [line.split()[-1] for line in (folder / "sssp.args").read_text().splitlines()] == [
        "1",
        "2",
        "4",
    ]
    fastest = by["gap-d2"]["teps"]["harmonic_mean"]
    for variant, row in by.items():
        assert row["vs_gap"] == pytest.approx(row["teps"]["harmonic_mean"] / fastest), variant
    assert by["gap-d1"]["vs_gap"] == pytest.approx(0.25)
    bad = hpcpar("bench", "graph", "--gap-delta", "2,0", "--gap-binary", str(folder))
    assert bad.returncode == 2 and "--gap-delta" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.reliability("bad_input")
def test_bench_graph_without_gap_binaries_is_a_one_line_error(tmp_path):
    from launching import hpcpar

    proc = hpcpar("bench", "graph", "--scales", "8", "--gap-binary", str(tmp_path))
    assert proc.returncode == 2 and "no executable" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
