#!/usr/bin/env bash
# Every GPU benchmark and GPU check of kvfence, one part at a time or all in a row. From the repository root
# of an installed checkout (pip install -e ".[test]" with the machine's CUDA torch):
#
#   bash benchmarks/gpu.sh                 # every part, in the order below
#   bash benchmarks/gpu.sh throughput tests   # only these parts
#
# Results go to $RESULTS (default benchmarks/results/, the files BENCHMARKS.md quotes); logs to $LOGS
# (default reports/out/gpu-logs/, not in git). Each part is capped with `timeout` so it fits one 10-minute call
# of a lent GPU machine; the caps are in the table below. A part's exit code is printed as "PART rc=N".
#
#   part             seconds  writes ($RESULTS/)                 what
#   throughput       560      h200.json, h200_scale_mutants.json parent, check_small, large, the 60 s fuzz runs; scale mutants
#   verify-variants  120      h200_verify_final.json             the shipped device verifier's per-pass timings
#   verifiers        560      h200_verifiers_seed{3,4,5}.json    mutants --verifiers both, seeds 3-5 at once: the two verifiers agree
#   mutants          450      h200_mutants.json                  the mutation self-test on the GPU domain
#   family           560      h200_family_mutants.json           the §6 mutants on the GPU domain
#   nightly          560      h200_nightly.json                  the sweep: safe exits 0, prefix 1; detection matrix
#   sanitizer-clean  560      h200_sweep_clean.json              clean cases under each compute-sanitizer tool
#   worker           300      h200_worker_ipc.json, h200_worker_restart.json   worker messaging and restarts
#   crash            200      h200_crash_run_summary.json        fuzz --keep-going over a kernel that faults
#   crash-budget     560      h200_crash_budget.json             every multi-request case faults: budgets hold,
#                                                                 the crash shrinks (20 s; the default 60 s, 2 seeds)
#   upstream         530      h200_upstream_matrix.json          the release matrix (needs upstream-cache/, below)
#   tests            300      (log only)                         pytest -n auto, no flags: the whole suite
#   contracts        560      h200_contract_mutants_*.json       the table contracts' self-tests (docs/contract.md §9),
#                                                                 20 seeds, each contract's own budget
#                                                                 (Contract.selftest_examples), side by side;
#                                                                 CONTRACTS="..." picks them (two calls: the three
#                                                                 page/metadata ones, then req-to-token slot-mapping)
#   default-run      120      h200_default_run.json              the plain `kvfence fuzz --device cuda` (60 s, every core):
#                                                                 examples, distinct configs, structural rate
#   contract-jobs    330      h200_contract_jobs.json            each table contract's SGLang 0.5.23 kernel with the
#                                                                 default --jobs, safe (clean) and context (caught)
#   contract-shipped 200      h200_contract_shipped_matrix.json  the plug-in contracts under each release's own widths
#                                                                over 20 seeds, SGLang 0.5.23's kernels (needs
#                                                                contract-cache/, below), compiled, CUDA graphs
#   first-verdict    420      h200_first_verdict.json            benchmarks/first_verdict.py: the first printed finding
#                                                                 of `fuzz --sizing prefix` over the CUDA floor, 3 runs,
#                                                                 3 without the lead's head start, 3 each at --jobs 4
#                                                                 and 8 ($FIRST_VERDICT_FILE names the file: a second
#                                                                 sitting's)
#   scale-mutants    400      h200_mutants_gpu_domain.json       the scale and page-1 mutants through their declared
#                                                                 kinds, 2 seeds, reference clean on both domains
#   kill-all         570      $KILL_TIME_FILE                    benchmarks/kill_time.py --part all --budget $KILL_CALL_S
#                                (default h100_kill_time.json)      (default 550) --resume: every part of the one kill-time
#                                                                 file that fits the call, the last plain part cut and
#                                                                 resumed by the next; run it again on the same code
#                                                                 until its log's last line says every part is complete
#                                                                 (not in the default list)
#   kill-PART        560      $KILL_TIME_FILE                    one part of it: PART is draft, pages, r2t-slot,
#                                                                 fa3-rail, dsv4, first-verdict, verifiers-0-4,
#                                                                 verifiers-5-9
#                                                                 (not in the default list; a cut part resumes when run
#                                                                 again, a complete one is skipped)
#   kill-time-bulk   560      h200_kill_time_bulk.json           the draft's and the rail's kill time, 4 seeds, beside
#                                                                each mutant with the bulk on
#                                                                (--compare-bulk 256): whether the bulk kills sooner
#   plain-mutants    560      h200_plain_fuzz_mutants.json       the plain fuzz command per mutant and seed, one
#                                                                run per GPU, or 8 sharing one GPU (not in the
#                                                                default list; run it again to resume a cut file of this
#                                                                code)
#
# upstream: the GPU machine has no network, so the extracted kernels travel in upstream-cache/, filled on a
# machine with network: KVFENCE_CACHE=upstream-cache kvfence upstream matrix --fetch-only --versions "$VERSIONS"
# contract-jobs and contract-shipped: likewise contract-cache/, filled by one CPU run per contract of
# KVFENCE_CACHE=contract-cache kvfence fuzz --contract C --kernel sglang==0.5.23 --device cpu --max-examples 1
# kill-all, kill-PART and contracts: the release-text mutants of the table contracts (sglang 0.5.23 and
# 0.5.3.post3; dsv4-topk-indices: vllm 0.34.0) in contract-cache/ too, filled by one CPU run per contract of
# KVFENCE_CACHE=contract-cache kvfence mutants --contract C --device cpu --max-examples 1 (its verdict aside)
set -u
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
RESULTS=${RESULTS:-benchmarks/results}
LOGS=${LOGS:-reports/out/gpu-logs}
VERSIONS=${VERSIONS:-0.4.0,0.4.2,0.4.3,0.4.5,0.4.8,0.4.10,0.5.1..0.5.23}
ALL="throughput verify-variants verifiers mutants family nightly sanitizer-clean worker crash crash-budget upstream tests default-run contracts contract-jobs contract-shipped first-verdict scale-mutants"
KILL_PARTS="draft pages r2t-slot fa3-rail dsv4 first-verdict verifiers-0-4 verifiers-5-9"
EXTRA="plain-mutants kill-time-bulk kill-all $(for p in $KILL_PARTS; do printf 'kill-%s ' "$p"; done)"
mkdir -p "$RESULTS" "$LOGS"

