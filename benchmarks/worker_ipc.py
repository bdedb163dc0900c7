"""What checking in a worker process costs per small case, against checking in this process.

    python benchmarks/worker_ipc.py --device cuda --json $OUT/worker_ipc.json
    python benchmarks/worker_ipc.py --device cpu --cases 100            # the interpreter: slow, noisy

For ``--cases N`` small cases of one config (the throughput benchmark's small config on CUDA, a tiny
one on the interpreter), after warm-up in both places, medians of ``--reps`` repetitions:

* ``in_process_us``: ``Session.check`` per case in this process;
* ``check_many_us``: ``RemoteSession.check_many`` of the whole list (one message) per case;
* ``check_us``: ``RemoteSession.check`` per case (one message each);
* ``round_trip_us``: ``RemoteSession.round_trip`` per case: the messaging alone (JSON both ways, the
  socket, rebuilding each ``Case`` in the worker), nothing launched;
* ``added_us_many`` = ``check_many_us - in_process_us``: the figure of issue 10 (target <= 10 us).

Also ``worker_start_s``: starting a worker until it is ready (imports, device, kernel resolution).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Small cases as in benchmarks/throughput.py on CUDA; the interpreter gets a tiny config.
CONFIGS = {"cuda": dict(topk=2, num_steps=3, page_size=1, ctx=512, max_bs=16),
           "cpu": dict(topk=2, num_steps=1, page_size=1, ctx=8, max_bs=2)}


def make_cases(device: str, n: int, seed: int):
    from harness.case import Batch, Case, Config

    config = Config(sizing="safe", **CONFIGS[device])
    rng = random.Random(seed)
    out = []
    for i in range(n):
        bs = rng.randint(1, config.max_bs)
        rows = rng.sample(range(config.pool_rows), bs)
        out.append(Case(config, Batch(tuple(rng.randint(1, config.ctx) for _ in range(bs)), tuple(rows), i)))
    return out


def per_case_us(fn, cases, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(cases)
        times.append((time.perf_counter() - t0) / len(cases) * 1e6)
    return round(statistics.median(times), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--cases", type=int, default=None, help="cases per list (default 1000 cuda, 100 cpu)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5 cuda, 3 cpu)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from harness.device import select

    device = select(args.device)
    n = args.cases or (1000 if device == "cuda" else 100)
    reps = args.reps or (5 if device == "cuda" else 3)
    from harness.session import Session
    from harness.worker import RemoteSession

    cases = make_cases(device, n, seed=1)
    local = Session(device, "reference")
    for case in cases:  # warm-up: compiles, captures every bucket's graphs
        assert local.check(case) == [], case
    t0 = time.perf_counter()
    remote = RemoteSession(device, "reference")
    start_s = time.perf_counter() - t0
    with remote:
        remote.check_many(cases)  # the worker's warm-up
        result = {
            "device": device, "cases": n, "reps": reps, "config": CONFIGS[device],
            "worker_start_s": round(start_s, 2),
            "in_process_us": per_case_us(lambda cs: [local.check(c) for c in cs], cases, reps),
            "check_many_us": per_case_us(remote.check_many, cases, reps),
            "check_us": per_case_us(lambda cs: [remote.check(c) for c in cs], cases, reps),
            "round_trip_us": per_case_us(remote.round_trip, cases, reps),
        }
        assert all(r == [] for r in remote.check_many(cases))
    result["added_us_many"] = round(result["check_many_us"] - result["in_process_us"], 1)
    result["added_us_single"] = round(result["check_us"] - result["in_process_us"], 1)
    if device == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
