"""What a campaign costs the fuzz loop: sharding and the example database, without any kernel.

The session is a stub that checks nothing (every case passes), so the rate is Hypothesis generation
plus kvfence's per-example bookkeeping: the ceiling the GPU path runs against (BENCHMARKS.md: about
1300 verified cases/s on an H200). Compares: no shard and no database (the old default), ``--shard 3/8``,
a directory database, and Redis when ``--redis URL`` is given, each with and without the target
phase. The variants take turns, ``--repeat`` rounds with the same seeds; the median is reported, in
cases per CPU second of the fuzzing process.

    python benchmarks/campaign_overhead.py --examples 2000 [--redis redis://127.0.0.1:6379/0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvfence.provenance import stamped

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # result_file.py beside it


class NullSession:
    """Every case is clean: measures everything but the kernel and the verdict."""

    stats: dict = {}

    def check(self, case):
        return []


def run(variant: str, examples: int, seed: int, targeting: bool, redis_url, folder: Path) -> float:
    from result_file import draft_launches

    from kvfence.contracts.draft.strategies import cases, configs
    from kvfence.engine import campaign
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    shard = campaign.Shard(3, 8) if variant == "shard 3/8" else None
    if shard is not None:
        from kvfence.engine import registry
        from kvfence.engine.run import shard_fields

        draft = registry.get("draft")
        config_strategy, _ = campaign.shard_draws(shard, lambda **pins: configs(**pins),
                                                  shard_fields(draft, RunPlan(contract=draft.name)), draft.name)
    else:
        config_strategy = configs()
    database = None
    if variant == "directory db":
        database = campaign.open_database(campaign.parse_database(str(folder / f"db-{seed}")))
    elif variant == "redis db":
        database = campaign.open_database(campaign.parse_database(redis_url))
    key = campaign.database_key(kernel="reference", sizing="safe", domain={"bench": variant, "seed": seed,
                                                                         "t": time.time()})
    # CPU seconds of this process (the Redis server's are not counted, its round trips are): on a
    # machine shared with other jobs, wall time mostly measures the neighbours.
    start = time.process_time()
    result = fuzz(NullSession(), draft_launches(cases(config_strategy)),
                  RunPlan(max_examples=examples, seed=seed, targeting=targeting), database=database, database_key=key)
    return result.examples / (time.process_time() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis", default=None, help="redis://HOST:PORT/DB to include the Redis database")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = ["baseline", "shard 3/8", "directory db"] + (["redis db"] if args.redis else [])
    rates = {(v, t): [] for t in (False, True) for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        run("baseline", 50, 0, True, None, Path(tmp))  # imports and first-use costs, outside the timing
        # Round-robin over the variants, so drifting load on a shared machine hits them all alike.
        for seed in range(args.repeat):
            for variant, targeting in rates:
                rates[variant, targeting].append(run(variant, args.examples, seed, targeting, args.redis, Path(tmp)))
    rows = []
    for (variant, targeting), values in rates.items():
        rows.append({"variant": variant, "targeting": targeting, "examples": args.examples,
                     "cases_per_cpu_s_median": round(statistics.median(values), 1),
                     "cases_per_cpu_s": [round(r, 1) for r in values]})
        median = rows[-1]["cases_per_cpu_s_median"]
        print(f"{variant:13s} target={'on ' if targeting else 'off'} {median:8.1f} cases/cpu-s  "
              f"(runs: {rows[-1]['cases_per_cpu_s']})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(stamped({"rows": rows}), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