run_throughput() {
  # benchmarks/throughput.py's H200_COMMAND (the whole h200.json from one run), then the scale mutants apart.
  timeout 420 python benchmarks/throughput.py --device cuda --only small,naive,parent,check_small,large,runs \
    --json "$RESULTS/h200.json" > "$LOGS/throughput.txt" 2>&1 || return $?
  timeout 140 python benchmarks/throughput.py --device cuda --only scale --json "$RESULTS/h200_scale_mutants.json" \
    >> "$LOGS/throughput.txt" 2>&1
}

run_verify_variants() {
  timeout 120 python benchmarks/verify_variants.py --json "$RESULTS/h200_verify_final.json" --only shipped \
    > "$LOGS/verify_variants.txt" 2>&1
}

run_verifiers() {
  # One command per results file, the seeds side by side (each process mostly Python: one thread each). Three
  # fit one 560 s call; ten at once on the H200's 16 cores overran it (3 of 10 finished): run other seeds as
  # VERIFIER_SEEDS="6 7 8" in a call of their own.
  local s rc=0 seeds=${VERIFIER_SEEDS:-3 4 5}
  for s in $seeds; do
    OMP_NUM_THREADS=1 timeout "${VERIFIER_SECONDS:-560}" kvfence mutants --device cuda --verifiers both --max-examples 2 --seed "$s" \
      --json "$RESULTS/h200_verifiers_seed$s.json" > "$LOGS/verifiers$s.txt" 2>&1 &
  done
  for s in $seeds; do wait -n || rc=1; done
  return $rc
}

run_mutants() {
  timeout 450 kvfence mutants --device cuda --json "$RESULTS/h200_mutants.json" > "$LOGS/mutants.txt" 2>&1
}

run_family() {
  timeout 560 kvfence mutants --device cuda --seeds 2 --max-examples 60 --json "$RESULTS/h200_family_mutants.json" \
    --only window_offsets_unclipped window_sinks_dropped window_recent_off_by_one entry_page_no_offset \
           translate_page_unscaled translate_negative_unclipped rail_prefix_from_start rail_chain_from_zero \
           rail_indptr_without_chain sizing_window_no_topk > "$LOGS/family.txt" 2>&1
}

