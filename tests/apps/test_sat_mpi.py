"""The SAT portfolio at 1-4 ranks: one verified model, every rank stops, UNKNOWN on timeout."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hpcpar.apps.sat import CNF, check_model, random_ksat, write_dimacs
from hpcpar.apps.sat.portfolio import portfolio, rank_plan

import hpcpar
from hpcpar.cli.main import main
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi


def _same_everywhere(comm, value, what):
    values = comm.allgather(value)
    assert_all(all(v == values[0] for v in values), f"{what} differs between ranks", comm)


@pytest.mark.parametrize("algorithms", [["probsat"], ["probsat", "walksat", "cc"]])
def test_portfolio_reports_one_verified_model(comm, algorithms):
    cnf, _ = random_ksat(800, 3360, 3, seed=21, planted=True)
    result = portfolio(cnf, comm, algorithms=algorithms, seed=5, check_every=2000)
    assert_all(result.satisfiable, "no model", comm)
    assert_all(check_model(cnf, result.model) == -1, "model falsifies a clause", comm)
    _same_everywhere(comm, result.model.tobytes(), "the model")
    _same_everywhere(comm, result.winner, "the winner")
    ranks = result.per_rank
    assert [d["rank"] for d in ranks] == list(range(comm.Get_size()))
    # every rank either found a model or was told to stop: nobody ran on to its limit
    assert all(d["found"] or d["stopped"] for d in ranks)
    assert ranks[result.winner]["found"] and result.flips == ranks[result.winner]["flips"]
    assert {d["algorithm"] for d in ranks} <= set(algorithms)


def test_unsatisfiable_portfolio_stops_at_its_limit_with_unknown(comm):
    cnf = CNF.from_clauses(2, [[1, 2], [-1, 2], [1, -2], [-1, -2]])
    result = portfolio(cnf, comm, max_flips=30000, check_every=7000)
    assert_all(not result.satisfiable and result.winner == -1, "a model of UNSAT", comm)
    assert all(d["flips"] == 30000 and not d["found"] for d in result.per_rank)
    timed = portfolio(cnf, comm, timeout=0.2, check_every=5000)
    assert_all(not timed.satisfiable, "a model of UNSAT", comm)


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:3])
def test_hierarchical_portfolio_gives_each_node_one_algorithm(comm, layout):
    algorithms = ["probsat", "walksat", "cc"]
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        cnf, _ = random_ksat(300, 1200, 3, seed=3, planted=True)
        result = portfolio(cnf, comm, algorithms=algorithms, node=h.node_index, seed=1)
        assert_all(check_model(cnf, result.model) == -1, "model falsifies a clause", comm)
        nodes = comm.allgather(h.node_index)
    for d in result.per_rank:
        expect, seed = rank_plan(d["rank"], algorithms, 1, nodes[d["rank"]])
        assert d["algorithm"] == expect == algorithms[nodes[d["rank"]] % 3]
        assert d["seed"] == seed == 1 + d["rank"]


def test_cli_solve_exits_10_on_every_rank_and_prints_once(comm, tmp_path, capsys):
    path = comm.bcast(str(tmp_path / "p.cnf"), root=0)
    if comm.Get_rank() == 0:
        write_dimacs(random_ksat(400, 1680, 3, seed=6, planted=True)[0], path)
    comm.Barrier()
    status = main(["sat", "solve", path, "--portfolio", "--seed", "3"])
    assert_all(status == 10, f"exit status {status}", comm)
    out = capsys.readouterr().out
    lines = out.count("s SATISFIABLE")
    assert_all(lines == (1 if comm.Get_rank() == 0 else 0), "model printed once", comm)


def test_predict_measures_portfolios_where_the_ranks_exist(comm, tmp_path, capsys):
    size = comm.Get_size()
    path = comm.bcast(str(tmp_path / "p.cnf"), root=0)
    out = comm.bcast(str(tmp_path / "pred.json"), root=0)
    if comm.Get_rank() == 0:
        write_dimacs(random_ksat(120, 500, 3, seed=2, planted=True)[0], path)
    comm.Barrier()
    args = ["sat", "predict", path, "--trials", "24", "--cores", "1,2,4,8", "--measure", "6"]
    assert_all(main([*args, "--out", out]) == 0, "predict failed", comm)
    if comm.Get_rank() == 0:
        table = json.loads(open(out).read())["results"]["table"]
        measured = [r["cores"] for r in table if "measured_speedup" in r]
        assert measured == [c for c in (2, 4) if c <= size]
        for r in table:
            assert r["exponential_speedup"] == pytest.approx(r["cores"])
            if "measured_speedup" in r:
                assert r["measured_runs"] == 6 and np.isfinite(r["measured_speedup"])


def test_ranks_that_cannot_solve_are_stopped_by_the_winner(comm):
    # planted 5-SAT at ratio 18: cc solves it in about 10^4 flips, WalkSAT at noise
    # 0.567 stalls for millions; even ranks run cc, odd ranks WalkSAT
    cnf, _ = random_ksat(300, 5400, 5, seed=11, planted=True)
    limit = 10**9
    result = portfolio(
        cnf, comm, algorithms=["cc", "walksat"], seed=2, max_flips=limit, check_every=1000
    )
    assert_all(result.satisfiable, "no model", comm)
    assert result.per_rank[result.winner]["algorithm"] == "cc"
    for d in result.per_rank:
        if d["algorithm"] == "walksat" and not d["found"]:
            # stopped by the message, long before its own limit
            assert d["stopped"] and d["flips"] < limit // 100, d
    assert result.stop_lag_s >= 0
