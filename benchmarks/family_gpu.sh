#!/usr/bin/env bash
# GPU run of the §6 work (issue 13 items 1 and 4, docs/contract.md §6): the reference family and SGLang
# 0.5.23's two kernels compiled on CUDA with window/sinks/ENTRY_PAGE_SIZE/TRANSLATE drawn, the rail under
# window-fixed (clean) and window-no-topk (must be found), and the §6 mutants on the device.
# The device has no network: the extracted 0.5.23 kernels travel in an ignored cache folder:
#   here:   KVFENCE_CACHE=upstream-cache python -m kvfence upstream fetch 0.5.23
#           (or copy /work/main/upstream-cache/sglang-0.5.23 into ./upstream-cache/)
#   device: carry=["upstream-cache"], command: bash benchmarks/family_gpu.sh
# Writes one line per run to $OUT/family_rc.txt (rc 0 clean, 1 findings, 2 bad input) and each run's
# summary.json (host_verified_cases counts the §6 cases verified on the host) and case files under $OUT/family/.
# N (examples per run, default 400) and SECONDS_PER_RUN (default 90) bound it: about 12 runs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KVFENCE_OFFLINE=1
export KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/upstream-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/family"
N=${N:-400}; T=${SECONDS_PER_RUN:-90}
nvidia-smi -L; python -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__)"

run() {  # name, then fuzz flags
  local name=$1; shift
  timeout $((T + 60)) python -m kvfence fuzz --device cuda --max-examples "$N" --max-seconds "$T" --seed 0 --quiet \
      --shrink-seconds 20 --out "$OUT/family/$name" "$@" > "$OUT/family/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $(grep -m1 'cases verified' "$OUT/family/$name.txt" | sed 's/kvfence fuzz: //') host_verified=$(
      python -c "import json; print(json.load(open('$OUT/family/$name/summary.json')).get('host_verified_cases'))" 2>/dev/null)" \
      | tee -a "$OUT/family_rc.txt"
}

RAIL=generate_draft_decode_window_kv_indices
run reference-draft                                          # window/sinks/E/translate drawn, safe: clean
run reference-rail-w4   --contract window-rail --window 4 --sizing window-fixed
run reference-rail-w64  --contract window-rail --window 64 --sizing window-fixed
run reference-rail-notopk --contract window-rail --window 64 --sizing window-no-topk --topk 4   # must be rc=1
run sglang-0.5.23-draft         --kernel sglang==0.5.23     # must be rc=0 (else: a finding, keep its case file)
run sglang-0.5.23-draft-prefix  --kernel sglang==0.5.23 --sizing prefix   # the pre-fix policy: rc=1 expected
run sglang-0.5.23-rail-w4       --kernel sglang==0.5.23:$RAIL --contract window-rail --window 4 --sizing window-fixed
run sglang-0.5.23-rail-w64      --kernel sglang==0.5.23:$RAIL --contract window-rail --window 64 --sizing window-fixed
run sglang-0.5.23-rail-w4096    --kernel sglang==0.5.23:$RAIL --contract window-rail --window 4096 --sizing window-fixed

# The §6 mutants on the device (GPU domain, config-major), each must be caught; the reference clean.
timeout 900 python -m kvfence mutants --device cuda --seeds 2 --max-examples 60 --json "$OUT/family_mutants.json" \
    --only window_offsets_unclipped window_sinks_dropped window_recent_off_by_one entry_page_no_offset \
           translate_page_unscaled translate_negative_unclipped rail_prefix_from_start rail_chain_from_zero \
           rail_indptr_without_chain sizing_window_no_topk > "$OUT/family_mutants.txt" 2>&1
echo "mutants rc=$?" | tee -a "$OUT/family_rc.txt"; tail -15 "$OUT/family_mutants.txt"