run_nightly() {
  timeout 560 python benchmarks/nightly.py --out "$LOGS/nightly" --json "$RESULTS/h200_nightly.json" \
    --max-examples 300 --jobs 4 --timeout 120 > "$LOGS/nightly.txt" 2>&1
}

# Clean reference cases (eager with the caching allocator off, graph with it on) under each tool, then kvfence's
# own sweep over them, which must exit 0: a correct kernel leaves the sanitizer with nothing to report.
run_sanitizer_clean() {
  local dir="$LOGS/sanitizer-clean"
  mkdir -p "$dir"
  CLEAN="$dir" python - <<'PY' || return 1
import os
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine.casefile import write_case
for mode in ("eager", "graph"):
    case = Case(Config(topk=4, num_steps=3, ctx=64, max_bs=4, mode=mode, sizing="safe"),
                Batch((64, 40, 17, 64), (0, 1, 2, 3), 5))
    print(write_case(launch_of(case), [], out_dir=os.environ["CLEAN"], device="cuda", source="gpu.sh"))
PY
  timeout 500 kvfence sweep --cases "$dir/cases" --jobs 4 --timeout 150 --out "$dir/sweep" > "$dir/sweep.txt" 2>&1
  local rc=$?
  cp "$dir/sweep/sweep.json" "$RESULTS/h200_sweep_clean.json" 2>/dev/null
  return $rc
}

run_worker() {
  timeout 200 python benchmarks/worker_ipc.py --device cuda --json "$RESULTS/h200_worker_ipc.json" \
    > "$LOGS/worker_ipc.txt" 2>&1 || return $?
  timeout 100 python benchmarks/worker_restart.py --device cuda --crashes 3 --gap 1.0 \
    --json "$RESULTS/h200_worker_restart.json" > "$LOGS/worker_restart.txt" 2>&1
}

# A kernel that faults on page size 3 configs: the run must go on past each crash and exit 1 with its CRASH.
run_crash() {
  timeout 200 kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_3 --mode eager --scale cpu \
    --jobs 1 --topk 2 --num-steps 2 --ctx 8 --max-bs 2 --seed 1 --keep-going --max-examples 1000000 \
    --max-seconds 90 --shrink-seconds 45 --quiet --out "$LOGS/crash_run" > "$LOGS/crash.txt" 2>&1
  local rc=$?
  cp "$LOGS/crash_run/summary.json" "$RESULTS/h200_crash_run_summary.json" 2>/dev/null
  [ "$rc" -eq 1 ]
}

# Every case of two or more requests faults: the budgets (40 s exploring, 20 s shrinking) hold within a
# worker restart with and without --keep-going, and the crash shrinks (the minimal case has 2 requests);
# then the same with the default shrink budget (60 s), seeds 1 and 2, which must reach the minimal case.
run_crash_budget() {
  local how rc=0
  : > "$LOGS/crash_budget_walls.txt"
  for how in first keep-going default-shrink-1 default-shrink-2; do
    local flag=(--shrink-seconds 20) seed=1 t0=$SECONDS
    [ "$how" = keep-going ] && flag+=(--keep-going)
    case $how in default-shrink-*) flag=(); seed=${how##*-} ;; esac
    timeout 200 kvfence fuzz --device cuda --kernel tests/targets/far_store.py:fault_on_two "${flag[@]}" \
      --max-seconds 40 --jobs 2 --seed "$seed" --quiet --out "$LOGS/crash_budget_$how" \
      > "$LOGS/crash_budget_$how.txt" 2>&1
    echo "$how $? $((SECONDS - t0)) $seed" >> "$LOGS/crash_budget_walls.txt"
  done
  python - "$LOGS" "$RESULTS/h200_crash_budget.json" <<'PY' || rc=1
import json, sys
from pathlib import Path
logs, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for line in (logs / "crash_budget_walls.txt").read_text().splitlines():
    how, rc, wall, seed = line.split()
    folder = logs / f"crash_budget_{how}"
    summary = json.loads((folder / "summary.json").read_text())
    cases = [record["batch"]["seq_lens"] for record in summary.get("cases", {}).values()]
    workers = [json.loads(f.read_text()).get("worker") or {} for f in sorted(folder.glob("jobs/job-*/summary.json"))]
    runs[how] = {"exit": int(rc), "wall_s": int(wall), "seed": int(seed), "max_seconds": 40,
                 "shrink_seconds": 60 if how.startswith("default") else 20,
                 "kinds": sorted({f["kind"] for f in summary["findings"]}), "verified_cases": summary["verified_cases"],
                 "elapsed_s": summary["elapsed_s"], "first_failure_s": summary.get("first_failure_s"),
                 "requests_per_case": [len(s) for s in cases],
                 "worker": {k: sum(w.get(k, 0) for w in workers) for k in ("deaths", "worker_starts", "spares_used", "warm_ups")}}
from kvfence.provenance import stamped
json.dump(stamped({"kernel": "tests/targets/far_store.py:fault_on_two", "runs": runs}), out.open("w"), indent=1)
print(json.dumps(runs))
assert all(r["exit"] == 1 and r["kinds"] == ["CRASH"] for r in runs.values()), runs
PY
  return $rc
}

