#!/usr/bin/env bash
# GPU run 22: check_us_small as the median of 5 passes (throughput.check_small), final code (issue 9).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 100 python benchmarks/throughput.py --json "$OUT/h200_check_small.json" --only check_small > "$OUT/check_small.txt" 2>&1
echo "check_small rc=$?"; grep -E "check_us_small" "$OUT/check_small.txt"
