"""SAT app on one process: DIMACS, generator, solvers (refereed by python-sat), predictions."""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import sys

import numpy as np
import pytest
from hpcpar.apps.sat import (
    ALGORITHMS,
    CNF,
    LocalSearch,
    SatError,
    check_model,
    random_ksat,
    read_dimacs,
    write_dimacs,
)
from hpcpar.apps.sat import kernels as K
from hpcpar.apps.sat.predict import (
    expected_min,
    expected_min_empirical,
    fit_laws,
    speedup_table,
)
from hpcpar.apps.sat.solver import probsat_defaults
from scipy import stats

from hpcpar.cli.main import main


def _referee_accepts(cnf: CNF, model: np.ndarray) -> bool:
    """python-sat's MiniSat: the formula with every variable fixed to ``model`` is SAT."""
    solvers = pytest.importorskip("pysat.solvers", reason="python-sat is the referee")
    clauses = [cnf.clause(i).tolist() for i in range(cnf.n_clauses)]
    assumptions = [v + 1 if model[v] else -(v + 1) for v in range(cnf.n_vars)]
    with solvers.Minisat22(bootstrap_with=clauses) as s:
        return bool(s.solve(assumptions=assumptions))


def _write(tmp_path, text, name="f.cnf", opener=open):
    path = tmp_path / name
    with opener(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    return path


BAD = [
    ("p cnf 3 2\n1 -2 0\n", "header declares 2 clauses but the file has 1"),
    ("p cnf 3 1\n1 4 0\n", "line 2: literal 4 out of range"),
    ("p cnf 3 1\n1 2\n", "line 2: the last clause has no terminating 0"),
    ("p cnf 3 2\n1 2 0\n0\n", "line 3: empty clause"),
    ("", "no 'p cnf' header"),
    ("c only a comment\n", "no 'p cnf' header"),
    (b"p cnf 3 1\n\x00\x01\xff\xfe 0\n", "line 2: binary data"),
    (b"\x89PNG\r\n\x1a\n\xff\xd8", "line 1: binary data"),
    ("p cnf 3 1\n1 x 0\n", "line 2: 'x' is not an integer literal"),
    ("1 2 0\np cnf 3 1\n", "line 1: clause before the 'p cnf' header"),
    ("p cnf 3 1\np cnf 3 1\n1 0\n", "line 2: a second 'p cnf' header"),
    ("p dnf 3 1\n1 0\n", "line 1: header must be 'p cnf VARIABLES CLAUSES'"),
    ("p cnf -3 1\n1 0\n", "line 1: header must be"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_reader_refuses_bad_files_with_the_line(tmp_path, text, message):
    with pytest.raises(SatError, match=message):
        read_dimacs(_write(tmp_path, text))


def test_cli_bad_file_is_one_line_and_status_2(tmp_path, capsys):
    path = _write(tmp_path, "p cnf 3 1\n1 4 0\n")
    assert main(["sat", "solve", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2: literal 4 out of range" in err[0]
    assert main(["sat", "solve", str(tmp_path / "missing.cnf")]) == 2


COMPRESSED = [("", open), (".gz", gzip.open), (".xz", lzma.open), (".bz2", bz2.open)]


@pytest.mark.parametrize(("suffix", "opener"), COMPRESSED)
def test_round_trip_plain_and_compressed(tmp_path, suffix, opener):
    cnf, _ = random_ksat(60, 250, 4, seed=3)
    path = tmp_path / f"f.cnf{suffix}"
    write_dimacs(cnf, path, ["a comment"])
    with opener(path, "rb") as f:  # really compressed with that format
        assert f.read().startswith(b"c a comment\np cnf 60 250\n")
    back = read_dimacs(path)
    assert back.n_vars == 60 and np.array_equal(back.lits, cnf.lits)
    assert np.array_equal(back.starts, cnf.starts)


def test_reader_takes_clauses_over_lines_and_satlib_end_marker(tmp_path):
    text = "c x\np cnf 4 3\n1 -2\n 3 0 -4 0\n\n2 4 0\n%\n0\n"
    cnf = read_dimacs(_write(tmp_path, text))
    assert [cnf.clause(i).tolist() for i in range(3)] == [[1, -2, 3], [-4], [2, 4]]


def test_random_ksat_shape_distinct_variables_and_planting():
    cnf, hidden = random_ksat(100, 426, 3, seed=5, planted=True)
    rows = np.abs(cnf.lits).reshape(-1, 3)
    assert cnf.n_clauses == 426 and rows.min() >= 1 and rows.max() <= 100
    assert all(len(set(r)) == 3 for r in rows.tolist())
    assert check_model(cnf, hidden) == -1 and _referee_accepts(cnf, hidden)
    again, _ = random_ksat(100, 426, 3, seed=5, planted=True)
    assert np.array_equal(again.lits, cnf.lits)
    with pytest.raises(SatError, match="1 <= k <= n"):
        random_ksat(2, 5, 3)


def test_check_model_finds_the_first_false_clause():
    cnf = CNF.from_clauses(3, [[1, 2], [-1, 3], [-2, -3]])
    assert check_model(cnf, np.array([True, False, True])) == -1
    assert check_model(cnf, np.array([True, False, False])) == 1
    assert check_model(cnf, np.array([False, True, True])) == 2
    with pytest.raises(SatError, match="2 values for 3 variables"):
        check_model(cnf, np.array([True, False]))


def test_probsat_defaults_are_the_sc13_table():
    assert probsat_defaults(3) == ("poly", 2.06, 0.9)
    assert [probsat_defaults(k)[1] for k in (4, 5, 6, 7, 9)] == [2.85, 3.7, 5.1, 5.4, 5.4]


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize(("n", "k", "ratio"), [(1000, 3, 4.2), (300, 5, 15.0)])
def test_solvers_find_models_the_referee_accepts(algorithm, n, k, ratio):
    cnf, _ = random_ksat(n, int(ratio * n), k, seed=11, planted=True)
    ls = LocalSearch(cnf, algorithm, seed=2)
    assert ls.run(5_000_000), f"{algorithm} found no model in 5M flips"
    model = ls.model()
    assert check_model(cnf, model) == -1 and _referee_accepts(cnf, model)


def test_solvers_on_uniform_instances_agree_with_minisat():
    solvers = pytest.importorskip("pysat.solvers", reason="python-sat is the referee")
    seen = 0
    for seed in range(6):
        cnf, _ = random_ksat(150, 640, 3, seed=seed)
        with solvers.Minisat22(
            bootstrap_with=[cnf.clause(i).tolist() for i in range(cnf.n_clauses)]
        ) as s:
            satisfiable = s.solve()
        for algorithm in ALGORITHMS:
            ls = LocalSearch(cnf, algorithm, seed=seed)
            solved = ls.run(300_000)
            assert not solved or satisfiable  # a model of an unsatisfiable formula: a bug
            if solved:
                assert _referee_accepts(cnf, ls.model())
                seen += 1
    assert seen >= 6


def _recount(ls: LocalSearch):
    """Every counter recomputed from scratch from the current assignment."""
    m, n = ls.numtrue.size, ls.a.size
    fresh = [
        np.zeros(m, np.int32),
        np.zeros(m, np.int32),
        np.zeros(n, np.int32),
        np.zeros(n, np.int32),
        np.zeros(m, np.int32),
        np.zeros(m, np.int32),
        np.zeros(1, np.int64),
    ]
    K.init_state(ls.cvar, ls.csign, ls.cstart, ls.a, *fresh)
    return fresh


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_incremental_counters_equal_a_recount(algorithm):
    # mixed clause lengths, a repeated literal and a tautology (dropped as always true)
    rng = np.random.default_rng(4)
    clauses = [
        list(rng.choice([-1, 1], k) * rng.choice(np.arange(1, 41), k, replace=False))
        for k in rng.integers(1, 6, 170)
    ]
    clauses += [[3, 3, -7], [5, -5, 9]]
    cnf = CNF.from_clauses(40, [[int(x) for x in c] for c in clauses])
    ls = LocalSearch(cnf, algorithm, seed=1)
    assert ls.cstart.size - 1 == cnf.n_clauses - 1  # the tautology is gone
    for flips in (1, 7, 50, 333):
        ls.run(flips)
        numtrue, critx, brk, make, _, _, nfalse = _recount(ls)
        assert np.array_equal(ls.numtrue, numtrue)
        assert np.array_equal(ls.brk, brk)
        if algorithm == "cc":
            assert np.array_equal(ls.make, make)
        single = ls.numtrue == 1
        assert np.array_equal(ls.critx[single], critx[single])
        assert ls.n_false == int(nfalse[0])
        assert set(ls.false[: ls.n_false].tolist()) == set(np.flatnonzero(numtrue == 0).tolist())
        assert np.all(ls.where[ls.false[: ls.n_false]] == np.arange(ls.n_false))
        assert check_model(cnf, ls.model()) == (-1 if ls.solved else check_model(cnf, ls.model()))


@pytest.mark.parametrize(("n", "k", "ratio"), [(60, 3, 4.6), (40, 5, 21.0), (30, 7, 88.0)])
def test_the_probsat_kernel_takes_the_general_kernels_flips(n, k, ratio):
    # the specialised loop (locals for the counters) against the general one, from one
    # state, on unsatisfiable-density instances so that every flip is taken
    cnf, _ = random_ksat(n, int(ratio * n), k, seed=2)
    fast, general = LocalSearch(cnf, seed=4), LocalSearch(cnf, seed=4)
    for flips in (1, 10, 5000):
        fast.run(flips)
        K.search(
            K.ALG_PROBSAT,
            general.params,
            general.probs,
            general.cvar,
            general.csign,
            general.cstart,
            general.occ,
            general.ostart,
            general.a,
            general.numtrue,
            general.critx,
            general.brk,
            general.make,
            general.false,
            general.where,
            general.nfalse,
            general.conf,
            general.age,
            general.rng,
            general.weight,
            0,
            flips,
        )
        for name in ("a", "numtrue", "critx", "brk", "false", "where", "nfalse", "rng"):
            assert np.array_equal(getattr(fast, name), getattr(general, name)), name


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_restored_state_continues_flip_for_flip(algorithm):
    cnf, _ = random_ksat(50, 1000, 3, seed=1)  # unsatisfiable: never stops early
    whole = LocalSearch(cnf, algorithm, seed=9, restart=1500)
    whole.run(4000)
    first = LocalSearch(cnf, algorithm, seed=9, restart=1500)
    first.run(2500)
    state = first.state()
    second = LocalSearch(cnf, algorithm, seed=123, restart=1500)
    second.load_state(state)
    second.run(1500)
    assert second.flips == whole.flips == 4000
    assert np.array_equal(second.a, whole.a) and np.array_equal(second.rng, whole.rng)
    other = LocalSearch(cnf, "walksat" if algorithm != "walksat" else "cc", seed=9)
    with pytest.raises(SatError, match="checkpoint is for"):
        other.load_state(state)


def test_bad_solver_parameters_are_refused():
    cnf, _ = random_ksat(20, 50, 3)
    with pytest.raises(SatError, match="unknown algorithm 'gsat'"):
        LocalSearch(cnf, "gsat")
    with pytest.raises(SatError, match="noise"):
        LocalSearch(cnf, "walksat", noise=1.5)
    with pytest.raises(SatError, match="cb > 0"):
        LocalSearch(cnf, "probsat", cb=-1.0)


# order statistics against closed forms


def test_expected_min_closed_forms():
    fits = fit_laws([1.0, 2.0, 4.0, 8.0, 3.0])
    exp, shifted, logn = fits["exponential"], fits["shifted_exponential"], fits["lognormal"]
    mean = 18.0 / 5
    for n in (1, 2, 7, 384):
        assert expected_min(exp, n) == pytest.approx(mean / n, rel=1e-12)  # n-fold speedup
        assert expected_min(shifted, n) == pytest.approx(1.0 + (mean - 1.0) / n, rel=1e-12)
    mu, s = logn.params["mu"], logn.params["sigma"]
    assert expected_min(logn, 1) == pytest.approx(math.exp(mu + s * s / 2), rel=1e-8)
    two = 2 * math.exp(mu + s * s / 2) * stats.norm.cdf(-s / math.sqrt(2))
    assert expected_min(logn, 2) == pytest.approx(two, rel=1e-8)


def test_expected_min_lognormal_matches_monte_carlo_at_many_cores():
    fits = fit_laws(np.random.default_rng(0).lognormal(3.0, 1.2, 5000))
    law = fits["lognormal"].params
    draws = np.random.default_rng(1).lognormal(law["mu"], law["sigma"], (20000, 64))
    assert expected_min(fits["lognormal"], 64) == pytest.approx(draws.min(axis=1).mean(), rel=0.02)


def test_empirical_expected_min_is_exact():
    import itertools

    sample = [5.0, 1.0, 3.0, 3.0, 10.0]
    for n in (1, 2, 3):
        brute = np.mean([min(t) for t in itertools.product(sample, repeat=n)])
        assert expected_min_empirical(sample, n) == pytest.approx(brute, rel=1e-12)


def test_fits_recover_parameters_and_tell_laws_apart():
    rng = np.random.default_rng(2)
    x = 100.0 + rng.exponential(50.0, 20000)
    fits = fit_laws(x)
    assert fits["shifted_exponential"].params["rate"] == pytest.approx(1 / 50, rel=0.03)
    assert fits["shifted_exponential"].params["shift"] == pytest.approx(100.0, abs=0.1)
    assert fits["shifted_exponential"].ks_pvalue > 0.01 > fits["exponential"].ks_pvalue
    table = speedup_table(x, [1, 4, 1000])
    bound = 150.0 / 100.0  # shifted exponential: speedup below (x0 + 1/l) / x0
    assert table[0]["shifted_exponential_speedup"] == pytest.approx(1.0)
    assert 1.0 < table[2]["shifted_exponential_speedup"] < bound * 1.01
    assert table[1]["exponential_speedup"] == pytest.approx(4.0)
    with pytest.raises(SatError, match="at least 3 positive"):
        fit_laws([1.0, -2.0, 3.0])


# command line


def test_solve_prints_a_verified_model_and_exit_10(tmp_path, capsys):
    path = tmp_path / "p.cnf"
    assert main(["sat", "generate", str(path), "-n", "300", "--planted", "--seed", "4"]) == 0
    capsys.readouterr()
    assert main(["sat", "solve", str(path), "--algorithm", "walksat"]) == 10
    out = capsys.readouterr().out.splitlines()
    assert "s SATISFIABLE" in out and out[-1] == "v 0"
    lits = [int(t) for line in out if line.startswith("v ") for t in line[2:].split()]
    model = np.zeros(300, bool)
    for lit in lits[:-1]:
        model[abs(lit) - 1] = lit > 0
    assert sorted(abs(lit) for lit in lits[:-1]) == list(range(1, 301))
    assert _referee_accepts(read_dimacs(path), model)


def test_unsatisfiable_runs_to_the_timeout_and_reports_unknown(tmp_path, capsys):
    path = tmp_path / "u.cnf"
    write_dimacs(CNF.from_clauses(2, [[1, 2], [-1, 2], [1, -2], [-1, -2]]), path)
    assert main(["sat", "solve", str(path), "--timeout", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "s UNKNOWN" in out and "v " not in out


@pytest.mark.slow
def test_killed_long_run_resumes_to_the_same_model(tmp_path):
    from launching import clean_env, launch

    path = tmp_path / "big.cnf"
    cnf, _ = random_ksat(3000, 12600, 3, seed=8, planted=True)
    write_dimacs(cnf, path)
    probe = LocalSearch(cnf, "probsat", seed=1)
    assert probe.run(10**7) and probe.flips > 6000  # long enough for two checkpoints

    def solve(tag, env=None):
        args = [
            "-m",
            "hpcpar",
            "sat",
            "solve",
            str(path),
            "--seed",
            "1",
            "--checkpoint",
            str(tmp_path / tag),
            "--checkpoint-every",
            "2000",
        ]
        return launch(1, sys.executable, *args, env=env)

    plain = solve("plain")
    assert plain.returncode == 10, plain.stderr
    fault = clean_env(HPCPAR_CHECKPOINT_FAULT="kill=after-commit,step=4000,rank=0")
    crashed = solve("ck", env=fault)
    assert crashed.returncode not in (0, 10)
    again = solve("ck")
    assert again.returncode == 10, again.stderr
    assert "c resumed at flip 4000" in again.stdout

    def answer(out):
        return [line for line in out.splitlines() if line.startswith(("v ", "s "))]

    assert answer(again.stdout) == answer(plain.stdout)
    assert f"c {probe.flips} flips" in again.stdout


def test_predict_prints_fits_and_speedups(tmp_path, capsys):
    path = tmp_path / "p.cnf"
    write_dimacs(random_ksat(150, 600, 3, seed=2, planted=True)[0], path)
    out = tmp_path / "pred.json"
    args = ["sat", "predict", str(path), "--trials", "30", "--cores", "1,2,64"]
    assert main([*args, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fit exponential" in text and "fit lognormal" in text
    import json

    doc = json.loads(out.read_text())["results"]
    assert len(doc["runtimes_flips"]) == 30
    first = doc["table"][0]
    assert first["cores"] == 1 and first["exponential_speedup"] == pytest.approx(1.0)
    assert doc["table"][2]["exponential_speedup"] == pytest.approx(64.0)
