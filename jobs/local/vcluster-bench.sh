#!/usr/bin/env bash
# The virtual-cluster figures of BENCHMARKS.md: N virtual nodes x K ranks, 1 Gbit links,
# calibrate on them, then every allreduce algorithm and auto vs the MPI library, with the
# cost model's prediction beside each measurement. Needs root (network namespaces, tc).
# Usage: jobs/local/vcluster-bench.sh [LINK] [DISTRIBUTION] [SHAPE]
#   LINK: default 20us,1gbit; DISTRIBUTION: block (default) or cyclic rank placement;
#   SHAPE: NODESxRANKS, default 2x2. Files: results/vc-SHAPE-DISTRIBUTION.*; the table:
#   python jobs/local/vcluster_table.py results/vc-3x2-block.json \
#       results/vc-3x2-block-profile.json block 3x2
set -euo pipefail
link=${1:-20us,1gbit}
distribution=${2:-block}
shape=${3:-2x2}
out="results/vc-$shape-$distribution"
mkdir -p results
hpcpar bench collectives --vcluster "$shape" --link "$link" --distribution "$distribution" \
  --no-gloo --max-size 16MiB --output "$out" | tee "$out.txt"
