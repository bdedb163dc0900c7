"""Cost of the interpreter address audit (kvfence.engine.audit) against the plain interpreter.

    python benchmarks/audit_cost.py [--cases 60] [--repeat 3]

Draws a fixed, seeded set of cases (topk 1-4, num_steps 1-4, page size 1 or 4, up to 4 requests of
length up to 48), then times ``Session.observe`` (the launch, with buffer set-up and snapshots) and
``Session.check`` (launch plus verdict) with the audit off and on, interleaved, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvfence.device import select  # noqa: E402


def cases(n: int, seed: int):
    from kvfence.contracts.draft.case import Batch, Case, Config

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        config = Config(topk=rng.randint(1, 4), num_steps=rng.randint(1, 4), page_size=rng.choice([1, 4]), ctx=48,
                        max_bs=4)
        raw = rng.randint(1, 4)
        lens = tuple(rng.randint(1, 48) for _ in range(raw))
        rows = tuple(rng.sample(range(config.pool_rows), raw))
        out.append(Case(config, Batch(lens, rows, rng.randrange(2**30))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    device = select("cpu")
    import triton

    from kvfence.contracts.draft.session import Session

    work = cases(args.cases, args.seed)
    programs = sum(c.config.num_steps * c.launch().num_seqs * c.config.topk for c in work)
    sessions = {"plain": Session(device, audit=False), "audit": Session(device, audit=True)}
    for s in sessions.values():  # warm-up: runner construction, first-launch costs
        for c in work[:5]:
            s.check(c)
    best = {(k, what): float("inf") for k in sessions for what in ("observe", "check")}
    for _ in range(args.repeat):
        for key, s in sessions.items():
            for what in ("observe", "check"):
                fn = getattr(s, what)
                t0 = time.perf_counter()
                for c in work:
                    fn(c)
                best[key, what] = min(best[key, what], time.perf_counter() - t0)
    print(f"triton {triton.__version__}: {len(work)} cases, {programs} programs, best of {args.repeat}")
    for what in ("observe", "check"):
        plain, audit = best["plain", what], best["audit", what]
        print(f"{what:8s} plain {plain:.3f}s ({1e3 * plain / programs:.3f} ms/program)  "
              f"audit {audit:.3f}s ({1e3 * audit / programs:.3f} ms/program)  ratio {audit / plain:.2f}x")


if __name__ == "__main__":
    main()
