#!/usr/bin/env bash
# GPU run 11: the new verifier (expected slot ids computed on the fly, kv_indptr in one O(bs) pass)
# checked against the oracle on CUDA, then the throughput benchmark (issues: GPU scale, verifier cost),
# then one scale mutant under 20 seeds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 120 python -m pytest --kvfence-device cuda -q -p no:cacheprovider -x tests/test_fastcheck.py tests/test_gpu.py > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_gpu.log"
timeout 430 python benchmarks/throughput.py --json "$OUT/h200.json" --quick --seconds 60 --pinned-seconds 30 --scale-seconds 30 > "$OUT/throughput.log" 2>&1
echo "throughput rc=$?"; tail -40 "$OUT/throughput.log"
M=copy_first_block_only
timeout 60 python -m kvfence mutants --device cuda --only $M --seeds 20 --max-examples 60 --json "$OUT/scale_$M.json" > "$OUT/mutants.log" 2>&1
echo "mutants $M rc=$?"; tail -4 "$OUT/mutants.log"
