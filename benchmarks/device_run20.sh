#!/usr/bin/env bash
# GPU run 20 (diagnostic, alone on the GPU): where check_us_small's time goes (issue 9). The check path on
# the pinned config's pre-drawn cases, as throughput.check_small, timed three ways: wall time per case;
# GPU time per case (CUDA events around each batch's replays); host time per case until the read-back
# (the enqueue); then the same loop under cProfile (top functions by own time).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 150 python - "$OUT/h200_check_small_profile.json" > "$OUT/h200_check_small_profile.txt" 2>&1 <<'PY'
import cProfile, io, json, pstats, sys, time
sys.path.insert(0, "benchmarks")
import torch
import throughput as t
from hypothesis import HealthCheck, Phase, given, settings
from kvfence.strategies import case_runs, configs
from kvfence.verifying.session import Session

drawn = []
@settings(max_examples=128, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(case_runs(configs(sizing="safe", **t.SMALL), max_batches=32))
def collect(runs):
    drawn.append(runs)
collect()
session = Session("cuda", "reference")
for runs in drawn[:4]:
    session.check_many(runs)
total = sum(len(r) for r in drawn)
out = {"cases": total, "batches": len(drawn)}
walls = []
for rep in range(3):
    t0 = time.perf_counter()
    for runs in drawn:
        assert all(f == [] for f in session.check_many(runs))
    walls.append((time.perf_counter() - t0) / total * 1e6)
out["wall_us_per_case"] = [round(x, 1) for x in walls]
# One batch as DeviceVerifier.total_counters runs it (graphs already captured), behind a 20 ms GPU sleep so
# the host queues the whole batch first: GPU time between events around the replays (back to back, the
# GPU's own cost), host time until the last replay is queued (the read-back waits after).
verifier = next(iter(session._device_verifiers.values()))
g, h = 0.0, 0.0
for runs in drawn:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)
    t0 = time.perf_counter()
    start.record()
    launches = [c.launch() for c in runs]
    verifier.counts.zero_()
    rows = torch.tensor([verifier._staged(c, lb) for c, lb in zip(runs, launches)], dtype=torch.int64)
    verifier.rows_host[:len(runs)].copy_(rows)
    verifier.rows[:len(runs)].copy_(verifier.rows_host[:len(runs)], non_blocking=True)
    verifier.cursor.zero_()
    for lb in launches:
        verifier.fused[lb.num_seqs]()
    end.record()
    h += time.perf_counter() - t0
    counts = verifier.counts.tolist()
    assert not any(counts), counts
    g += start.elapsed_time(end) * 1e3
out["gpu_us_per_case"] = round(g / total, 1)
out["host_enqueue_us_per_case"] = round(h / total * 1e6, 1)
prof = cProfile.Profile()
prof.enable()
for runs in drawn:
    session.check_many(runs)
prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
out["profile_top"] = s.getvalue()[:6000]
open(sys.argv[1], "w").write(json.dumps(out, indent=1))
print({k: v for k, v in out.items() if k != "profile_top"})
print(out["profile_top"])
PY
echo "profile rc=$?"; head -60 "$OUT/h200_check_small_profile.txt" | cut -c1-180
