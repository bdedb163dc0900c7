#!/usr/bin/env bash
# GPU run 19, the final verification kernels (outside pass at 1,024 programs per row). Timing first,
# alone: the verifier on the large, slack and small cases, check_small, the default and pinned 60 s fuzz runs (issues 9, 11).
# Then side by side (verdicts only): the GPU tests and the two verifiers on dirty cases (issue 11).
# (The throughput stages ran as a heredoc calling the same throughput.py functions; `--only` now says it.)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 60 python benchmarks/verify_variants.py --json "$OUT/h200_verify_final.json" --only shipped > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -3
timeout 260 python benchmarks/throughput.py --json "$OUT/h200.json" --only check_small,large,runs \
  --seconds 60 --pinned-seconds 60 > "$L/runs.txt" 2>&1
echo "runs rc=$?"; tail -30 "$L/runs.txt" | cut -c1-300
( timeout 170 python -m pytest --kvfence-device cuda -q -p no:cacheprovider tests/test_fastcheck.py tests/test_gpu.py tests/test_worker_gpu.py \
    > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/rc.txt" ) &
( timeout 170 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers_final.json" \
    > "$L/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$L/rc.txt" ) &
wait
cat "$L/rc.txt"; tail -3 "$L/pytest.log"; grep -E "^(PASS|FAIL)" "$L/verifiers.log"; grep -A3 "first disagreement" "$L/verifiers.log" | cut -c1-400 | head -12
cd "$OUT" && tar czf run19.tgz logs 2>/dev/null; rm -rf logs; ls "$OUT"
