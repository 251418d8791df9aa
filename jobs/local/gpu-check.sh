#!/usr/bin/env bash
# The GPU checks, as one command for a device machine with an NVIDIA GPU and no network.
#
#   jobs/local/gpu-check.sh wheels   # here (with network): the wheels the GPU machine lacks
#   jobs/local/gpu-check.sh run      # there, from the repository root, with .wheels/ carried
#
# 'wheels' downloads what the GPU machine's image lacks (its package list: the device
# notes' KINDS.md) for its python3 (3.12, x86-64 Linux; PYVER overrides) into .wheels/
# (git ignores it; about 15 MB): mpich (the MPI library), mpi4py built for it, crc32c and
# pytest-mpi; no dependencies (numpy, numba, scipy, h5py, cupy, pytest, hypothesis and
# setuptools are in the image). 'run' installs them and hpcpar itself (a wheel built by
# the image's setuptools) with pip --prefix into /tmp/hpcpar-prefix, its site-packages
# first on PYTHONPATH and its lib/ (libmpi) on LD_LIBRARY_PATH (no venv: the image's
# python3 is itself a venv, whose packages a venv made from it would not see; not
# --target, which drops the mpich wheel's lib/ and bin/), then runs the GPU tests serially and at 2 ranks, and 'bench datatypes
# --gpu', writing logs and the benchmark's JSON to $OUT (default /tmp/gpu-out). Python
# runs with -P, so that the source tree in the working directory does not shadow the
# installed hpcpar (whose hpcpar.checkpoint and hpcpar.apps are mapped from the
# top-level folders). Each step's status is in $OUT/summary.txt; the script goes on
# after a failing step and exits 1 if any failed.
#
# Without a GPU (or without cupy) the GPU steps skip or fail and say so in the summary.
set -uo pipefail

mode=${1:-}
cd "$(dirname "$0")/../.."

if [[ $mode == wheels ]]; then
  pip=${PIP:-pip3}
  "$pip" download mpich mpi4py crc32c pytest-mpi --no-deps --only-binary=:all: \
    --python-version "${PYVER:-3.12}" --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .wheels -q
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

prefix=/tmp/hpcpar-prefix  # pip --prefix: the mpich wheel's lib/ and bin/ land there too
pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
export MPIR_CVAR_CH4_PROGRESS_THROTTLE=true MPIR_CVAR_POLLS_BEFORE_YIELD=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$prefix/lib/python$pyver/site-packages" PATH="$prefix/bin:$PATH"
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libmpi
step setup bash -c "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --prefix $prefix .wheels/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --no-cache-dir --upgrade --prefix $prefix ."
step gpu-info python3 -P -c "import cupy, mpi4py.MPI as M, hpcpar
from hpcpar.datatypes.gpu import gpu_available
print(hpcpar.__file__, cupy.__version__, cupy.cuda.runtime.getDeviceProperties(0)['name'])
print(M.Get_library_version())
assert gpu_available()"
# -rs: a skip names its reason; none of these tests may skip on a GPU machine
step tests-serial python3 -P -m pytest --with-mpi -q -rs -p no:cacheprovider \
  tests/hpcpar/test_datatypes_choose.py tests/checkpoint/test_gpu.py tests/apps/test_cfr_gpu.py \
  -k "gpu or device"
step tests-2-ranks hpcpar launch -n 2 --timeout 300 -- python3 -P -m pytest --with-mpi \
  -m mpi -q -rs -p no:cacheprovider tests/hpcpar/test_p2p_halo.py \
  tests/hpcpar/test_collectives_large.py tests/apps/test_sgd_torch_gpu.py -k "gpu or cupy"
step bench hpcpar bench datatypes --gpu --no-roof --n 128 --output "$OUT/dt-gpu"
cat "$summary"
exit $failed
