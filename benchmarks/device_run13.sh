#!/usr/bin/env bash
# GPU run 13: (1) alone on the GPU: the throughput benchmark's timed stages without the fuzz-command runs
# (large case with the new verifier, small-case rates, check_us_small, the fair naive baseline);
# (2) side by side (detection and exit codes only, no timing claims): the four scale mutants under 20
# seeds each, the nightly profile (issue: nightly sweep) and the two verifiers compared on dirty cases.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/m" "$OUT/n"
timeout 170 python benchmarks/throughput.py --json "$OUT/h200_timed.json" --quick --skip-runs > "$OUT/m/throughput.log" 2>&1
echo "throughput rc=$?"; tail -42 "$OUT/m/throughput.log" | grep -v "_stats\|rates"
for M in copy_first_block_only prefix_sum_16_lanes indptr_sum_64_branches page_last_capped_64; do
  ( timeout 400 python -m kvfence mutants --device cuda --only $M --seeds 20 --max-examples 60 --json "$OUT/m/$M.json" > "$OUT/m/$M.log" 2>&1; echo "mutants $M rc=$?" >> "$OUT/m/rc.txt" ) &
done
( timeout 410 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers.json" > "$OUT/m/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$OUT/m/rc.txt" ) &
timeout 410 python3 benchmarks/nightly.py --out "$OUT/n/nightly" --json "$OUT/h200_nightly.json" --max-examples 300 --jobs 6 --timeout 120 > "$OUT/n/nightly.txt" 2>&1
echo "nightly rc=$? (0: safe exited 0 and prefix exited 1 with canary and memcheck findings)"; tail -30 "$OUT/n/nightly.txt"
wait
cat "$OUT/m/rc.txt"; for f in "$OUT"/m/*_*.log; do echo "== $f"; grep -v "HypothesisWarning\|text_repr" "$f" | tail -4; done; tail -25 "$OUT/m/verifiers.log"
python3 -c "import json; from kvfence.reports.sweep import matrix_markdown; d=json.load(open('$OUT/h200_nightly.json')); print(matrix_markdown(d['detection_matrix']) if d.get('detection_matrix') else 'no matrix')" 2>&1 | tail -20
find "$OUT/n" -name '*.xml' -delete
cd "$OUT" && tar czf mutants.tgz m && tar czf nightly.tgz n && rm -rf m n
