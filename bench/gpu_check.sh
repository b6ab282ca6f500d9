#!/usr/bin/env bash
# One GPU call: install the package (no network there), run the CUDA tests, then the given command.
# Usage on the device machine: bash bench/gpu_check.sh [extra command...]; logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install --quiet --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warn | tail -3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
if [ $# -gt 0 ]; then
  "$@" 2>&1 | tee "$OUT/command.log"
fi
