#!/usr/bin/env bash
# GPU run of the campaign work (issue 15): two shards of one campaign sharing a directory database,
# a second night that replays the first night's failure at once, the merged report, and what the
# database costs the GPU fuzz rate with and without the target phase.
# Usage on the device: bash benchmarks/device_campaign.sh   (writes logs and JSON under $OUT)
# No Redis here (the device has no network to install one); the directory database is the same code path.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/campaign; rm -rf "$W"; mkdir -p "$W"
nvidia-smi -L; python -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__)"

# Night 1: shards 1/2 and 2/2, the pre-fix prefix policy (overflows for topk >= 2), one shared database.
for i in 1 2; do
  timeout 150 python -m kvfence fuzz --device cuda --sizing prefix --shard $i/2 --seed 1 --max-examples 2000 \
      --shrink-seconds 20 --quiet --database "$W/db" --out "$W/night1/shard-$i" > "$OUT/night1_shard$i.log" 2>&1
  echo "night 1 shard $i exit: $?"; cp "$W/night1/shard-$i/summary.json" "$OUT/night1_shard$i.json"
done
# Night 2: another seed, a budget of 2 examples: each shard must replay its stored failure first.
for i in 1 2; do
  timeout 150 python -m kvfence fuzz --device cuda --sizing prefix --shard $i/2 --seed 2 --max-examples 2 \
      --quiet --database "$W/db" --out "$W/night2/shard-$i" > "$OUT/night2_shard$i.log" 2>&1
  echo "night 2 shard $i exit: $?"; cp "$W/night2/shard-$i/summary.json" "$OUT/night2_shard$i.json"
  python -c "import json,sys; d=json.load(open('$OUT/night2_shard$i.json')); c=d['campaign']; print('  stored', c['stored_failures_at_start'], 'examples_to_failure', d['examples_to_failure'], 'cases', list(d['cases']))"
done
python -m kvfence report --merge "$W"/night1/shard-* "$W"/night2/shard-* --out "$W/merged" > "$OUT/merge.log" 2>&1
echo "merge exit: $?"; cat "$OUT/merge.log"; cp "$W/merged/summary.json" "$OUT/merged_summary.json"

# The fuzz rate on the reference (clean, safe sizing): no database vs a directory database, target on/off.
for target in "" "--no-target"; do
  for db in none "$W/rate-db-${target:-target}"; do
    timeout 150 python -m kvfence fuzz --device cuda --seed 3 --max-examples 20000 --max-seconds 60 --jobs 1 \
        $target --database "$db" --quiet --json "$OUT/rate_${target:-target}_$(basename "$db").json" \
        --out "$W/rate" > /dev/null 2>&1
    python -c "import json; d=json.load(open('$OUT/rate_${target:-target}_$(basename "$db").json')); print('target' if '$target' == '' else 'no-target', 'db=$(basename "$db")', d['verified_cases'], 'cases', d['elapsed_s'], 's', d['cases_per_s'], 'verified cases/s')"
  done
done
