#!/usr/bin/env bash
# GPU run 19, the final code (outside pass at 1,024 programs per row). Timing first, alone: the verifier
# on the large, slack and small cases, check_small, the default and pinned 60 s fuzz runs (issues 9, 11).
# Then side by side (verdicts only): the GPU tests and the two verifiers on dirty cases (issue 11).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 60 python benchmarks/verify_variants.py --json "$OUT/h200_verify_final.json" --only shipped > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -3
timeout 260 python - "$OUT/h200.json" > "$L/runs.txt" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import throughput as t
import torch, triton
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
       "command": "benchmarks/device_run19.sh: throughput.check_small, large(naive=False), fuzz_runs(60, None, 60)"}
def stage(d):
    out.update(d)
    open(sys.argv[1], "w").write(json.dumps(out, indent=2) + "\n")
    print({k: v for k, v in d.items() if not isinstance(v, (dict, list))}, flush=True)
stage(t.check_small("cuda"))
stage(t.large("cuda", naive=False))
stage(t.fuzz_runs(60, None, 60))
PY
echo "runs rc=$?"; grep -v "^ \|Traceback\|^$\|Warning" "$L/runs.txt" | cut -c1-700 | tail -5
( timeout 170 python -m pytest --device cuda -q -p no:cacheprovider tests/test_fastcheck.py tests/test_gpu.py tests/test_worker_gpu.py \
    > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/rc.txt" ) &
( timeout 170 python -m harness mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers_final.json" \
    > "$L/verifiers.log" 2>&1; echo "verifiers both rc=$?" >> "$L/rc.txt" ) &
wait
cat "$L/rc.txt"; tail -3 "$L/pytest.log"; grep -E "^(PASS|FAIL)" "$L/verifiers.log"; grep -A3 "first disagreement" "$L/verifiers.log" | cut -c1-400 | head -12
cd "$OUT" && tar czf run19.tgz logs 2>/dev/null; rm -rf logs; ls "$OUT"
