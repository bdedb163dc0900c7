#!/usr/bin/env bash
# GPU check for issue 12 (nightly sweep green on a correct kernel, red on a buggy one). Outputs under $OUT.
#   bash benchmarks/device_sweep_check.sh a   # (a) clean reference cases under each tool: error counts
#   bash benchmarks/device_sweep_check.sh b   # (b) the nightly: safe -> exit 0, prefix -> exit 1 (+ matrix)
# Each part fits in one 10-minute device call; "all" runs both.
# (a) prints, per mode (eager: caching allocator off; graph: on) and tool, compute-sanitizer's exit code,
#     the child's own status and the summary line, with kvfence's command lines (initcheck unfiltered);
#     then the same clean case under initcheck WITH the kernel-name filter the old sweep used, and the
#     fixture script both ways: if the filter is the cause, filtered runs report "Host API uninitialized"
#     / uninitialised __global__ reads and unfiltered runs report 0. Finally kvfence's own sweep over the
#     clean cases, which must exit 0.
# (b) writes $OUT/h200_nightly.json (safe_exit, prefix_exit, wall_s, detection_matrix).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/kvfence_out}
export L=$OUT/logs
mkdir -p "$L"
PART=${1:-all}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
FILTER="--kernel-name kns=generate_draft_decode_kv_indices"
summary() { grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$1" | tail -1; }
kinds() { grep -E "^========= [A-Z]" "$1" | grep -v -E "SUMMARY|COMPUTE-SANITIZER" | sed 's/0x[0-9a-f]*/ADDR/g' | sort | uniq -c | sort -rn | head -5; }

if [ "$PART" = a ] || [ "$PART" = all ]; then
  "$CS" --version | tail -1
  python3 - <<'PY'
import os
from kvfence.cases.case import Batch, Case, Config
from kvfence.cases.casefile import write_case
for mode in ("eager", "graph"):
    case = Case(Config(topk=4, num_steps=3, ctx=64, max_bs=4, mode=mode, sizing="safe"),
                Batch((64, 40, 17, 64), (0, 1, 2, 3), 5))
    print(write_case(case, [], out_dir=os.environ["L"] + "/clean", device="cuda", source="device_sweep_check"))
PY
  for CASE in "$L"/clean/cases/*.json; do
    MODE=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['case']['config']['mode'])" "$CASE" 2>/dev/null || echo "?")
    if [ "$MODE" = eager ]; then ENVC="env PYTORCH_NO_CUDA_MEMORY_CACHING=1"; else ENVC="env"; fi
    CHILD="python3 -m kvfence.sanitizer_child $L/status.json repro $CASE --device cuda --layout production --no-absorb"
    for T in memcheck initcheck racecheck synccheck; do
      F=$FILTER; [ "$T" = initcheck ] && F=""
      LOG=$L/a_${MODE}_${T}.txt; rm -f "$L/status.json"
      $ENVC timeout 150 "$CS" --tool $T --error-exitcode 86 --print-limit 0 $F $CHILD > "$LOG" 2>&1
      RC=$?
      echo "a $MODE $T: rc=$RC child=$(cat "$L/status.json" 2>/dev/null || echo none) | $(summary "$LOG")"; kinds "$LOG"
    done
    LOG=$L/a_${MODE}_initcheck_filtered.txt; rm -f "$L/status.json"
    $ENVC timeout 150 "$CS" --tool initcheck --error-exitcode 86 --print-limit 0 $FILTER $CHILD > "$LOG" 2>&1
    RC=$?
    echo "a $MODE initcheck WITH kernel filter (old): rc=$RC | $(summary "$LOG")"; kinds "$LOG"
  done
  for F in "" "$FILTER"; do
    LOG=$L/a_fixture_initcheck${F:+_filtered}.txt
    timeout 120 "$CS" --tool initcheck --error-exitcode 86 --print-limit 0 $F python3 tests/fixtures/make_sanitizer_fixtures.py --sizing safe > "$LOG" 2>&1
    RC=$?
    echo "a fixture script initcheck $([ -n "$F" ] && echo 'WITH kernel filter (old)' || echo unfiltered): rc=$RC | $(summary "$LOG")"; kinds "$LOG"
  done
  timeout 300 python3 -m kvfence sweep --cases "$L/clean/cases" --jobs 4 --timeout 150 --out "$L/sweep_clean" > "$L/sweep_clean.txt" 2>&1
  RC=$?
  echo "a kvfence sweep over the clean cases: rc=$RC (must be 0)"; tail -4 "$L/sweep_clean.txt"
  cp "$L/sweep_clean/sweep.json" "$OUT/h200_sweep_clean.json" 2>/dev/null
fi

if [ "$PART" = b ] || [ "$PART" = all ]; then
  timeout 560 python3 benchmarks/nightly.py --out "$L/nightly" --json "$OUT/h200_nightly.json" --max-examples 300 --jobs 4 \
    --timeout 120 > "$L/nightly.txt" 2>&1
  RC=$?
  echo "b nightly: rc=$RC (0 = safe exited 0 and prefix exited 1 with canary and memcheck findings)"; cat "$L/nightly.txt"
  python3 -c "import json; from kvfence.reports.sweep import matrix_markdown; d=json.load(open('$OUT/h200_nightly.json')); print(matrix_markdown(d['detection_matrix']) if d.get('detection_matrix') else 'no matrix')" 2>&1
  cp "$L/nightly/prefix/sweep.html" "$OUT/nightly_prefix_sweep.html" 2>/dev/null
fi
# Keep what comes back small: big XML reports go (the text logs say the same), long logs are cut.
find "$L" -name '*.xml' -size +1M -delete
find "$L" \( -name '*.log' -o -name '*.txt' \) -size +2M -exec truncate -s 2M {} \;
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
