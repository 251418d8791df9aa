"""CFR against OpenSpiel: exact NashConv per iteration, trees, variants, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hpcpar.apps.cfr import CfrError, Solver, build_tree, load_tree

pyspiel = pytest.importorskip("pyspiel", reason="the reference is OpenSpiel (open_spiel)")
from open_spiel.python import policy as os_policy  # noqa: E402
from open_spiel.python.algorithms import cfr as os_cfr  # noqa: E402
from open_spiel.python.algorithms import discounted_cfr, exploitability  # noqa: E402

GAMES = ["kuhn_poker", "leduc_poker"]
_trees: dict[str, object] = {}


def tree_of(game):
    if game not in _trees:
        _trees[game] = build_tree(game)
    return _trees[game]


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize(
    ("algorithm", "reference"), [("cfr", "CFRSolver"), ("cfr+", "CFRPlusSolver")]
)
def test_nash_conv_equals_openspiel_cpp(game, algorithm, reference):
    ref = getattr(pyspiel, reference)(pyspiel.load_game(game))
    solver = Solver(tree_of(game), algorithm)
    for _ in range(5):
        solver.iterate()
        ref.evaluate_and_update_policy()
        expect = exploitability.nash_conv(pyspiel.load_game(game), ref.average_policy())
        assert abs(solver.nash_conv() - expect) < 1e-12


def test_first_iterate_nash_conv_matches_openspiels_own_tests():
    for game, expect in (("kuhn_poker", 0.916667), ("leduc_poker", 4.747222)):
        solver = Solver(tree_of(game), "cfr")
        solver.iterate()
        assert solver.nash_conv() == pytest.approx(expect, abs=1e-6)


def test_kuhn_value_after_300_iterations():
    solver = Solver(tree_of("kuhn_poker"), "cfr")
    solver.iterate(300)
    assert abs(solver.game_value() - (-1 / 18)) < 1e-3


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("algorithm", ["lcfr", "dcfr"])
def test_discounted_variants_equal_openspiel_python(game, algorithm):
    g = pyspiel.load_game(game)
    ref = discounted_cfr.LCFRSolver(g) if algorithm == "lcfr" else discounted_cfr.DCFRSolver(g)
    solver = Solver(tree_of(game), algorithm)
    for _ in range(10 if game == "kuhn_poker" else 4):
        solver.iterate()
        ref.evaluate_and_update_policy()
        expect = exploitability.nash_conv(g, ref.average_policy())
        assert abs(solver.nash_conv() - expect) < 1e-9


def test_simultaneous_cfr_equals_openspiel_python():
    g = pyspiel.load_game("kuhn_poker")
    ref = os_cfr._CFRSolver(  # OpenSpiel's simultaneous-update solver
        g, regret_matching_plus=False, alternating_updates=False, linear_averaging=False
    )
    solver = Solver(tree_of("kuhn_poker"), "cfr", alternating=False)
    for _ in range(8):
        solver.iterate()
        ref.evaluate_and_update_policy()
        assert abs(solver.nash_conv() - exploitability.nash_conv(g, ref.average_policy())) < 1e-12


@pytest.mark.parametrize("algorithm", ["pcfr+", "dcfr", "cfr+"])
def test_exported_policy_is_what_openspiel_evaluates(algorithm):
    """Our NashConv of the average policy equals OpenSpiel's of the exported policy."""
    game = pyspiel.load_game("leduc_poker")
    tree = build_tree("leduc_poker", source="openspiel")  # infosets keyed as OpenSpiel does
    solver = Solver(tree, algorithm)
    solver.iterate(30)
    table = os_policy.TabularPolicy(game)
    for player in solver.average_policy():
        for key, probs in player.items():
            row = table.policy_for_key(key)
            row[:] = 0
            for action, p in probs.items():
                row[action] = p
    assert abs(solver.nash_conv() - exploitability.nash_conv(game, table)) < 1e-12


def test_variants_converge_in_the_published_order_on_leduc():
    # on poker, DCFR leads and CFR+ beats CFR (Brown & Sandholm 2019); PCFR+ beats CFR
    # but not DCFR on poker games (Farina, Kroer & Sandholm 2021)
    gaps = {}
    for algorithm in ("cfr", "cfr+", "dcfr", "pcfr+"):
        solver = Solver(tree_of("leduc_poker"), algorithm)
        solver.iterate(500)
        gaps[algorithm] = solver.exploitability()
    assert gaps["dcfr"] < 1e-3 and gaps["pcfr+"] < 3e-3
    assert gaps["dcfr"] < gaps["cfr+"] < gaps["cfr"] and gaps["pcfr+"] < gaps["cfr"] / 10


