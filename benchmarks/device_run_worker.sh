#!/usr/bin/env bash
# GPU session (issue 10, crash-proof runs): worker IPC overhead per small case on CUDA, the GPU
# fault test, and a fuzz run of a kernel that faults far past its allocation (CRASH, minimal case file).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 200 python3 benchmarks/worker_ipc.py --device cuda --json $OUT/worker_ipc_h200.json > $L/worker_ipc.txt 2>&1; echo "worker_ipc rc=$?" >> $L/rc.txt
timeout 200 python3 -m pytest --kvfence-device cuda -q -p no:cacheprovider tests/test_worker_gpu.py > $L/pytest_worker_gpu.txt 2>&1; echo "pytest_worker_gpu rc=$?" >> $L/rc.txt
# One process (--jobs 1), the small CPU-sized domain around the pinned fields; eager (the plug-in reads
# seq_lens on the host, which graph capture forbids). Expect exit 1, one CRASH with seq_lens [3].
timeout 180 python3 -m kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_3 --mode eager \
  --scale cpu --jobs 1 --topk 2 --num-steps 2 --ctx 8 --max-bs 2 --seed 1 --max-examples 200 --quiet --out $OUT/fault_run > $L/fuzz_fault.txt 2>&1; echo "fuzz_fault rc=$? (expect 1)" >> $L/rc.txt
cp $OUT/fault_run/summary.json $OUT/fault_run_summary.json 2>/dev/null
cat $L/rc.txt; cat $L/worker_ipc.txt; tail -5 $L/pytest_worker_gpu.txt; tail -25 $L/fuzz_fault.txt
