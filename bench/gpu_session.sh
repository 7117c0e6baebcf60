#!/usr/bin/env bash
# One call on a lent GPU machine: build rcoll there (its Python, its nvcc, only
# the GPU's own arch so the build is short), run the tests that need a GPU and
# the GPU benchmarks, and leave every log under $OUT (or ./gpu-out).
#
#   bash bench/gpu_session.sh [tests|bench|hosts|all|PART,PART...] [extra pytest args...]
#
# tests: the GPU tests; bench: the kernels and the world-2 allreduce (time-sliced
# and under MPS); hosts: under MPS, the world-2 allreduce and the allreduce on
# four ranks claiming two hosts (AABB: CUDA IPC inside each, staging between);
# threshold: the ops under RCOLL_CUDA_IPC_HOSTS_MIN_BYTES, 16 KiB to 4 MiB, AABB.
#
# Device time is short, so this does everything in one command and keeps
# going past a failing step: each step's log says what happened.
set -u
what=${1:-all}; shift || true  # any other word: build only
[ "$what" = all ] && what=tests,bench
has() { case ",$what," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch,sys;print("python",sys.version.split()[0],"torch",torch.__version__,"cuda",torch.version.cuda)'
  nvcc --version | tail -1
  nproc
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# The GPU's own compute capability, e.g. 90, so nvcc builds one arch.
arch=$(python3 -c 'import torch;m,n=torch.cuda.get_device_capability();print(f"{m}{n}")')
t0=$(date +%s)
cmake -S . -B /tmp/rcoll-bld -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -Dpybind11_DIR="$(python3 -c 'import pybind11;print(pybind11.get_cmake_dir())')" \
  -DRCOLL_CUDA_ARCHS="$arch" > "$OUT/build.log" 2>&1 &&
  ninja -C /tmp/rcoll-bld -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
for m in _core _cuda; do cp /tmp/rcoll-bld/$m*.so python/rcoll/; done
echo "build: $(( $(date +%s) - t0 )) s for sm_$arch"
export PYTHONPATH=$ROOT/python

if has threshold && command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
  # Where RCOLL_CUDA_IPC_HOSTS_MIN_BYTES should sit: the three ops it governs
  # around it, with the windows at every size and all-staged beside them.
  timeout 200 python3 bench/gpu_bench.py --allreduce --hosts AABB --ops allgather,reduce_scatter,broadcast \
    --min-bytes 16K --max-bytes 4M --factor 2 --iters 100 \
    --json "$OUT/gpu_hosts_threshold_aabb_mps.json" > "$OUT/threshold.log" 2>&1
  echo "threshold AABB under MPS: exit $?"
  echo quit | nvidia-cuda-mps-control
  cat "$OUT/threshold.log"
fi
if has tests; then
  (cd tests && timeout "${TESTS_TIMEOUT:-450}" python3 -m pytest -q -p no:cacheprovider -rs --timeout 240 \
     test_cuda.py test_cuda_collectives.py test_cuda_hosts.py "$@") > "$OUT/tests.log" 2>&1
  echo "tests: exit $?"; tail -25 "$OUT/tests.log"
fi
if has bench; then
  timeout 100 python3 bench/gpu_bench.py --kernels --min-bytes 64K --max-bytes 256M --iters 20 \
    --json "$OUT/gpu_kernels.json" > "$OUT/bench.log" 2>&1
  echo "kernels: exit $?"
  # Two ranks on one GPU: without MPS the GPU time-slices between the two
  # processes' contexts (every copy or kernel may wait a slice); with MPS they
  # share it as ranks on separate GPUs would not contend. Both are reported.
  timeout 100 python3 bench/gpu_bench.py --allreduce --min-bytes 4K --max-bytes 256M --iters 20 \
    --json "$OUT/gpu_allreduce.json" >> "$OUT/bench.log" 2>&1
  echo "allreduce: exit $?"
  if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
    echo "== under MPS" >> "$OUT/bench.log"
    timeout 100 python3 bench/gpu_bench.py --allreduce --min-bytes 4K --max-bytes 256M --iters 20 \
      --json "$OUT/gpu_allreduce_mps.json" >> "$OUT/bench.log" 2>&1
    echo "allreduce under MPS: exit $?"
    echo quit | nvidia-cuda-mps-control
  fi
  cat "$OUT/bench.log"
fi
if has hosts && command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
  echo "== under MPS: world 2, one host" > "$OUT/hosts.log"
  timeout 90 python3 bench/gpu_bench.py --allreduce --min-bytes 4K --max-bytes 256M --iters 20 \
    --json "$OUT/gpu_allreduce_mps.json" >> "$OUT/hosts.log" 2>&1
  echo "allreduce world 2 under MPS: exit $?"
  echo "== under MPS: AABB (two emulated hosts of two ranks)" >> "$OUT/hosts.log"
  timeout 200 python3 bench/gpu_bench.py --allreduce --ops allreduce,allgather,reduce_scatter,broadcast --hosts AABB \
    --min-bytes 64K --max-bytes 256M --iters 20 \
    --json "$OUT/gpu_allreduce_hosts_aabb_mps.json" >> "$OUT/hosts.log" 2>&1
  echo "allreduce AABB under MPS: exit $?"
  echo quit | nvidia-cuda-mps-control
  cat "$OUT/hosts.log"
fi
