#!/usr/bin/env bash
# GPU run 18 (timing, nothing else on the GPU): the outside pass's programs per row around the new
# shape (benchmarks/verify_variants.py), then the throughput benchmark's stages on the final code:
# check_small, the large case, the default and pinned 60 s fuzz runs, the scale mutants (issues 9, 11).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 130 python benchmarks/verify_variants.py --json "$OUT/h200_verify_tuning3.json" \
  --only shipped programs64 programs1024 programs4096 > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -6
timeout 440 python - "$OUT/h200.json" > "$L/runs.txt" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import throughput as t
import torch, triton
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
       "command": "benchmarks/device_run18.sh: throughput.check_small, large(naive=False), fuzz_runs(60, None, 60), scale_mutants(30)"}
def stage(d):
    out.update(d)
    open(sys.argv[1], "w").write(json.dumps(out, indent=2) + "\n")
    print({k: v for k, v in d.items() if not isinstance(v, (dict, list))}, flush=True)
stage(t.check_small("cuda"))
stage(t.large("cuda", naive=False))
stage(t.fuzz_runs(60, None, 60))
stage(t.scale_mutants(30))
print("scale", out["scale_mutants_caught_s"], flush=True)
PY
echo "runs rc=$?"; grep -v "^ \|Traceback\|^$\|Warning" "$L/runs.txt" | cut -c1-700 | tail -8
cd "$OUT" && tar czf run18.tgz logs 2>/dev/null; rm -rf logs; ls "$OUT"
