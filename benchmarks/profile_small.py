"""Where a small verified case spends its time (the >= 1000 cases/s target of BENCHMARKS.md).

    python benchmarks/profile_small.py [--device cuda] [--examples N] [--out DIR]

1. Hypothesis alone: the small-case strategy with an empty test body (cases/s);
2. kvfence alone: ``Session.check`` over the same cases drawn beforehand (us/case, CUDA events);
3. both, as ``fuzz`` runs them, under cProfile: the top functions by own time go to DIR/profile_small.txt.
"""

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from throughput import SMALL  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    from kvfence.device import select

    device = select(args.device)
    import torch
    from hypothesis import HealthCheck, Phase, given, settings
    from result_file import draft_launches

    from kvfence.contracts.draft.session import Session
    from kvfence.contracts.draft.strategies import cases, configs
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    strategy = draft_launches(cases(configs(sizing="safe", **SMALL)))  # the engine's launches, as fuzz takes
    drawn = []

    @settings(max_examples=args.examples, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @given(strategy)
    def generate(case):
        drawn.append(case)

    t0 = time.perf_counter()
    generate()
    hyp_s = time.perf_counter() - t0
    print(f"hypothesis only: {len(drawn)} cases in {hyp_s:.2f}s = {len(drawn) / hyp_s:.0f} cases/s")

    session = Session(device, "reference")
    for case in drawn[:200]:
        session.check(case)  # compile and capture
    reps = []
    for _ in range(3):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for case in drawn:
            assert session.check(case) == []
        if device == "cuda":
            end.record()
            end.synchronize()
            reps.append(start.elapsed_time(end) * 1e3 / len(drawn))
        else:
            reps.append((time.perf_counter() - t0) * 1e6 / len(drawn))
    print(f"kvfence only: {statistics.median(reps):.0f} us/case (median of {[round(r) for r in reps]}), "
          f"{1e6 / statistics.median(reps):.0f} cases/s; session stats {session.stats}")

    prof = cProfile.Profile()
    prof.enable()
    result = fuzz(session, strategy, RunPlan(max_examples=args.examples, seed=3))
    prof.disable()
    print(f"fuzz: {result.examples} examples, {result.cases_per_s:.0f} cases/s")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    Path(args.out, "profile_small.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