run_upstream() {
  KVFENCE_OFFLINE=1 KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/upstream-cache} timeout -s TERM 530 kvfence upstream matrix \
    --versions "$VERSIONS" --sizing prefix,fixed,safe,window-fixed,window-no-topk --contracts draft,window-rail \
    --device cuda --offline --max-examples 30 --jobs 8 --seed 0 --shrink-seconds 5 --cell-timeout 150 \
    --out "$LOGS/upstream-matrix" --json "$RESULTS/h200_upstream_matrix.json" > "$LOGS/upstream.txt" 2>&1
}

# benchmarks/plain_fuzz_mutants.py, the plain command per mutant and seed: on a node of several GPUs one run per
# GPU on its own cores; on a one-GPU machine PLAIN_PARALLEL runs (default 8) share GPU 0, each on its own cores
# (so each run's default --jobs is what a machine of that many cores gets) and its share of the GPU's memory
# (--max-gpu-mem PLAIN_MEM, default 10G: 60% of an H200's 139 GiB over 8, what the default gives one job of a
# run of 8 jobs; the default of one job, 60% of all, taken by 8 runs at once would not fit). No run starts
# after PLAIN_START_S (default 400) seconds and each stops at 120 s, so the part ends inside its cap.
# Seed-major, so a cut leaves every mutant with about as many of the SEEDS (default 20) seeds; running the
# part again resumes an incomplete file of this code (only the runs it lacks).
# Whether results file $1 is a cut plain_fuzz_mutants file of this very code (then the part resumes it; a file of
# other code is measured again, not continued).
cut_by_this_code() {
  python - "$1" <<'PY'
import json, sys
from kvfence.provenance import code_stamp
doc = json.load(open(sys.argv[1]))
sys.exit(not (doc.get("complete") is False and (doc.get("code") or {}).get("digest") == code_stamp()["digest"]))
PY
}

run_plain_mutants() {
  local file="$RESULTS/h200_plain_fuzz_mutants.json" gpus parallel where=() resume=() shared=()
  gpus=$(nvidia-smi -L | grep -c '^GPU ')
  if [ "$gpus" -gt 1 ]; then
    parallel=$gpus
  else
    parallel=${PLAIN_PARALLEL:-8}
    where=(--gpus "$(python -c "print(','.join(['0'] * $parallel))")")
    shared=(-- --max-gpu-mem "${PLAIN_MEM:-10G}")
  fi
  if [ -f "$file" ] && cut_by_this_code "$file"; then
    resume=(--resume "$file")
  fi
  timeout 560 python benchmarks/plain_fuzz_mutants.py --device cuda --parallel "$parallel" "${where[@]}" \
    --seeds "${SEEDS:-20}" --reference-seeds 1 --max-seconds "${PLAIN_START_S:-400}" --run-timeout 120 \
    "${resume[@]}" --json "$file" "${shared[@]}" > "$LOGS/plain_mutants.txt" 2>&1
}

