"""Resuming from a checkpoint of another app, model or dataset is a one-line error."""

from __future__ import annotations

import pytest

from hpcpar.cli.main import main


@pytest.fixture
def sgd_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    argv = [
        "sgd",
        "--dataset",
        "wine",
        "--model",
        "mlp",
        "--hidden",
        "8",
        "--epochs",
        "1",
        "--batch",
        "16",
        "--checkpoint",
        str(ck),
        "--checkpoint-every",
        "2",
    ]
    assert main(argv) == 0
    return ck


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "sgd",
                "--dataset",
                "wine",
                "--model",
                "mlp",
                "--hidden",
                "9",
                "--epochs",
                "1",
                "--batch",
                "16",
                "--checkpoint-every",
                "2",
            ],
            "holds a checkpoint of mlp (1",
        ),
        (
            [
                "sgd",
                "--dataset",
                "digits",
                "--model",
                "mlp",
                "--hidden",
                "8",
                "--epochs",
                "1",
                "--checkpoint-every",
                "2",
            ],
            "on wine; this run trains mlp",
        ),
        (
            ["cfr", "--game", "kuhn_poker", "--iterations", "10", "--checkpoint-every", "5"],
            "checkpoint is of another app, not of cfr",
        ),
    ],
)
def test_another_runs_checkpoint_is_refused(sgd_checkpoint, capsys, argv, message):
    capsys.readouterr()
    assert main([*argv, "--checkpoint", str(sgd_checkpoint)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_sat_refuses_another_apps_checkpoint(sgd_checkpoint, tmp_path, capsys):
    cnf = tmp_path / "f.cnf"
    assert main(["sat", "generate", str(cnf), "-n", "50", "--ratio", "3", "--planted"]) == 0
    capsys.readouterr()
    assert main(["sat", "solve", str(cnf), "--checkpoint", str(sgd_checkpoint)]) == 2
    assert "checkpoint of another app, not of sat" in capsys.readouterr().err


def test_sat_predict_honours_its_timeout(tmp_path, capsys):
    cnf = tmp_path / "hard.cnf"  # ratio 6: almost surely unsatisfiable, no run ends
    assert main(["sat", "generate", str(cnf), "-n", "300", "--ratio", "6", "--seed", "2"]) == 0
    capsys.readouterr()
    status = main(  # on an unsatisfiable instance no trial ends: only the time-out ends it
        [
            "sat",
            "predict",
            str(cnf),
            "--trials",
            "3",
            "--timeout",
            "0.3",
            "--measure",
            "0",
            "--cores",
            "1,2",
        ]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert "0 of 3 trials solved" in err and "--timeout" in err


def test_building_a_large_game_reports_progress(capsys, monkeypatch):
    from hpcpar.apps.cfr import tree

    monkeypatch.setattr(tree, "PROGRESS_NODES", 64)
    seen = []
    built = tree.build_tree("leduc_poker", "builtin", seen.append)
    assert seen and seen[0] == 64 and seen[-1] <= built.n_nodes
