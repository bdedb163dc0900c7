#!/usr/bin/env bash
# GPU run 14: (1) alone on the GPU: the large case and check_us_small after the verifier's atomics fix,
# then the default and pinned fuzz commands (60 s and 30 s); (2) side by side (detection and agreement
# only): the four scale mutants under 20 seeds at the GPU budget (100 examples), the two verifiers
# compared on dirty cases after the graph runner's input-snapshot fix, and the CUDA tests of the verifiers.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/m"
timeout 260 python - "$OUT/h200_run14.json" > "$OUT/m/timed.log" 2>&1 <<'PY'
import json, sys
sys.argv = sys.argv[:1] + sys.argv[1:]
sys.path.insert(0, "benchmarks")
import throughput as t
out = {"command": "benchmarks/device_run14.sh (throughput.large, check_small, fuzz_runs(60, None, 30))"}
def save(d):
    out.update(d); open(sys.argv[1], "w").write(json.dumps(out, indent=2) + "\n")
    print({k: v for k, v in d.items() if not isinstance(v, dict)}, flush=True)
save(t.large("cuda")); save(t.check_small("cuda")); save(t.fuzz_runs(60.0, None, 30.0))
PY
echo "timed rc=$?"; cat "$OUT/m/timed.log" | tail -6
for M in copy_first_block_only prefix_sum_16_lanes indptr_sum_64_branches page_last_capped_64; do
  ( timeout 300 python -m kvfence mutants --device cuda --only $M --seeds 20 --json "$OUT/m/$M.json" > "$OUT/m/$M.log" 2>&1; echo "mutants $M rc=$?" >> "$OUT/m/rc.txt" ) &
done
( timeout 300 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers.json" > "$OUT/m/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$OUT/m/rc.txt" ) &
timeout 200 python -m pytest --kvfence-device cuda -q -p no:cacheprovider tests/test_verifiers_compare.py tests/test_fastcheck.py tests/test_gpu.py > "$OUT/m/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/m/pytest.log"
wait
cat "$OUT/m/rc.txt"; for f in "$OUT"/m/*_*.log; do grep -v "HypothesisWarning\|text_repr" "$f" | tail -3; done; grep -E "^(PASS|FAIL)|first disagreement" "$OUT/m/verifiers.log" | head -12
cd "$OUT" && tar czf run14.tgz m && rm -rf m
