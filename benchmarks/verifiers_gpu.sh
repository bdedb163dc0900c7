#!/usr/bin/env bash
# The two verifiers compared on dirty cases on one H200 (issue 11, item 2): every kernel and sizing
# mutant, every planted bad write of kernels/planted.py and the reference, the same cases through the
# device verifier (compiled, inside CUDA graphs) and the oracle path. Writes $OUT/h200_verifiers.json
# (cases, agree, disagree, per-target rows with the first disagreement's two finding lists).
#
# Budget: 47 targets x 6 cases. Scale mutants, the reference and the planted writes are drawn from the GPU
# domain under a 16 MiB per-config budget (the oracle path builds each write set in Python), the other
# mutants from the CPU domain. A timeout of 450 s keeps it inside 8 minutes; if it is cut short,
# $OUT/h200_verifiers.json.partial holds every target finished so far.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 450 python -m kvfence mutants --device cuda --verifiers both --max-examples 6 \
    --json "$OUT/h200_verifiers.json" > "$OUT/verifiers.log" 2>&1
echo "mutants --verifiers both rc=$? (0: all agree; 1: a disagreement; 124: cut by the timeout)"
tail -60 "$OUT/verifiers.log"
