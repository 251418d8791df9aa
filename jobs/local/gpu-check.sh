#!/usr/bin/env bash
# The GPU checks, as one command for a device machine with an NVIDIA GPU and no network.
#
#   jobs/local/gpu-check.sh wheels   # here (with network): the wheels the GPU machine lacks
#   jobs/local/gpu-check.sh run      # there, from the repository root, with .wheels/ carried
#
# 'wheels' downloads mpich, mpi4py and pytest-mpi for the GPU machine's python3 (3.12,
# x86-64 Linux; PYVER overrides) into .wheels/ (git ignores it; about 16 MB). 'run' makes
# a venv over that python3's own packages (cupy, numba, numpy, scipy, h5py, pytest are
# there), installs the wheels and hpcpar (editable, no dependencies), then runs the GPU
# tests serially and at 2 ranks, and 'bench datatypes --gpu', writing logs and the
# benchmark's JSON to $OUT (default /tmp/gpu-out). Each step's status is in
# $OUT/summary.txt; the script goes on after a failing step and exits 1 if any failed.
#
# Prepared in session 13 without a GPU (no device was lent): not yet run on one.
set -uo pipefail

mode=${1:-}
cd "$(dirname "$0")/../.."

if [[ $mode == wheels ]]; then
  pip=${PIP:-pip3}
  "$pip" download mpich mpi4py pytest-mpi --only-binary=:all: \
    --python-version "${PYVER:-3.12}" --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .wheels -q
  ls -l .wheels
  exit 0
fi
if [[ $mode != run ]]; then
  echo "usage: $0 wheels|run (see the top of this file)" >&2
  exit 2
fi

OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: > "$summary"
failed=0
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, record the status
  local name=$1
  shift
  local start=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$summary"
  [[ $rc == 0 ]] || failed=1
}

export MPIR_CVAR_CH4_PROGRESS_THROTTLE=true MPIR_CVAR_POLLS_BEFORE_YIELD=1 PYTHONUNBUFFERED=1
venv=/tmp/hpcpar-gpu-venv
export PATH="$venv/bin:$PATH"  # its python, hpcpar and the mpich wheel's mpiexec
step setup bash -c "python3 -m venv --system-site-packages $venv &&
  $venv/bin/pip install -q --no-index --find-links .wheels mpich mpi4py pytest-mpi &&
  $venv/bin/pip install -q --no-deps --no-build-isolation -e ."
step gpu-info "$venv/bin/python" -c "import cupy, mpi4py.MPI as M, hpcpar
from hpcpar.datatypes.gpu import gpu_available
print(cupy.__version__, cupy.cuda.runtime.getDeviceProperties(0)['name'], M.Get_library_version())
assert gpu_available()"
# -rs: a skip names its reason; none of these tests may skip on a GPU machine
step tests-serial "$venv/bin/python" -m pytest --with-mpi -q -rs -p no:cacheprovider \
  tests/hpcpar/test_datatypes.py tests/checkpoint/test_gpu.py tests/apps/test_cfr_gpu.py \
  -k "gpu or device"
step tests-2-ranks "$venv/bin/hpcpar" launch -n 2 --timeout 300 -- python -m pytest --with-mpi \
  -m mpi -q -rs -p no:cacheprovider tests/hpcpar/test_p2p_halo.py \
  tests/hpcpar/test_collectives_large.py -k "gpu or cupy"
step bench "$venv/bin/hpcpar" bench datatypes --gpu --no-roof --n 128 --output "$OUT/dt-gpu"
cat "$summary"
exit $failed
