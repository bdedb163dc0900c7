#!/usr/bin/env bash
# GPU run 8 (issue: GPU-scale domain): the whole throughput benchmark, fuzz-command runs and scale
# mutants included. Writes $OUT/h200.json (committed as benchmarks/results/h200.json) and the log.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 580 python benchmarks/throughput.py --json "$OUT/h200.json" --seconds 60 2>&1 | tee "$OUT/throughput.log" | tail -60
