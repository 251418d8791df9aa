#!/usr/bin/env bash
# The virtual-cluster figures of BENCHMARKS.md: 2 virtual nodes x 2 ranks, 1 Gbit links,
# calibrate on them, then every allreduce algorithm and auto vs the MPI library, with the
# cost model's prediction beside each measurement. Needs root (network namespaces, tc).
# Usage: jobs/local/vcluster-bench.sh [LINK] [DISTRIBUTION]
#   LINK: default 20us,1gbit; DISTRIBUTION: block (default) or cyclic rank placement
set -euo pipefail
link=${1:-20us,1gbit}
distribution=${2:-block}
mkdir -p results
hpcpar bench collectives --vcluster 2x2 --link "$link" --distribution "$distribution" \
  --no-gloo --max-size 16MiB --output "results/vc-$distribution" | tee "results/vc-$distribution.txt"
