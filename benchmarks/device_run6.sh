#!/usr/bin/env bash
# GPU session, run 6: the whole suite compiled on CUDA once more, after the GPU-box test fixes.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
timeout 240 python3 -m pytest --kvfence-device cuda -n 4 -q -p no:cacheprovider -rs > $L/pytest_cuda_all.txt 2>&1; echo "pytest_all_cuda rc=$?" >> $L/rc.txt
cp $L/pytest_cuda_all.txt $OUT/
cat $L/rc.txt; tail -25 $L/pytest_cuda_all.txt
