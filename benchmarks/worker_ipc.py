"""What checking in a worker process costs per small case, against checking in this process.

    python benchmarks/worker_ipc.py --device cuda --json $OUT/worker_ipc.json
    python benchmarks/worker_ipc.py --device cpu --cases 100            # the interpreter: slow, noisy

For ``--cases N`` small cases of one config (the throughput benchmark's small config on CUDA, a tiny
one on the interpreter), after warm-up in both places, medians of ``--reps`` repetitions:

* ``in_process_us``: ``Session.check`` per case in this process;
* ``check_many_us``: ``RemoteSession.check_many`` of the whole list (one message) per case;
* ``check_us``: ``RemoteSession.check`` per case (one message each);
* ``round_trip_us``: ``RemoteSession.round_trip`` per case: the messaging alone (JSON both ways, the
  socket, rebuilding each launch in the worker), nothing launched;
* ``added_us_many`` = ``check_many_us - in_process_us``: the figure of issue 10 (target <= 10 us).

Also ``worker_start_s``: starting a worker until it is ready (imports, device, kernel resolution).

Prints one JSON line (exit 0); on any failure the line carries ``error`` and what was measured before
it (exit 1). ``--json`` is written after every stage, so a time limit keeps what was measured.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from result_file import saver  # noqa: E402

#: Small cases as in benchmarks/throughput.py on CUDA; the interpreter gets a tiny config.
CONFIGS = {"cuda": dict(topk=2, num_steps=3, page_size=1, ctx=512, max_bs=16),
           "cpu": dict(topk=2, num_steps=1, page_size=1, ctx=8, max_bs=2)}


def make_cases(device: str, n: int, seed: int):
    """``n`` launches of the draft contract (what a checker and a checking worker take), of one config."""
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of

    config = Config(sizing="safe", **CONFIGS[device])
    rng = random.Random(seed)
    out = []
    for i in range(n):
        bs = rng.randint(1, config.max_bs)
        rows = rng.sample(range(config.pool_rows), bs)
        out.append(launch_of(Case(config, Batch(tuple(rng.randint(1, config.ctx) for _ in range(bs)), tuple(rows),
                                                i))))
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
    parser.add_argument("--json", default=None, help="also write the result here (after every stage)")
    args = parser.parse_args()
    result = {"benchmark": "worker_ipc"}

    save = saver(args.json, result)

    code = 0
    try:
        code = measure(args, result, save)
    except Exception as exc:  # noqa: BLE001 - one JSON line saying what went wrong, never a lost run
        import traceback

        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
        result["traceback"] = traceback.format_exc()[-2000:]
        code = 1
    save()
    print(json.dumps(result, separators=(",", ":")))
    return code


def measure(args, result: dict, save) -> int:
    from kvfence.device import select

    device = select(args.device)
    n = args.cases or (1000 if device == "cuda" else 100)
    reps = args.reps or (5 if device == "cuda" else 3)
    result.update(device=device, cases=n, reps=reps, config=CONFIGS[device])
    if device == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name()
    from kvfence.contracts.draft.session import Session
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.supervisor import RemoteSession

    cases = make_cases(device, n, seed=1)
    local = Session(device, "reference")
    dirty = [i for i, case in enumerate(cases) if local.check(case)]  # warm-up: compiles, every bucket's graphs
    if dirty:
        raise RuntimeError(f"the reference kernel failed {len(dirty)} of the benchmark's cases "
                           f"(first: {cases[dirty[0]]})")
    result["in_process_us"] = per_case_us(lambda cs: [local.check(c) for c in cs], cases, reps)
    save()
    t0 = time.perf_counter()
    remote = RemoteSession(RunPlan(contract="draft", device=device, kernel="reference"))
    result["worker_start_s"] = round(time.perf_counter() - t0, 2)
    with remote:
        remote.check_many(cases)  # the worker's warm-up
        for key, fn in (("check_many_us", remote.check_many),
                        ("check_us", lambda cs: [remote.check(c) for c in cs]),
                        ("round_trip_us", remote.round_trip)):
            result[key] = per_case_us(fn, cases, reps)
            save()
        wrong = sum(1 for r in remote.check_many(cases) if r)
        if wrong:
            raise RuntimeError(f"the worker reported findings on {wrong} clean case(s)")
        result["worker"] = {k: remote.stats.get(k) for k in ("worker_starts", "deaths", "hangs", "cases")}
    result["added_us_many"] = round(result["check_many_us"] - result["in_process_us"], 1)
    result["added_us_single"] = round(result["check_us"] - result["in_process_us"], 1)
    result["target_added_us_many"] = 10.0
    return 0


if __name__ == "__main__":
    sys.exit(main())
