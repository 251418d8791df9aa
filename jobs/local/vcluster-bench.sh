#!/usr/bin/env bash
# The virtual-cluster figures of BENCHMARKS.md: 2 virtual nodes x 2 ranks, 1 Gbit links,
# calibrate on them, then every allreduce algorithm and auto vs the MPI library, with the
# cost model's prediction beside each measurement. Needs root (network namespaces, tc).
# Usage: jobs/local/vcluster-bench.sh [LINK]   (default 20us,1gbit)
set -euo pipefail
link=${1:-20us,1gbit}
mkdir -p results
hpcpar vcluster up --nodes 2 --link "$link"
trap 'hpcpar vcluster down' EXIT
hpcpar vcluster run --ppn 2 --timeout 600 -- calibrate --output results/vc-profile.json --repeats 5
HPCPAR_PROFILE=results/vc-profile.json hpcpar vcluster run --ppn 2 --timeout 3000 -- \
  bench collectives --no-gloo --max-size 16MiB --profile results/vc-profile.json \
  --output results/vc-collectives | tee results/vc-collectives.txt
