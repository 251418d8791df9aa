#!/usr/bin/env bash
# The main job on this machine: hpcpar demo on 4 ranks over two virtual nodes.
# Usage: jobs/local/demo.sh [RANKS] [LAYOUT]   (needs hpcpar installed: python3 dev.py demo does it)
set -euo pipefail
ranks=${1:-4}
layout=${2:-ppn:2}
exec hpcpar launch -n "$ranks" --layout "$layout" --timeout 600 -- demo
