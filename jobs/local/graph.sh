#!/usr/bin/env bash
# Graph500 BFS and SSSP on this machine, every partition, validated.
# Usage: jobs/local/graph.sh [RANKS] [SCALE] [LAYOUT]   (needs hpcpar installed)
set -euo pipefail
ranks=${1:-4}
scale=${2:-16}
layout=${3:-ppn:2}
for partition in 1d-vertex 1d-edge 2d hier; do
  hpcpar launch -n "$ranks" --layout "$layout" --timeout 900 -- \
    graph all --scale "$scale" --partition "$partition" --out "graph-$partition.json"
done
