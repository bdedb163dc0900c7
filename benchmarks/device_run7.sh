#!/usr/bin/env bash
# GPU smoke run of the scale work (issue: GPU-scale domain): the GPU tests, a default fuzz run with its
# default --jobs, a scale mutant caught by the default command, and the check-path / large-case numbers.
# Usage on the device: bash benchmarks/device_run7.sh   (writes logs and JSON under $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; python -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__)"
timeout 150 python -m pytest -m gpu --kvfence-device cuda -q -x -p no:cacheprovider 2>&1 | tail -15
timeout 150 python -m kvfence fuzz --device cuda --max-examples 400 --seed 1 --json "$OUT/smoke_default.json" --quiet --out /tmp/o_default 2>&1 | tail -30
echo "default fuzz exit: ${PIPESTATUS[0]}"
K=$(python -c "from kvfence.device import select; select('cuda'); from kvfence.workflow.mutants import kernel_spec; print(kernel_spec('copy_first_block_only'))")
timeout 150 python -m kvfence fuzz --device cuda --kernel "$K" --max-examples 100000000 --max-seconds 40 --shrink-seconds 10 --json "$OUT/smoke_mutant.json" --quiet --out /tmp/o_mutant 2>&1 | tail -30
echo "mutant fuzz exit: ${PIPESTATUS[0]}"
timeout 200 python benchmarks/throughput.py --json "$OUT/h200_quick.json" --quick --skip-runs 2>&1 | tail -40
