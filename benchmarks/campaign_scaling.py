"""``kvfence campaign``'s scaling: K shards against one, and against ``fuzz --jobs K`` on the same card.

Two measurements per shard count K (``--shards``, each K on ``--engine local`` unless ``--engine ray``):

* **throughput**: a clean campaign (``--sizing safe``) of K shards for ``--seconds`` of search each; distinct
  configs (the union over the shards, as the merged summary counts them) per second of the campaign's wall time
  (start-up included) and per second of search (the longest shard's ``elapsed_s``);
* **time to the first failure** of a planted bug (``--bug``: on the CPU the prefix sizing, on CUDA a shipped mutant,
  ``--kernel mutant:NAME``), over ``--seeds`` seeds: the earliest shard's ``first_failure_s`` (seconds into its
  command: shards start together), shrinking off.

On CUDA the K shards share one card (``--gpus-per-shard pack``) or take a card each (``--gpus-per-shard 1``, the
multi-GPU scaling); ``--baseline-jobs`` also runs ``kvfence fuzz --jobs K`` for the same seconds on the same card (set
``CUDA_VISIBLE_DEVICES`` to one card: K shards share it, ``--gpus-per-shard 1/K``). Every stage is written to
``--json`` as it ends (``result_file.saver``).

    python benchmarks/campaign_scaling.py --device cpu --shards 1,2 --seconds 30 --seeds 3 \\
        --json benchmarks/results/cpu_campaign_scaling.json
    CUDA_VISIBLE_DEVICES=0 python benchmarks/campaign_scaling.py --device cuda --shards 1,2,4 --seconds 120 \\
        --seeds 3 --bug mutant:off_by_one_n --baseline-jobs --json benchmarks/results/gpu_campaign_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # result_file.py beside it

from result_file import saver  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def kvfence(*args: str) -> tuple:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, capture_output=True, text=True)
    return proc, time.perf_counter() - start


def shard_summaries(out: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted((out / "shards").glob("*/summary.json"))]


def campaign(args, shards: int, out: Path, *flags: str) -> tuple:
    device, engine = args.device, args.engine
    per_shard = f"{1 / shards:g}" if args.gpus_per_shard == "pack" else args.gpus_per_shard
    gpus = [] if device == "cpu" else ["--gpus-per-shard", per_shard]
    engine_flags = ["--engine", "ray", "--address", "local"] if engine == "ray" else ["--parallel", str(shards)]
    proc, wall = kvfence("campaign", "--device", device, "--shards", str(shards), *gpus, *engine_flags, "--quiet",
                         "--out", str(out), *flags)
    require(proc.returncode in (0, 1), proc)
    return json.loads((out / "summary.json").read_text()), wall


def require(ok: bool, proc) -> None:
    if not ok:
        raise SystemExit(f"benchmark: {' '.join(proc.args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")


def throughput(args, shards: int, seed: int, folder: Path) -> dict:
    out = folder / f"throughput-{shards}"
    doc, wall = campaign(args, shards, out, "--sizing", "safe", "--max-seconds",
                         str(args.seconds), "--no-target", "--seed", str(seed))
    search = max(d["elapsed_s"] for d in shard_summaries(out))
    return {"what": "campaign", "shards": shards, "seed": seed, "wall_s": round(wall, 2), "search_s": search,
            "examples": doc["examples"], "distinct_configs": doc["distinct_configs"],
            "distinct_configs_per_wall_s": round(doc["distinct_configs"] / wall, 3),
            "distinct_configs_per_search_s": round(doc["distinct_configs"] / search, 3),
            "statuses": [r["status"] for r in doc["shards"]]}


def jobs_baseline(args, jobs: int, seed: int, folder: Path) -> dict:
    out = folder / f"jobs-{jobs}"
    proc, wall = kvfence("fuzz", "--device", args.device, "--jobs", str(jobs), "--sizing", "safe", "--max-seconds",
                         str(args.seconds), "--no-target", "--seed", str(seed), "--quiet", "--out", str(out))
    require(proc.returncode in (0, 1), proc)
    doc = json.loads((out / "summary.json").read_text())
    return {"what": "fuzz --jobs", "jobs": jobs, "seed": seed, "wall_s": round(wall, 2), "search_s": doc["elapsed_s"],
            "examples": doc["examples"], "distinct_configs": doc["distinct_configs"],
            "distinct_configs_per_wall_s": round(doc["distinct_configs"] / wall, 3),
            "distinct_configs_per_search_s": round(doc["distinct_configs"] / doc["elapsed_s"], 3)}


def first_failure(args, shards: int, seed: int, folder: Path) -> dict:
    out = folder / f"failure-{shards}-{seed}"
    bug = ["--sizing", "prefix"] if args.bug == "prefix" else ["--kernel", args.bug]
    doc, wall = campaign(args, shards, out, *bug, "--max-seconds", str(args.seconds),
                         "--shrink-seconds", "0", "--seed", str(seed))
    times = [d["first_failure_s"] for d in shard_summaries(out) if d.get("first_failure_s") is not None]
    return {"shards": shards, "seed": seed, "bug": args.bug, "found": bool(times),
            "first_failure_s": round(min(times), 3) if times else None, "shards_that_found": len(times),
            "wall_s": round(wall, 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    parser.add_argument("--shards", default="1,2", help="shard counts, e.g. 1,2,4")
    parser.add_argument("--seconds", type=float, default=30.0, help="search budget of each shard")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the time-to-failure runs")
    parser.add_argument("--bug", default="prefix", help="prefix (the sizing) or a kernel spec, e.g. mutant:NAME")
    parser.add_argument("--gpus-per-shard", default="pack",
                        help="CUDA: pack (K shards share one card, 1/K each) or a number, e.g. 1 (a card a shard)")
    parser.add_argument("--baseline-jobs", action="store_true", help="also fuzz --jobs K (CUDA)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.shards.split(",")]
    # The machine's load when it started and ended: shards on a shared 2-core machine compete with whatever else runs.
    result = {"device": args.device, "engine": args.engine, "seconds": args.seconds, "bug": args.bug,
              "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(), "throughput": [], "first_failure": [],
              "summary": {}}
    save = saver(args.json, result)
    with tempfile.TemporaryDirectory(prefix="campaign-scaling-") as tmp:
        folder = Path(tmp)
        for shards in counts:
            result["throughput"].append(throughput(args, shards, 1, folder))
            save()
            if args.baseline_jobs:
                result["throughput"].append(jobs_baseline(args, shards, 1, folder))
                save()
        for shards in counts:
            for seed in range(1, args.seeds + 1):
                result["first_failure"].append(first_failure(args, shards, seed, folder))
                save()
    for shards in counts:
        times = [r["first_failure_s"] for r in result["first_failure"] if r["shards"] == shards and r["found"]]
        rate = next(r for r in result["throughput"] if r.get("shards") == shards)
        result["summary"][str(shards)] = {
            "distinct_configs_per_wall_s": rate["distinct_configs_per_wall_s"],
            "distinct_configs_per_search_s": rate["distinct_configs_per_search_s"],
            "first_failure_s_median": round(statistics.median(times), 3) if times else None,
            "found": f"{len(times)}/{args.seeds}"}
    result["load_average_at_end"] = os.getloadavg()
    save()
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
