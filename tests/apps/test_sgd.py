"""SGD app: gradients against finite differences, accuracy on digits, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hpcpar.apps.sgd import SgdError, SyncTrainer, load_dataset, make_model

pytest.importorskip("sklearn", reason="the bundled datasets come with scikit-learn")


@pytest.mark.parametrize("name", ["softmax", "mlp", "mlp2", "mlp4"])
@pytest.mark.parametrize("sparse", [False, True])
def test_gradient_matches_finite_differences(name, sparse):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 5))
    if sparse:
        from scipy import sparse as sp

        x[np.abs(x) < 0.7] = 0
        x = sp.csr_matrix(x)
    y = rng.integers(0, 3, 7)
    model = make_model(name, 5, 3, hidden=4, seed=2)
    grad = np.zeros(model.n_params)
    seen = []
    model.loss_and_grad(x, y, grad, 1.0, lambda a, b: seen.append((a, b)))
    assert seen[0][1] == model.n_params and seen[-1][0] == 0  # last layer first
    eps = 1e-6
    for i in range(model.n_params):
        model.params[i] += eps
        up = model.loss_and_grad(x, y, np.zeros(model.n_params), 1.0)
        model.params[i] -= 2 * eps
        down = model.loss_and_grad(x, y, np.zeros(model.n_params), 1.0)
        model.params[i] += eps
        assert abs((up - down) / (2 * eps) - grad[i]) < 1e-6 * max(1.0, abs(grad[i]))


@pytest.mark.parametrize("name", ["digits", "breast_cancer", "wine"])
def test_bundled_datasets_are_scikit_learns(name):
    """Read from scikit-learn's CSV files without importing it: its loaders' arrays."""
    from hpcpar.apps.sgd.data import _bundled
    from sklearn import datasets

    x, y = _bundled(name)
    bunch = getattr(datasets, f"load_{name}")()
    assert x.dtype == np.float64 and np.array_equal(x, bunch.data)
    assert np.array_equal(y, bunch.target)


def test_mlp_reaches_95_percent_on_digits():
    data = load_dataset("digits")
    model = make_model("mlp", data.n_features, data.n_classes, seed=1)
    trainer = SyncTrainer(model, data, batch=32, lr=0.1)
    for epoch in range(15):
        stats = trainer.epoch(epoch)
    assert stats.test_accuracy >= 0.95


def test_bad_input():
    data = load_dataset("wine")
    model = make_model("softmax", data.n_features, data.n_classes)
    with pytest.raises(SgdError, match="learning rate must be a positive"):
        SyncTrainer(model, data, lr=0)
    with pytest.raises(SgdError, match="batch 0 must be a positive multiple"):
        SyncTrainer(model, data, batch=0)
    with pytest.raises(SgdError, match="larger than the training set"):
        SyncTrainer(model, data, batch=10**6)
    with pytest.raises(SgdError, match="unknown dataset 'mnist'"):
        load_dataset("mnist")
    with pytest.raises(SgdError, match="unknown model 'cnn'"):
        make_model("cnn", 4, 2)


# (mode, checkpoint every K, killed after checkpoint step, where it resumes): sync counts
# steps; async and hogwild count epochs. Two ranks on two virtual nodes keep async (one
# worker) and hogwild (one rank per node) deterministic, so resuming must be bitwise.
RESUMES = [
    ("sync", "5", "15", "# resumed at step 15 (epoch 1, batch 7)"),
    ("async", "1", "2", "# resumed at step 2 (epoch 2, batch 0)"),
    ("hogwild", "1", "2", "# resumed at step 2 (epoch 2, batch 0)"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "every", "kill", "resumed"), RESUMES)
def test_killed_training_resumes_to_the_same_model(tmp_path, mode, every, kill, resumed):
    import sys

    from launching import clean_env, launch

    def train(out, *extra, env=None):
        args = ["-m", "hpcpar", "sgd", "--dataset", "wine", "--model", "mlp", "--hidden", "8"]
        args += ["--epochs", "4", "--batch", "16", "--lr", "0.05", "--mode", mode]
        args += ["--out", str(out), *extra]
        return launch(2, sys.executable, *args, layout="ppn:1", env=env)

    plain = train(tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    ck = ["--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", every]
    fault = clean_env(HPCPAR_CHECKPOINT_FAULT=f"kill=after-commit,step={kill},rank=1")
    crashed = train(tmp_path / "resumed.json", *ck, env=fault)
    assert crashed.returncode != 0 and not (tmp_path / "resumed.npy").exists()
    again = train(tmp_path / "resumed.json", *ck)
    assert again.returncode == 0, again.stderr
    assert resumed in again.stdout
    assert np.array_equal(np.load(tmp_path / "plain.npy"), np.load(tmp_path / "resumed.npy"))
    # the epochs finished before the kill come back from the checkpoint with the model
    import json

    epochs = json.loads((tmp_path / "resumed.json").read_text())["results"]["epochs"]
    plain_epochs = json.loads((tmp_path / "plain.json").read_text())["results"]["epochs"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    finished = int(resumed.split("(epoch ")[1].split(",")[0])
    for got, want in zip(epochs[:finished], plain_epochs, strict=False):
        assert got["loss"] == want["loss"] and got["test_accuracy"] == want["test_accuracy"]


def test_local_sgd_learns_and_bad_mode_is_refused():
    data = load_dataset("digits")
    model = make_model("mlp", data.n_features, data.n_classes, seed=1)
    trainer = SyncTrainer(model, data, batch=32, lr=0.1, mode="local", local_steps=4)
    for epoch in range(10):
        stats = trainer.epoch(epoch)
    assert stats.test_accuracy >= 0.95
    with pytest.raises(SgdError, match="unknown mode 'hogwild'"):
        SyncTrainer(model, data, mode="hogwild")


def test_user_data_files(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 3)), rng.integers(0, 2, 50)
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    data = load_dataset(str(tmp_path / "ok.npz"))
    assert data.n_features == 3 and data.y_train.size == 40 and data.n_classes == 2
    np.savez(tmp_path / "shape.npz", x=x, y=y[:-1])
    with pytest.raises(SgdError, match="one label per row"):
        load_dataset(str(tmp_path / "shape.npz"))
    bad = x.copy()
    bad[3, 1] = np.nan
    np.savez(tmp_path / "nan.npz", x=bad, y=y)
    with pytest.raises(SgdError, match="NaN"):
        load_dataset(str(tmp_path / "nan.npz"))
    np.savez(tmp_path / "noy.npz", x=x)
    with pytest.raises(SgdError, match="needs arrays 'x' and 'y'"):
        load_dataset(str(tmp_path / "noy.npz"))
    (tmp_path / "junk.npz").write_text("junk")
    with pytest.raises(SgdError, match="not a readable"):
        load_dataset(str(tmp_path / "junk.npz"))


@pytest.mark.slow
@pytest.mark.reliability("fault")
def test_training_killed_at_two_ranks_resumes_on_one_or_three_to_the_same_model(tmp_path):
    """Sync training saves its one model once (Replicated) and the global data position,
    so it resumes on another number of ranks; with --reproducible and --full-data (each
    global batch the same rows at any rank count) the model is bitwise the same at every
    rank count, so the resumed run's is the uninterrupted run's."""
    import sys

    from launching import launch, resumed_after_one_kill

    def train(ranks, out, *extra, env=None):
        args = [
            "-m",
            "hpcpar",
            "sgd",
            "--dataset",
            "wine",
            "--model",
            "mlp",
            "--hidden",
            "8",
            "--epochs",
            "3",
            "--batch",
            "24",
            "--lr",
            "0.05",
            "--reproducible",
            "--full-data",
            "--out",
            str(out),
            *extra,
        ]
        return launch(ranks, sys.executable, *args, layout="ppn:1", env=env)

    plain = train(2, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    runs = resumed_after_one_kill(train, tmp_path, (1, 3), every=4, step=8)
    for ranks, again in zip((1, 3), runs, strict=True):
        assert "# resumed at step 8" in again.stdout, again.stdout
        same = np.load(tmp_path / "plain.npy"), np.load(tmp_path / f"resumed{ranks}.npy")
        assert np.array_equal(*same), ranks
    # the other modes keep a model per rank: another rank count is refused by name
    ck = ["--checkpoint", str(tmp_path / "cka"), "--checkpoint-every", "1", "--mode", "async"]
    assert train(2, tmp_path / "a.json", *ck).returncode == 0
    again = train(3, tmp_path / "b.json", *ck, "--epochs", "4")
    assert again.returncode == 2 and "'params'" in again.stderr, again.stderr
    assert len(again.stderr.strip().splitlines()) <= 3, again.stderr


@pytest.mark.slow
@pytest.mark.reliability("fault")
def test_a_torch_model_killed_mid_run_resumes_to_the_same_model(tmp_path):
    """``--framework torch``: a run killed after a checkpoint resumes to the uninterrupted
    run's model bit for bit on the same ranks, and on another rank count to the same
    model within float32 reduction order (every global batch is the same rows there)."""
    import sys

    pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")
    from launching import launch, resumed_after_one_kill

    def train(ranks, out, *extra, env=None):
        args = [
            "-m",
            "hpcpar",
            "sgd",
            "--framework",
            "torch",
            "--dataset",
            "digits",
            "--model",
            "cnn",
            "--epochs",
            "2",
            "--batch",
            "96",
            "--lr",
            "0.05",
            "--momentum",
            "0.9",
            "--out",
            str(out),
            *extra,
        ]
        return launch(ranks, sys.executable, *args, layout="ppn:1", env=env)

    plain = train(2, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    assert "torch cnn" in plain.stdout and "epoch    2" in plain.stdout, plain.stdout
    expect = np.load(tmp_path / "plain.npy")
    runs = resumed_after_one_kill(train, tmp_path, (2, 3), every=4, step=8)
    for ranks, again in zip((2, 3), runs, strict=True):
        assert "# resumed at step 8" in again.stdout, again.stdout
        got = np.load(tmp_path / f"resumed{ranks}.npy")
        if ranks == 2:
            assert np.array_equal(got, expect)
        else:
            assert np.allclose(got, expect, rtol=1e-3, atol=1e-5), np.abs(got - expect).max()
        rows = json.loads((tmp_path / f"resumed{ranks}.json").read_text())["results"]["epochs"]
        assert [r["epoch"] for r in rows] == [1, 2]  # the first epoch's row came back too


@pytest.mark.slow
@pytest.mark.reliability("fault")
def test_a_zero_run_resumes_on_another_rank_count_with_its_optimizer_state_resharded(tmp_path):
    """``--zero`` keeps each rank's slice of the momentum buffers, saved as Sharded
    blocks: killed at 2 ranks, the run resumes at 3 with the slices resharded, to the
    model of an uninterrupted 3-rank run within float32 reduction order."""
    import sys

    pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")
    from launching import killed_and_resumed, launch

    def train(ranks, out, *extra, env=None):
        args = [
            "-m",
            "hpcpar",
            "sgd",
            "--framework",
            "torch",
            "--zero",
            "--dataset",
            "wine",
            "--model",
            "mlp",
            "--hidden",
            "16",
            "--epochs",
            "3",
            "--batch",
            "24",
            "--lr",
            "0.05",
            "--momentum",
            "0.9",
            "--out",
            str(out),
            *extra,
        ]
        return launch(ranks, sys.executable, *args, env=env)

    plain = train(3, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    again = killed_and_resumed(train, tmp_path, 3, every=3, step=6)
    assert "# resumed at step 6" in again.stdout, again.stdout
    got, expect = np.load(tmp_path / "resumed3.npy"), np.load(tmp_path / "plain.npy")
    assert np.allclose(got, expect, rtol=1e-4, atol=1e-6), np.abs(got - expect).max()


@pytest.mark.slow
@pytest.mark.reliability("fault")
def test_a_local_sgd_run_resumes_bit_for_bit_from_a_meeting_of_the_ranks(tmp_path):
    """Mode local saves when the ranks meet (each rank's inner momentum is its own);
    killed after such a save, it resumes on the same ranks to the same model."""
    import sys

    pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")
    from launching import killed_and_resumed, launch

    def train(ranks, out, *extra, env=None):
        args = [
            "-m",
            "hpcpar",
            "sgd",
            "--framework",
            "torch",
            "--mode",
            "local",
            "--local-steps",
            "2",
            "--outer-lr",
            "0.7",
            "--outer-momentum",
            "0.9",
            "--dataset",
            "wine",
            "--model",
            "mlp",
            "--hidden",
            "16",
            "--epochs",
            "3",
            "--batch",
            "24",
            "--lr",
            "0.05",
            "--momentum",
            "0.5",
            "--out",
            str(out),
            *extra,
        ]
        return launch(ranks, sys.executable, *args, env=env)

    plain = train(2, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    again = killed_and_resumed(train, tmp_path, 2, every=2, step=6)
    assert "# resumed at step 6" in again.stdout, again.stdout
    assert np.array_equal(np.load(tmp_path / "resumed2.npy"), np.load(tmp_path / "plain.npy"))


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "cnn", "--dataset", "breast_cancer"], "not a square"),
        (["--model", "resnet"], "unknown torch model 'resnet'"),
        (["--mode", "async"], "mode sync or local"),
        (["--mode", "local", "--zero"], "--zero shards the optimizer state of mode sync"),
        (["--zero", "--outer-lr", "0.7"], "--outer-lr set the outer steps of --framework torch"),
        (["--mode", "local", "--checkpoint", "ck", "--checkpoint-every", "3"], "multiple of"),
        (["--bucket-mib", "big"], "--bucket-mib: expected a number above 0"),
        (["--bucket-mib", "0"], "--bucket-mib: expected a number above 0"),
        (["--error-feedback"], "--error-feedback needs --compression"),
        (["--compression", "int8", "--zero"], "--compression codes the gradients"),
        (["--compression", "int8", "--mode", "local"], "--compression codes the gradients"),
        (["--compression", "powersgd", "--error-feedback"], "powersgd keeps its own"),
        (["--compression", "zip"], "invalid choice"),
    ],
)
def test_bad_torch_runs_are_one_line_errors(extra, message):
    pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")
    from launching import hpcpar

    done = hpcpar("sgd", "--framework", "torch", "--epochs", "1", *extra)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