run_contracts() {
  # Each table contract's self-test (reference + planted mutants, 20 seeds, each on its domain, CUDA graphs), side
  # by side (each one checking worker), at the contract's own budget per domain (Contract.selftest_examples: a
  # CPU-domain bug gets the CPU domain's 60 examples on CUDA too, a GPU-domain one 16).
  local c rc=0
  for c in ${CONTRACTS:-flashmla-page-table trtllm-mha-page-table fa3-decode-metadata}; do
    KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/contract-cache} KVFENCE_OFFLINE=1 \
      timeout "${CONTRACT_SECONDS:-560}" kvfence mutants --contract "$c" --device cuda --seeds 20 --quiet \
      --json "$RESULTS/${CONTRACT_PREFIX:-h200}_contract_mutants_$c.json" > "$LOGS/contracts_$c.txt" 2>&1 &
  done
  for c in ${CONTRACTS:-flashmla-page-table trtllm-mha-page-table fa3-decode-metadata}; do wait -n || rc=1; done
  return $rc
}

run_default_run() {
  # The plain GPU command as a user runs it (default jobs, 8 Hypothesis batches per example, no bulk), 60 s.
  timeout 120 kvfence fuzz --device cuda --max-seconds 60 --seed 1 --quiet --out "$LOGS/default-run" \
    --json "$RESULTS/h200_default_run.json" > "$LOGS/default_run.txt" 2>&1
}

run_contract_jobs() {
  # Each table contract through the same pipeline as the draft kernel: SGLang 0.5.23's kernel (contract-cache/),
  # the default --jobs (every core), 20 s of search; safe must be clean, context caught and shrunk.
  local c z rc=0
  for c in flashmla-page-table trtllm-mha-page-table fa3-decode-metadata; do
    for z in safe context; do
      KVFENCE_CACHE=$PWD/contract-cache KVFENCE_OFFLINE=1 timeout 90 kvfence fuzz --contract "$c" \
        --kernel sglang==0.5.23 --device cuda --sizing "$z" --max-seconds 20 --shrink-seconds 10 --seed 0 --quiet \
        --out "$LOGS/contract-jobs/$c-$z" > "$LOGS/contract_jobs_$c-$z.txt" 2>&1
      local got=$?
      [ "$z" = safe ] && [ "$got" -ne 0 ] && rc=1
      [ "$z" = context ] && [ "$got" -ne 1 ] && rc=1
    done
  done
  python - "$LOGS/contract-jobs" "$RESULTS/h200_contract_jobs.json" <<'PY' || rc=1
import json, sys
from pathlib import Path
runs = {}
for folder in sorted(Path(sys.argv[1]).iterdir()):
    s = json.loads((folder / "summary.json").read_text())
    runs[folder.name] = dict({k: s.get(k) for k in ("contract", "kernel", "sizing", "device", "mode", "jobs", "examples",
                              "verified_cases", "structural_cases", "distinct_configs", "elapsed_s", "first_failure_s",
                              "ended_by")}, kinds=sorted({f["kind"] for f in s["findings"]}),
                        cases=[c["describe"] for c in s["cases"].values()])
from kvfence.provenance import stamped
json.dump(stamped({"runs": runs}), open(sys.argv[2], "w"), indent=1)
PY
  return $rc
}

run_contract_shipped() {
  # Every release in contract-cache/ (kernels and shipped records, filled by the CPU command of the same name)
  # under its backends' own table widths, each witness launched compiled (graph sites in a CUDA graph).
  KVFENCE_CACHE=contract-cache KVFENCE_OFFLINE=1 timeout 200 kvfence upstream matrix --shipped \
    --contracts flashmla-page-table,trtllm-mha-page-table,fa3-decode-metadata --versions "${SHIPPED_VERSIONS:-0.4.6.post1..0.5.23}" \
    --device cuda --out reports/out/h200-contract-shipped --json "$RESULTS/h200_contract_shipped_matrix.json" \
    > "$LOGS/contract_shipped.txt" 2>&1
  [ $? -le 1 ]  # 1: overflows found, as the CPU run of the same releases says
}

run_first_verdict() {
  # The default lead head start, and beside it (interleaved) the lead without one: the evidence for it; and
  # 4 and 8 jobs (CUDA contexts on the one GPU) beside the default's one per core less one.
  timeout 420 python benchmarks/first_verdict.py --device cuda --repeats 3 --head-starts 0 --jobs-list 4,8 \
    --json "$RESULTS/${FIRST_VERDICT_FILE:-h200_first_verdict.json}" > "$LOGS/first_verdict.txt" 2>&1
}

