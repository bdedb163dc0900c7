#!/usr/bin/env bash
# GPU session, run 5: the whole suite compiled on CUDA after the GPU-box fixes, and a graph-mode sweep.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 240 python3 -m pytest --kvfence-device cuda -n 4 -q -p no:cacheprovider > $L/pytest_cuda_all.txt 2>&1; echo "pytest_all_cuda rc=$?" >> $L/rc.txt
timeout 150 python3 -m kvfence sweep --max-examples 80 --sizing prefix --mode graph --max-failing 3 --sample 1 --jobs 4 --seed 2 --tools memcheck,racecheck --out $L/sweep_graph > $L/sweep_graph.txt 2>&1; echo "sweep_graph rc=$?" >> $L/rc.txt
cp $L/sweep_graph/sweep.json $L/sweep_graph.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
cat $L/rc.txt; tail -12 $L/pytest_cuda_all.txt; cat $L/sweep_graph.txt | head -12
