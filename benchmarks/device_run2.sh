#!/usr/bin/env bash
# GPU session, run 2: GPU tests, throughput, small-case profile. Outputs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 150 python3 -m pytest -m gpu --kvfence-device cuda -q -p no:cacheprovider > $L/pytest_gpu.txt 2>&1; echo "pytest_gpu rc=$?" >> $L/rc.txt
timeout 180 python3 benchmarks/throughput.py --json $L/h200.json > $L/throughput.txt 2>&1; echo "throughput rc=$?" >> $L/rc.txt
(cd benchmarks && timeout 150 python3 profile_small.py --device cuda --examples 2000 --out $L > $L/profile_small_stdout.txt 2>&1); echo "profile rc=$?" >> $L/rc.txt
tar czf $OUT/logs.tgz -C $OUT logs
cat $L/rc.txt; tail -3 $L/pytest_gpu.txt; cat $L/throughput.txt $L/profile_small_stdout.txt | tail -30
