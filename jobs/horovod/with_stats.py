"""Run a Horovod script, then print what its ``DistributedOptimizer`` communicated.

    python jobs/horovod/with_stats.py SCRIPT [ARGS...]

The script runs as ``__main__``, unchanged; afterwards rank 0 prints one line per
``hvd.DistributedOptimizer`` it made: ``# gradients: steps S, reduce R s, exposed
E s, hidden H s`` (``optimizer.communication``), and the bucket plan.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    """Run the script, then report."""
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    from hpcpar.horovod import basics

    if not basics.is_initialized() or basics.rank() != 0:
        return
    for ref in basics.state().optimizers:
        optimizer = ref()
        if optimizer is None:
            continue
        c = optimizer.communication
        print(
            f"# gradients: steps {c['steps']}, reduce {c['reduce_s']:.3f} s, exposed "
            f"{c['exposed_s']:.3f} s, hidden {c['hidden_s']:.3f} s; {optimizer.bucket_plan}",
            flush=True,
        )


if __name__ == "__main__":
    main()
