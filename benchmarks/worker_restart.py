"""What a crash costs the next case: the worker restart, with and without spare workers.

    python benchmarks/worker_restart.py --device cpu --json results/cpu_worker_restart.json
    python benchmarks/worker_restart.py --device cuda --json $OUT/worker_restart.json

Shrinking a crash restarts the worker once per crashing candidate (``kvfence.engine.supervisor``). This measures,
for ``--crashes`` crashes of ``tests/targets/far_store.py:fault_on_3`` (an illegal address on CUDA, a
segfault under the interpreter with the audit off), the seconds from the crash's verdict to the next
case's verdict (``next_case_s``: the restart plus a first launch of the config), with ``spares=0`` (a
worker is started only when one is needed) and with the default spares (``kvfence.engine.supervisor.SPARES``:
started in the background once the session has seen a crash). ``--gap`` seconds pass between the two,
as passing candidates do while Hypothesis shrinks. Also: the first start (``worker_start_s``) and
Triton's on-disk cache folder, which every worker shares (a restart loads compiled kernels from it).

Prints one JSON line; ``--json`` writes it after every stage (a time limit keeps what was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from result_file import saver  # noqa: E402

SPEC = str(ROOT / "tests" / "targets" / "far_store.py") + ":fault_on_3"


def triton_cache_dir() -> str:
    """Where Triton keeps compiled kernels (its own rule: TRITON_CACHE_DIR, else TRITON_HOME/.triton/cache)."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    return os.path.join(os.environ.get("TRITON_HOME", os.path.expanduser("~")), ".triton", "cache")


def measure(device: str, spares, crashes: int, gap: float) -> dict:
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.supervisor import RemoteSession

    config = Config(topk=2, num_steps=2, ctx=8, max_bs=2, sizing="safe", mode="eager")

    def case(length: int, seed: int):
        """The launch a checking worker takes (the draft contract's)."""
        return launch_of(Case(config, Batch((length,), (0,), seed), kernel=SPEC))

    t0 = time.perf_counter()
    rs = RemoteSession(RunPlan(contract="draft", device=device, kernel=SPEC, mode="eager", audit=False),
                       spares=spares)
    out = {"worker_start_s": round(time.perf_counter() - t0, 3)}
    with rs:
        t0 = time.perf_counter()
        assert rs.check(case(1, 0)) == []
        out["first_case_s"] = round(time.perf_counter() - t0, 3)
        crash_s, next_s = [], []
        for i in range(crashes):
            t0 = time.perf_counter()
            kinds = {f.kind.value for f in rs.check(case(3, i))}
            crash_s.append(time.perf_counter() - t0)
            assert kinds == {"CRASH"}, kinds
            time.sleep(gap)
            t0 = time.perf_counter()
            assert rs.check(case(1, 100 + i)) == []
            next_s.append(time.perf_counter() - t0)
        out.update(crash_verdict_s=round(statistics.median(crash_s), 3),
                   next_case_s=round(statistics.median(next_s), 3),
                   next_case_all_s=[round(x, 3) for x in next_s],
                   counters={k: rs.stats.get(k) for k in ("worker_starts", "deaths", "spares_used")})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--crashes", type=int, default=5)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between a crash and the next case")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"benchmark": "worker_restart", "crashes": args.crashes, "gap_s": args.gap,
              "kernel": "tests/targets/far_store.py:fault_on_3"}

    save = saver(args.json, result)

    code = 0
    try:
        from kvfence.device import select
        from kvfence.engine.supervisor import SPARES

        device = select(args.device)
        cache = triton_cache_dir()
        result.update(device=device, triton_cache_dir=cache,
                      triton_cache_entries=len(os.listdir(cache)) if os.path.isdir(cache) else 0)
        if device == "cuda":
            import torch

            result["gpu"] = torch.cuda.get_device_name()
        for label, spares in (("no_spares", 0), ("spares", SPARES.get(device, 1))):
            result[label] = dict(measure(device, spares, args.crashes, args.gap), spares=spares)
            save()
        result["restart_saved_s"] = round(result["no_spares"]["next_case_s"] - result["spares"]["next_case_s"], 3)
    except Exception as exc:  # noqa: BLE001 - one JSON line with what went wrong, not a lost run
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2000:]
        code = 1
    save()
    print(json.dumps(result, separators=(",", ":")))
    return code


if __name__ == "__main__":
    sys.exit(main())