@pytest.mark.parametrize("game", GAMES)
def test_builtin_and_openspiel_trees_are_identical(game):
    assert tree_of(game).same_as(build_tree(game, source="openspiel"))


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
def test_tree_files_round_trip_and_refuse_corruption(tmp_path, suffix):
    tree = tree_of("leduc_poker")
    path = tmp_path / f"leduc{suffix}"
    tree.save(path)
    back = load_tree(path)
    assert back.same_as(tree) and list(back.players[0].keys) == list(tree.players[0].keys)
    a, b = Solver(tree, "dcfr"), Solver(back, "dcfr")
    a.iterate(3)
    b.iterate(3)
    assert a.nash_conv() == b.nash_conv()
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CfrError, match="not a readable tree file"):
        load_tree(bad)
    arrays = tree.arrays()
    arrays["rows"] = arrays["rows"] + 10**6  # indices out of range
    np.savez(tmp_path / "oob.npz", **arrays)
    with pytest.raises(CfrError, match="out of range"):
        load_tree(tmp_path / "oob.npz")
    del arrays["p1_first"]
    np.savez(tmp_path / "missing.npz", **arrays)
    with pytest.raises(CfrError, match="missing"):
        load_tree(tmp_path / "missing.npz")


def test_bad_input():
    with pytest.raises(CfrError, match="unknown game 'nosuch'"):
        build_tree("nosuch")
    with pytest.raises(CfrError, match="3 players"):
        build_tree("kuhn_poker(players=3)")
    with pytest.raises(CfrError, match="not a two-player zero-sum"):
        build_tree("matrix_pd")
    with pytest.raises(CfrError, match="no built-in game"):
        build_tree("liars_dice", source="builtin")
    tree = tree_of("kuhn_poker")
    with pytest.raises(CfrError, match="unknown algorithm"):
        Solver(tree, "cfr++")
    with pytest.raises(CfrError, match="simultaneous updates"):
        Solver(tree, "dcfr", alternating=False)
    with pytest.raises(CfrError, match="alpha must be a finite number"):
        Solver(tree, "dcfr", alpha=float("nan"))
    with pytest.raises(CfrError, match="device"):
        Solver(tree, "cfr", device="tpu")


def test_cli_checkpoint_resume_is_bit_identical(tmp_path, capsys):
    from hpcpar.cli.main import main

    def run(*extra):
        args = ["cfr", "--game", "kuhn_poker", "--algorithm", "pcfr+", "--eval-every", "5"]
        assert main([*args, *extra]) == 0

    run("--iterations", "20", "--policy", str(tmp_path / "straight.json"))
    ck = ["--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "5"]
    run("--iterations", "10", *ck)
    run(
        "--iterations",
        "20",
        *ck,
        "--policy",
        str(tmp_path / "resumed.json"),
        "--out",
        str(tmp_path / "r.json"),
    )
    out = capsys.readouterr().out
    assert "# resumed at iteration 10" in out
    assert json.loads((tmp_path / "straight.json").read_text()) == json.loads(
        (tmp_path / "resumed.json").read_text()
    )
    doc = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["iteration"] for r in doc["curve"]] == [15, 20]
    assert (tmp_path / "r.csv").read_text().startswith("iteration,seconds,exploitability")


@pytest.mark.slow
@pytest.mark.reliability("fault")
def test_cli_run_killed_at_two_ranks_resumes_on_one_or_three_to_the_same_policy(tmp_path):
    """The solver's checkpoint is Sharded blocks of a rank-count-free order and its sums
    run in that order at any rank count: a run killed at 2 ranks and resumed on 1 or 3
    ends with the uninterrupted run's policy, bit for bit."""
    import sys

    from launching import launch, resumed_after_one_kill

    def solve(ranks, policy, *extra, env=None):
        game = ["--game", "leduc_poker", "--algorithm", "dcfr", "--iterations", "30"]
        args = ["-m", "hpcpar", "cfr", *game, "--eval-every", "10", "--policy", str(policy)]
        args += extra
        return launch(ranks, sys.executable, *args, layout="ppn:1", env=env)

    plain = solve(2, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    runs = resumed_after_one_kill(solve, tmp_path, (1, 3), every=10, step=20)
    for ranks, again in zip((1, 3), runs, strict=True):
        assert "# resumed at iteration 20" in again.stdout, again.stdout
        assert (tmp_path / "plain.json").read_text() == (
            tmp_path / f"resumed{ranks}.json"
        ).read_text(), ranks


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("game", "message"),
    [
        ("liars_dice(numdice=-1)", "cannot be made"),
        ("liars_dice(numdice=100000)", "5000 moves"),
        ("liars_dice(numdice=1))", "balanced"),
        ("liars_dice(numdice=1", "balanced"),
        ("liars dice", "bad game string"),
    ],
)
def test_bad_game_strings_are_one_line_errors_at_once(game, message, capsys):
    """Each is refused before any tree is built: one line, exit status 2."""
    pytest.importorskip("pyspiel")
    from hpcpar.cli.main import main

    assert main(["cfr", "--game", game, "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
