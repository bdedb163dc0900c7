#!/usr/bin/env bash
# GPU session, run 4: throughput after the strategy changes, small-case profile, mutants and the whole
# suite compiled on CUDA. Outputs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 170 python3 benchmarks/throughput.py --json $L/h200.json > $L/throughput.txt 2>&1; echo "throughput rc=$?" >> $L/rc.txt
(cd benchmarks && timeout 120 python3 profile_small.py --device cuda --examples 2000 --out $L > $L/profile_small_stdout.txt 2>&1); echo "profile rc=$?" >> $L/rc.txt
timeout 90 python3 -m kvfence mutants --device cuda --json $L/mutants_cuda.json > $L/mutants.txt 2>&1; echo "mutants rc=$?" >> $L/rc.txt
timeout 200 python3 -m pytest --kvfence-device cuda -n 4 -q -p no:cacheprovider > $L/pytest_cuda_all.txt 2>&1; echo "pytest_all_cuda rc=$?" >> $L/rc.txt
tar czf $OUT/logs.tgz -C $OUT logs
cat $L/rc.txt; cat $L/throughput.txt $L/profile_small_stdout.txt; tail -22 $L/mutants.txt; tail -15 $L/pytest_cuda_all.txt
