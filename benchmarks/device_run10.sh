#!/usr/bin/env bash
# GPU run 10 (last of the session): the throughput benchmark after distinct token tables per example
# (issue: GPU scale), the scale mutants under 20 seeds (partial JSON kept if cut short), and the
# crash-isolation GPU checks (issue: crash-proof runs): a kernel that faults far past its allocation.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 290 python benchmarks/throughput.py --json "$OUT/h200.json" --quick --seconds 60 --pinned-seconds 30 --scale-seconds 30 > "$OUT/throughput.log" 2>&1
echo "throughput rc=$?"; tail -34 "$OUT/throughput.log"
timeout 120 python -m kvfence mutants --device cuda --only copy_first_block_only prefix_sum_16_lanes indptr_sum_64_branches page_last_capped_64 --seeds 20 --max-examples 60 --json "$OUT/h200_scale_mutants.json" > "$OUT/mutants.log" 2>&1
echo "mutants rc=$?"; tail -8 "$OUT/mutants.log"
{ timeout 60 python -m pytest --kvfence-device cuda -q -p no:cacheprovider tests/test_worker_gpu.py 2>&1 | tail -5
  timeout 60 python -m kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_3 --mode eager \
    --scale cpu --jobs 1 --topk 2 --num-steps 2 --ctx 8 --max-bs 2 --seed 1 --max-examples 200 --quiet --out /tmp/fault_run 2>&1 | tail -12
  echo "fault fuzz rc=${PIPESTATUS[0]} (expect 1)"; cp /tmp/fault_run/summary.json "$OUT/fault_run_summary.json"; } > "$OUT/crash.log" 2>&1
cat "$OUT/crash.log"