run_scale_mutants() {
  # Alone on the GPU: beside the verifiers part it did not finish in 200 s.
  timeout 400 kvfence mutants --device cuda --seeds 2 --only copy_first_block_only prefix_sum_16_lanes \
    indptr_sum_64_branches page_last_capped_64 page1_step_major_drafts --json "$RESULTS/h200_mutants_gpu_domain.json" \
    > "$LOGS/scale_mutants.txt" 2>&1
}

# Time to a kill: the plain default command per shipped mutant, 8 runs sharing one GPU (2 cores, --jobs 2 each),
# search time (first failure less the first worker ready) over $2 seeds into $1, with plain_fuzz_mutants.py's
# further flags after them; a cut file of this code is resumed.
kill_time() {
  local file="$RESULTS/$1" seeds=$2 resume=()
  shift 2
  if [ -f "$file" ] && cut_by_this_code "$file"; then
    resume=(--resume "$file")
  fi
  timeout "${KILL_SECONDS:-560}" python benchmarks/plain_fuzz_mutants.py --device cuda --parallel 8 \
    --gpus 0,0,0,0,0,0,0,0 --seeds "$seeds" --reference-seeds 0 --max-seconds "$(( ${KILL_SECONDS:-560} - 60 ))" \
    --run-timeout 40 --json "$file" "${resume[@]}" "$@" -- --jobs 2 --max-seconds 15 --max-gpu-mem 10G \
    > "$LOGS/${file##*/}.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 3 ] && return 0  # cut (INCOMPLETE): the file holds the seeds run so far; run the part again
  return $rc
}

# benchmarks/kill_time.py, one part a call, every part into one file ($KILL_TIME_FILE); a cut part resumes. The
# table contracts' release-text mutants are built from SGLang's wheels, read offline from contract-cache/ (below).
kill_part() {
  KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/contract-cache} KVFENCE_OFFLINE=1 timeout 560 python benchmarks/kill_time.py \
    --device cuda --part "$1" --resume --json "$RESULTS/${KILL_TIME_FILE:-h100_kill_time.json}" \
    > "$LOGS/kill_$1.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 3 ] && return 0  # cut (INCOMPLETE): the file holds what ran; run the part again
  return $rc
}
for p in $KILL_PARTS; do eval "run_kill_${p//-/_}() { kill_part $p; }"; done

run_kill_all() {
  # Every part that fits one call: the budget leaves 20 s to the timeout and the machine's call its margin.
  local budget=${KILL_CALL_S:-550}
  KVFENCE_CACHE=${KVFENCE_CACHE:-$PWD/contract-cache} KVFENCE_OFFLINE=1 timeout $((budget + 20)) \
    python benchmarks/kill_time.py --device cuda --part all --budget "$budget" --resume \
    --json "$RESULTS/${KILL_TIME_FILE:-h100_kill_time.json}" > "$LOGS/kill_all.txt" 2>&1
  local rc=$?
  tail -n 1 "$LOGS/kill_all.txt"
  [ "$rc" -eq 3 ] && return 0  # parts left for the next call (the log's last line names them)
  return $rc
}

run_kill_time_bulk() {
  # The default (no bulk) beside the bulk on (256 batches per example, opened after the default 5 s), 4 seeds.
  kill_time h200_kill_time_bulk.json 4 --compare-bulk 256
}

run_tests() {
  # The whole suite as a user runs it (no flags): on a GPU machine the plugin's default device is cuda.
  timeout 300 python -m pytest -n auto -q -p no:cacheprovider > "$LOGS/tests.txt" 2>&1
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python -c "import torch, triton, numpy, hypothesis; print('torch', torch.__version__, 'triton', triton.__version__, \
'numpy', numpy.__version__, 'hypothesis', hypothesis.__version__)"
status=0
for part in ${*:-$ALL}; do
  case " $ALL $EXTRA " in *" $part "*) ;; *) echo "gpu.sh: unknown part $part (parts: $ALL $EXTRA)" >&2; exit 2 ;; esac
  start=$SECONDS
  "run_${part//-/_}"
  rc=$?
  echo "$part rc=$rc ($((SECONDS - start)) s; log under $LOGS)"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
