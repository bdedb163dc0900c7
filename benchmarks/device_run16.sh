#!/usr/bin/env bash
# GPU run 16. Carry upstream-cache. (1) alone: the device verifier's tunables timed on the large, slack
# and small cases (benchmarks/verify_variants.py; issue 11's cost, issue 9's check_us_small);
# (2) side by side (verdicts and exit codes only): the release matrix over every 0.5.x release and a
# spread of 0.4.x, both contracts, every sizing (issue 13), and the two verifiers on dirty cases with the
# "before" snapshots kept in host memory (issue 11).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 210 python benchmarks/verify_variants.py --json "$OUT/h200_verify_tuning.json" > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -14
( timeout 330 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers.json" > "$L/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$L/rc.txt" ) &
( SIZINGS=prefix,fixed,safe,window-fixed,window-no-topk CONTRACTS=draft,window-rail CAP=320 OUT=$OUT/um \
    bash benchmarks/upstream_gpu.sh > "$L/upstream.txt" 2>&1; echo "upstream matrix rc=$?" >> "$L/rc.txt" ) &
wait
cat "$L/rc.txt"; grep -E "^(PASS|FAIL)|agree" "$L/verifiers.log" | tail -8; grep -B2 -A6 "first disagreement" "$L/verifiers.log" | cut -c1-400 | head -30
tail -6 "$L/upstream.txt" | cut -c1-300
cp "$OUT/um/h200_upstream_matrix.json" "$OUT/" 2>/dev/null; cp "$OUT/um/upstream-matrix/report.md" "$OUT/upstream_report.md" 2>/dev/null
cd "$OUT" && tar czf run16.tgz logs um 2>/dev/null; rm -rf logs um
ls "$OUT"
