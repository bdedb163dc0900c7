#!/usr/bin/env bash
# GPU run 23 (the last, alone on the GPU): check_us_small and the default and pinned 60 s fuzz runs on
# the final code, after the check path's host changes of runs 20-22 (issue 9). Run as one command line:
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 230 python benchmarks/throughput.py --json $OUT/h200_runs_final.json --only runs,check_small --seconds 60 \
  --pinned-seconds 60 > $OUT/runs_final.txt 2>&1; echo rc=$?; tail -12 $OUT/runs_final.txt | cut -c1-200
