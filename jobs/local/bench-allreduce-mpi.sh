#!/usr/bin/env bash
# The BENCHMARKS.md figures for allreduce-mpi: 2 and 4 ranks, 8 B - 64 MiB, results in results/.
# Usage: jobs/local/bench-allreduce-mpi.sh [extra 'hpcpar bench allreduce-mpi' options]
set -euo pipefail
mkdir -p results
for ranks in 2 4; do
  hpcpar launch -n "$ranks" --timeout 1800 -- bench allreduce-mpi \
    --output "results/allreduce-mpi-${ranks}" "$@" | tee "results/allreduce-mpi-${ranks}.txt"
done
