#!/usr/bin/env bash
# GPU session, run 3: nightly sweep, 10k-example fuzz, GPU tests, throughput. Outputs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 100 python3 -m pytest -m gpu --kvfence-device cuda -q -p no:cacheprovider > $L/pytest_gpu.txt 2>&1; echo "pytest_gpu rc=$?" >> $L/rc.txt
/usr/bin/time -v timeout 200 python3 -m kvfence sweep --max-examples 150 --sizing prefix --mode eager --max-failing 5 --sample 2 --jobs 4 --seed 1 --out $L/sweep > $L/sweep.txt 2>&1; echo "sweep rc=$?" >> $L/rc.txt
rm -rf $L/sweep/sanitizer/*.log
timeout 240 python3 -m kvfence fuzz --device cuda --sizing fixed --seq-len-limit ctx-steps --max-examples 10000 --seed 5 --out $L/fuzz10k --json $L/fuzz10k.json > $L/fuzz10k.txt 2>&1; echo "fuzz10k rc=$?" >> $L/rc.txt
timeout 60 python3 -m kvfence fuzz --device cuda --sizing prefix --max-examples 500 --seed 5 --out $L/fuzzprefix --json $L/fuzzprefix.json > $L/fuzzprefix.txt 2>&1; echo "fuzzprefix rc=$?" >> $L/rc.txt
timeout 150 python3 benchmarks/throughput.py --json $L/h200.json > $L/throughput.txt 2>&1; echo "throughput rc=$?" >> $L/rc.txt
tar czf $OUT/logs.tgz -C $OUT logs
cat $L/rc.txt; tail -3 $L/pytest_gpu.txt; tail -12 $L/sweep.txt; tail -4 $L/fuzz10k.txt; tail -5 $L/fuzzprefix.txt; cat $L/throughput.txt
