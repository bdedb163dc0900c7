#!/usr/bin/env bash
# GPU: the upstream release matrix (`python -m kvfence upstream matrix`, harness/workflow/release_matrix.py) on CUDA:
# every release x sizing (prefix, fixed, safe) fuzzed with one example budget and seed, compiled kernels in
# CUDA graphs. The GPU machine has no network, so the extracted kernels travel in the ignored cache folder
# upstream-cache/ (with releases.json, the index's release list, and the releases kvfence refuses):
#   here:   KVFENCE_CACHE=upstream-cache python -m kvfence upstream matrix --fetch-only \
#             --versions 0.4.0,0.4.2,0.4.3,0.4.5,0.4.8,0.4.10,0.5.1..0.5.23
#   device: carry=["upstream-cache"], command: bash benchmarks/upstream_gpu.sh
# Writes $OUT/h200_upstream_matrix.json (every cell, rewritten after each), $OUT/upstream-matrix/report.md and
# report.html (the table), the case files of failing cells under $OUT/upstream-matrix/<version>/<sizing>-draft/cases/,
# and $OUT/upstream_matrix.log (one progress line per cell). The whole run is capped at 530 s (SIGTERM: the
# matrix stops its cells and writes what it has, exit 143), inside the 10-minute device call.
# VERSIONS, N (examples per cell), JOBS (cells at once), CAP (seconds), SIZINGS and CONTRACTS (e.g. draft,window-rail with
# SIZINGS=prefix,fixed,safe,window-fixed,window-no-topk) override the defaults.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KVFENCE_OFFLINE=1
export KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/upstream-cache}
VERSIONS=${VERSIONS:-0.4.0,0.4.2,0.4.3,0.4.5,0.4.8,0.4.10,0.5.1..0.5.23}
N=${N:-30}
JOBS=${JOBS:-8}
CONTRACTS=${CONTRACTS:-draft}
SIZINGS=${SIZINGS:-prefix,fixed,safe}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$OUT/upstream_matrix.log"
timeout -s TERM "${CAP:-530}" python3 -m kvfence upstream matrix --versions "$VERSIONS" --sizing "$SIZINGS" \
  --contracts "$CONTRACTS" --device cuda --offline --max-examples "$N" --jobs "$JOBS" --seed 0 \
  --shrink-seconds 5 --cell-timeout 150 --out "$OUT/upstream-matrix" --json "$OUT/h200_upstream_matrix.json" \
  2>&1 | tee -a "$OUT/upstream_matrix.log"
echo "matrix rc=${PIPESTATUS[0]} (0: safe cells clean, 1: a safe cell has findings or errors, 2: bad input, 143: time cap)" \
  | tee -a "$OUT/upstream_matrix.log"
