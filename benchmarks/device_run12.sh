#!/usr/bin/env bash
# GPU run 12: (1) verifier code shapes on the large case, alone on the GPU (benchmarks/verify_variants.py);
# (2) the four scale mutants under 20 seeds each (four processes side by side; rates do not depend on
# speed: each seed has a fixed example budget), next to (3) the sweep check part a (issue: nightly).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 python benchmarks/verify_variants.py --json "$OUT/h200_verify_variants.json" > "$OUT/variants.log" 2>&1
echo "variants rc=$?"; cat "$OUT/variants.log" | tail -16
mkdir -p "$OUT/m"
for M in copy_first_block_only prefix_sum_16_lanes indptr_sum_64_branches page_last_capped_64; do
  ( timeout 400 python -m kvfence mutants --device cuda --only $M --seeds 20 --max-examples 60 --json "$OUT/m/$M.json" > "$OUT/m/$M.log" 2>&1; echo "mutants $M rc=$?" >> "$OUT/m/rc.txt" ) &
done
OUT=$OUT/sweep timeout 420 bash benchmarks/device_sweep_check.sh a > "$OUT/sweep_a.log" 2>&1
echo "sweep a rc=$?"; grep -E "^a |rc=" "$OUT/sweep_a.log" | head -40
wait
cat "$OUT/m/rc.txt"; for f in "$OUT"/m/*.log; do tail -4 "$f"; done
cd "$OUT" && tar czf mutants.tgz m && rm -rf m
