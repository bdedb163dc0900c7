#!/usr/bin/env bash
# GPU run 18 (timing, nothing else on the GPU): the outside pass's programs per row around the new
# shape (benchmarks/verify_variants.py), then the throughput benchmark's stages on the code of the time
# (256 programs per row): check_small, the large case, the default and pinned 60 s fuzz runs, the scale
# mutants (issues 9, 11). (Run as a heredoc calling those same throughput.py functions; `--only` now says it.)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 130 python benchmarks/verify_variants.py --json "$OUT/h200_verify_tuning3.json" \
  --only shipped programs64 programs1024 programs4096 > "$L/tuning.txt" 2>&1
echo "tuning rc=$?"; grep -v "^ \|Traceback\|^$" "$L/tuning.txt" | cut -c1-400 | tail -6
timeout 440 python benchmarks/throughput.py --json "$OUT/h200.json" --only check_small,large,runs,scale \
  --seconds 60 --pinned-seconds 60 --scale-seconds 30 > "$L/runs.txt" 2>&1
echo "runs rc=$?"; tail -30 "$L/runs.txt" | cut -c1-300
cd "$OUT" && tar czf run18.tgz logs 2>/dev/null; rm -rf logs; ls "$OUT"
