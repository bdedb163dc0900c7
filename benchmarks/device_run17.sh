#!/usr/bin/env bash
# GPU run 17. Timing first, nothing else on the GPU: the outside pass's chunk around the new setting
# (4 blocks) and the streaming store (issue 11's cost); where a pinned job's time goes (issue 9); the
# throughput benchmark's large case, check_us_small, the default and pinned 60 s runs on the final
# verifier settings (issues 9, 11). Then the two verifiers on dirty cases again, with the guarded buffers'
# masks computed instead of kept on the device and the race retries (issue 11).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 150 python benchmarks/verify_variants.py --json "$OUT/h200_verify_tuning2.json" --only shipped chunk2 chunk8 store_cs \
  > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -6
PIN="--topk=2 --num-steps=3 --page-size=1 --ctx=512 --max-bs=16"
# One pinned job in process under cProfile (20 s): the host's share of a case.
timeout 80 python -m cProfile -o "$L/job.prof" -m harness fuzz --device cuda --in-process --jobs 1 --max-examples 100000000 \
  --max-seconds 20 $PIN --quiet --out "$L/prof_run" --json "$L/prof_run.json" > "$L/prof.txt" 2>&1
echo "profile rc=$?"; tail -1 "$L/prof.txt" | cut -c1-300
python - "$L/job.prof" <<'PY' > "$OUT/h200_pinned_job_profile.txt" 2>&1
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("tottime").print_stats(35); s.sort_stats("cumtime").print_stats(45)
PY
head -60 "$OUT/h200_pinned_job_profile.txt" | tail -45 | cut -c1-200
timeout 420 python - "$OUT/h200_run17.json" > "$L/runs.txt" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import throughput as t
pin = [f"--{k.replace('_', '-')}={v}" for k, v in t.SMALL.items()]
out = {"command": "benchmarks/device_run17.sh"}
def save():
    open(sys.argv[1], "w").write(json.dumps(out, indent=2) + "\n")
def pinned(jobs, seconds):
    r = t._fuzz_cli(["--device", "cuda", "--max-examples", "100000000", "--max-seconds", str(seconds), *pin]
                    + (["--jobs", str(jobs)] if jobs else []), timeout=seconds + 200)
    r["verified_per_wall_s"] = round(r["verified_cases"] / r["wall_s"], 1)
    print("pinned jobs", jobs, {k: r.get(k) for k in ("verified_cases", "elapsed_s", "wall_s", "cases_per_s", "verified_per_wall_s", "jobs", "exit")}, flush=True)
    return r
out["pinned_jobs1_20s"] = pinned(1, 20); save()
out.update(t.check_small("cuda")); save(); print("check_us_small", out["check_us_small"], flush=True)
out["large"] = t.large("cuda", naive=False); save(); print("large", {k: v for k, v in out["large"].items() if not isinstance(v, dict)}, flush=True)
out.update(t.fuzz_runs(60, None, 60)); save()
print("default", out["default_verified_cases_per_s"], "pinned(default jobs, 60 s)", out["pinned_verified_cases_per_s"], flush=True)
PY
echo "runs rc=$?"; grep -v "^ \|Traceback\|^$\|Warning" "$L/runs.txt" | cut -c1-600 | tail -12
timeout 150 python -m kvfence mutants --device cuda --verifiers both --max-examples 4 --json "$OUT/h200_verifiers.json" > "$L/verifiers.log" 2>&1
echo "verifiers both rc=$?"; grep -E "^(PASS|FAIL)" "$L/verifiers.log"; grep -A3 "first disagreement" "$L/verifiers.log" | cut -c1-500 | head -16
cd "$OUT" && tar czf run17.tgz logs 2>/dev/null; rm -rf logs; ls "$OUT"
