#!/usr/bin/env bash
# GPU run 9: the throughput benchmark after the fused verifier (issues: GPU scale, verifier cost) and
# each scale mutant under 20 seeds on the GPU domain. (The sweep check runs in run 10.)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 390 python benchmarks/throughput.py --json "$OUT/h200.json" --quick --seconds 60 --pinned-seconds 30 --scale-seconds 30 > "$OUT/throughput.log" 2>&1
echo "throughput rc=$?"; tail -32 "$OUT/throughput.log"
for M in copy_first_block_only prefix_sum_16_lanes indptr_sum_64_branches page_last_capped_64; do
  timeout 45 python -m kvfence mutants --device cuda --only $M --seeds 20 --max-examples 60 --json "$OUT/scale_$M.json" >> "$OUT/mutants.log" 2>&1
  echo "mutants $M rc=$?"; tail -3 "$OUT/mutants.log"
done
