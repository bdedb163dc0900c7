#!/usr/bin/env bash
# GPU run 21: the check path after run 20's profile (staging rows written into the pinned buffer through
# numpy, launches counted per bucket instead of per case): check_us_small three times, run 20's
# breakdown again, and the GPU tests (issue 9).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for i in 1 2 3; do
  timeout 60 python benchmarks/throughput.py --json "$OUT/h200_check_small_$i.json" --only check_small > "$OUT/check_small_$i.txt" 2>&1
  echo "check_small $i rc=$? $(grep check_us_small "$OUT/check_small_$i.txt")"
done
bash benchmarks/device_run20.sh | tail -32
timeout 120 python -m pytest --kvfence-device cuda -q -p no:cacheprovider tests/test_fastcheck.py tests/test_gpu.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -2 "$OUT/pytest.log"
