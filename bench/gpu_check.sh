#!/usr/bin/env bash
# One GPU check: install the package (no network needed), run the CUDA tests, then the end-to-end
# benchmark. Usage: bash bench/gpu_check.sh OUT_DIR [bench.e2e arguments, e.g. --sizes 350m]
# Writes OUT_DIR/gpu.txt, gpu_tests.log, e2e.log and bench.e2e's e2e.csv, kernels.csv, summary.txt.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash bench/gpu_check.sh OUT_DIR [bench.e2e arguments]" >&2
  exit 2
fi
dest=$1
shift
mkdir -p "$dest"
export PYTHONUNBUFFERED=1
python3 -m pip install --quiet --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warn | tail -3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$dest/gpu.txt"
python3 -m pytest -q tests/gpu 2>&1 | tee "$dest/gpu_tests.log" | tail -15
tests=${PIPESTATUS[0]}
python3 -m bench.e2e --out "$dest" "$@" 2>&1 | tee "$dest/e2e.log" | grep -v -i warn | tail -15
e2e=${PIPESTATUS[0]}
exit $((tests != 0 || e2e != 0))
