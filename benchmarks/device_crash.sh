#!/usr/bin/env bash
# GPU session (issue 10, item 4): a kernel that faults far past its allocation, fuzzed with --keep-going
# on CUDA in under 4 minutes: expect exit 1, CRASH case file(s) with seq_lens [3] (the shrunk crash),
# and the run going on to its time budget after it. Then what a worker restart costs after a crash,
# with and without spare workers. Everything lands in $OUT (summary, case files, logs, JSON).
#   budget: restart benchmark <= 40 s; fuzz: 90 s exploring + <= 45 s shrinking per failure found, cut at 190 s.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
echo "TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-unset (Triton's default ~/.triton/cache, shared by every worker)}" > $L/env.txt
# One process (--jobs 1), the small CPU-sized domain around the pinned fields; eager (the plug-in reads
# seq_lens on the host, which graph capture forbids).
timeout 190 python3 -m kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_3 --mode eager \
  --scale cpu --jobs 1 --topk 2 --num-steps 2 --ctx 8 --max-bs 2 --seed 1 --keep-going \
  --max-examples 1000000 --max-seconds 90 --shrink-seconds 45 --quiet --out $OUT/crash_run > $L/fuzz_crash.txt 2>&1
echo "fuzz_crash rc=$? (expect 1)" >> $L/rc.txt
cp $OUT/crash_run/summary.json $OUT/crash_run_summary.json 2>/dev/null
timeout 40 python3 benchmarks/worker_restart.py --device cuda --crashes 3 --gap 1.0 --json $OUT/worker_restart_h200.json \
  > $L/worker_restart.txt 2>&1; echo "worker_restart rc=$?" >> $L/rc.txt
cat $L/rc.txt $L/env.txt; tail -30 $L/fuzz_crash.txt; cat $L/worker_restart.txt
python3 - <<'PY'
import json, os
s = json.load(open(os.path.join(os.environ["OUT"], "crash_run", "summary.json")))
print("keep_going", s.get("keep_going"), "worker", s.get("worker"), "examples", s["examples"], "elapsed_s", s["elapsed_s"])
for path, rec in s["cases"].items():
    print(rec["kinds"], rec["config"]["page_size"], rec["batch"], path)
PY
