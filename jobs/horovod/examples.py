"""Run Horovod's own PyTorch examples on hpcpar with only their import lines changed.

    python jobs/horovod/examples.py HOROVOD [-n 2] [--keep DIR]

``HOROVOD`` is a checkout of https://github.com/horovod/horovod (or its bare git
directory: the files are read from ``HEAD``); nothing of it is kept in this
repository. ``examples/pytorch/pytorch_synthetic_benchmark.py`` and
``examples/pytorch/pytorch_mnist.py`` are copied to a scratch folder with
``import horovod.torch as hvd`` changed to ``import hpcpar.horovod.torch as hvd`` (and
the MNIST example's ``import horovod``, used only for ``horovod.run``, to
``import hpcpar.horovod as horovod``), then run under ``hpcpar launch -n N`` with the
Python running this script, which needs torchvision and filelock beside hpcpar. The
MNIST example reads MNIST-shaped files generated here (random digits in MNIST's idx
format, 1,024 training and 512 test images), so nothing is downloaded. Prints each
example's result lines; exits 1 if one fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

EXAMPLES = {
    "pytorch_synthetic_benchmark.py": [
        "--no-cuda",
        "--model",
        "resnet18",
        "--batch-size",
        "8",
        "--num-warmup-batches",
        "1",
        "--num-batches-per-iter",
        "2",
        "--num-iters",
        "2",
    ],
    "pytorch_mnist.py": ["--no-cuda", "--epochs", "1", "--batch-size", "64"],
}
CHANGED = {
    "import horovod.torch as hvd\n": "import hpcpar.horovod.torch as hvd\n",
    "import horovod\n": "import hpcpar.horovod as horovod\n",
}
EXPECTED = {
    "pytorch_synthetic_benchmark.py": "Total img/sec on",
    "pytorch_mnist.py": "Test set: Average loss",
}


def read_example(horovod: Path, name: str) -> str:
    """The example's text from a checkout or a bare git directory."""
    path = horovod / "examples" / "pytorch" / name
    if path.exists():
        return path.read_text()
    return subprocess.run(
        ["git", f"--git-dir={horovod}", "show", f"HEAD:examples/pytorch/{name}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def commit_of(horovod: Path) -> str:
    """The commit the examples come from."""
    if (horovod / ".git").exists():
        argv = ["git", "-C", str(horovod), "rev-parse", "HEAD"]
    else:
        argv = ["git", f"--git-dir={horovod}", "rev-parse", "HEAD"]
    return (
        subprocess.run(argv, check=False, capture_output=True, text=True).stdout.strip()
        or "unknown"
    )


def changed(text: str) -> str:
    """``text`` with the import lines changed, and nothing else."""
    out = text
    for old, new in CHANGED.items():
        out = out.replace(old, new)
    if "import hpcpar.horovod.torch as hvd" not in out:
        raise SystemExit("the example does not import horovod.torch as hvd")
    return out


def write_mnist(root: Path, train: int = 1024, test: int = 512) -> None:
    """MNIST-shaped idx files (random digits) where torchvision's MNIST looks for them."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):  # a bright bar per digit, so there is signal
            images[i, 4 + 2 * label : 6 + 2 * label, 4:24] = 255
        header = np.array([0x0803, n, 28, 28], dtype=">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        header = np.array([0x0801, n], dtype=">i4").tobytes()
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(header + labels.tobytes())


def main() -> None:
    """Parse the options and run both examples."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("horovod", type=Path, help="a Horovod checkout or bare git directory")
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--keep", type=Path, default=None, help="scratch folder to keep")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="hpcpar-horovod-examples-"))
    work.mkdir(parents=True, exist_ok=True)
    write_mnist(work / "data")
    print(f"# Horovod examples at {commit_of(args.horovod)}, {args.n} ranks, in {work}")
    failed = 0
    for name, options in EXAMPLES.items():
        script = work / name
        original = read_example(args.horovod, name)
        script.write_text(changed(original))
        differ = [
            (a, b)
            for a, b in zip(original.splitlines(), script.read_text().splitlines(), strict=True)
            if a != b
        ]
        extra = ["--data-dir", str(work / "data")] if "mnist" in name else []
        command = [sys.executable, "-m", "hpcpar", "launch", "-n", str(args.n), "--timeout", "900"]
        command += ["--", sys.executable, str(script), *options, *extra]
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, cwd=work, timeout=1000
        )
        ok = done.returncode == 0 and EXPECTED[name] in done.stdout
        failed += not ok
        print(f"## {name}: {'ok' if ok else 'FAILED'} (exit {done.returncode})")
        for a, b in differ:
            print(f"#   changed: {a!r} -> {b!r}")
        lines = [x for x in done.stdout.splitlines() if x.strip()]
        for line in lines[-6:] if ok else (lines[-20:] + done.stderr.splitlines()[-20:]):
            print(f"    {line}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
