#!/usr/bin/env bash
# GPU: fuzz SGLang's own kernels, extracted from their wheels, compiled on CUDA (harness/upstream.py).
# The GPU machine has no network, so the extracted kernels travel in an ignored cache folder:
#   here:   for v in 0.4.8 0.5.2 0.5.23; do KVFENCE_CACHE=upstream-cache python -m harness upstream fetch $v; done
#   device: carry=["upstream-cache"], command: bash benchmarks/upstream_gpu.sh
# VERSIONS (default: every release in the cache), SIZINGS (default "safe prefix") and N (examples per cell,
# default 300) narrow the run. One line per cell in $OUT/upstream_rc.txt (rc 0 clean, 1 findings, 2 bad input);
# each cell's summary.json, report and case files under $OUT/upstream/<version>-<sizing>/.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KVFENCE_OFFLINE=1
export KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/upstream-cache}
N=${N:-300}
SIZINGS=${SIZINGS:-"safe prefix"}
VERSIONS=${VERSIONS:-$(ls "$KVFENCE_CACHE" | sed -n 's/^sglang-//p' | sort -V)}
mkdir -p "$OUT/upstream"
for v in $VERSIONS; do
  for sz in $SIZINGS; do
    cell="$OUT/upstream/$v-$sz"
    timeout 120 python3 -m harness fuzz --device cuda --kernel "sglang==$v" --sizing "$sz" --max-examples "$N" \
      --seed 0 --quiet --shrink-seconds 5 --out "$cell" > "$cell.txt" 2>&1
    rc=$?
    echo "$v $sz rc=$rc $(grep -m1 'cases checked' "$cell.txt" | sed 's/kvfence fuzz: //')" | tee -a "$OUT/upstream_rc.txt"
  done
done
