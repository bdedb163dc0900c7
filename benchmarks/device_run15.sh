#!/usr/bin/env bash
# GPU run 15 (last of the session). Carry upstream-cache. (1) alone: worker IPC per small case (issue:
# crash-proof runs); (2) side by side (verdicts and exit codes only): the two verifiers on dirty cases
# with the racy-case rule; the upstream release matrix (reduced budget); a kernel that faults far past
# its allocation fuzzed with --keep-going, then the worker-restart cost.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
timeout 45 python benchmarks/worker_ipc.py --device cuda --json "$OUT/worker_ipc_h200.json" > "$L/worker_ipc.txt" 2>&1
echo "worker_ipc rc=$?"; tail -2 "$L/worker_ipc.txt" | cut -c1-600
timeout 45 python - "$OUT/h200_large_final.json" > "$L/large.txt" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import throughput as t
d = t.large("cuda", naive=False)
d["command"] = "benchmarks/device_run15.sh: throughput.large('cuda', naive=False)"
open(sys.argv[1], "w").write(json.dumps(d, indent=2) + "\n")
print({k: v for k, v in d.items() if k != "command"})
PY
echo "large rc=$?"; tail -1 "$L/large.txt" | cut -c1-900
( timeout 190 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers.json" > "$L/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$L/rc.txt" ) &
( VERSIONS=0.4.0,0.4.2,0.4.3,0.4.5,0.4.8,0.4.10,0.5.1,0.5.5,0.5.10,0.5.13,0.5.16,0.5.20,0.5.21,0.5.22,0.5.23 N=10 JOBS=4 SIZINGS=prefix,fixed,safe,window-fixed,window-no-topk CONTRACTS=draft,window-rail OUT=$OUT/um timeout -s TERM 190 bash benchmarks/upstream_gpu.sh > "$L/upstream.txt" 2>&1; echo "upstream matrix rc=$?" >> "$L/rc.txt" ) &
( timeout 130 python3 -m kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_3 --mode eager \
    --scale cpu --jobs 1 --topk 2 --num-steps 2 --ctx 8 --max-bs 2 --seed 1 --keep-going \
    --max-examples 1000000 --max-seconds 50 --shrink-seconds 40 --quiet --out "$OUT/crash_run" > "$L/fuzz_crash.txt" 2>&1
  echo "fuzz_crash rc=$? (expect 1)" >> "$L/rc.txt"
  timeout 50 python3 benchmarks/worker_restart.py --device cuda --crashes 3 --gap 1.0 --json "$OUT/worker_restart_h200.json" \
    > "$L/worker_restart.txt" 2>&1; echo "worker_restart rc=$?" >> "$L/rc.txt" ) &
# The §6 family (issue 13): the reference and SGLang 0.5.23's two kernels with window/sinks/E/translate
# drawn (safe sizings: must be clean), the rail's buggy sizing (must be found), and the §6 mutants.
export KVFENCE_OFFLINE=1 KVFENCE_CACHE=$PWD/upstream-cache
fam() {  # name, then fuzz flags; one line per run in $L/family_rc.txt
  local name=$1; shift
  timeout 150 python -m kvfence fuzz --device cuda --jobs 1 --max-examples 400 --max-seconds 60 --seed 0 --quiet \
      --shrink-seconds 20 --out "$OUT/fam/$name" "$@" > "$L/fam_$name.txt" 2>&1
  echo "$name rc=$? $(python -c "import json; d=json.load(open('$OUT/fam/$name/summary.json')); print('verified', d.get('verified_cases'), 'host_verified', d.get('host_verified_cases'), 'kinds', sorted({f['kind'] for f in d.get('findings', [])}))" 2>&1 | tail -1)" >> "$L/family_rc.txt"
}
RAIL=generate_draft_decode_window_kv_indices
mkdir -p "$OUT/fam"
( fam reference-draft --family on ) &
( fam reference-rail-notopk --family on --contract window-rail --window 64 --sizing window-no-topk --topk 4 ) &
( fam sglang-0.5.23-draft --family on --kernel sglang==0.5.23 ) &
( fam sglang-0.5.23-rail-w64 --family on --kernel sglang==0.5.23:$RAIL --contract window-rail --window 64 --sizing window-fixed ) &
( timeout 190 python -m kvfence mutants --device cuda --seeds 1 --max-examples 40 --json "$OUT/family_mutants.json" \
    --only window_offsets_unclipped window_sinks_dropped window_recent_off_by_one entry_page_no_offset \
           translate_page_unscaled translate_negative_unclipped rail_prefix_from_start rail_chain_from_zero \
           rail_indptr_without_chain sizing_window_no_topk > "$L/family_mutants.txt" 2>&1; echo "family mutants rc=$?" >> "$L/rc.txt" ) &
wait
cat "$L/rc.txt"; grep -E "^(PASS|FAIL)" "$L/verifiers.log"; grep -A3 "first disagreement" "$L/verifiers.log" | cut -c1-300 | head -12
tail -8 "$L/upstream.txt" | cut -c1-300; tail -6 "$L/fuzz_crash.txt"; tail -3 "$L/worker_restart.txt" | cut -c1-400
cat "$L/family_rc.txt"; grep -v "HypothesisWarning\|text_repr" "$L/family_mutants.txt" | tail -14
cp "$OUT/um/h200_upstream_matrix.json" "$OUT/" 2>/dev/null; cp "$OUT/crash_run/summary.json" "$OUT/crash_run_summary.json" 2>/dev/null
cd "$OUT" && tar czf run15.tgz logs um crash_run fam 2>/dev/null; rm -rf logs um crash_run fam
ls "$OUT"
