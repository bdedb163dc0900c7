"""CPU throughput under the Triton interpreter, and where its time goes.

    python benchmarks/interpreter.py [--examples N] [--json PATH]

Fuzzes the default domain (``kvfence.contracts.draft.strategies.cases()``: topk 1-8, 1-8 steps, page sizes 1-64,
ctx <= 48, max_bs <= 4, graph mode, safe sizing) with a fixed seed, twice: with the interpreter's discarded
int32-overflow checks skipped (kvfence's default, ``kvfence.device.skip_discarded_overflow_checks``)
and with them on (Triton's default). Reports cases/s and the cost per Triton program, then profiles the
first run and splits its own time by package (triton / torch+numpy / hypothesis / kvfence).
"""

import argparse
import cProfile
import dataclasses
import json
import pstats
import sys
import time
from pathlib import Path

from kvfence.provenance import stamped

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # result_file.py beside it


def run(examples: int, seed: int, profile: bool):
    from result_file import draft_launches

    from kvfence.contracts.draft.session import Session, runtime_case
    from kvfence.contracts.draft.strategies import cases
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    programs = []

    class Counting(Session):
        def check(self, case):
            runtime = runtime_case(case)  # the engine's launch as the runner's case
            lb = runtime.launch()
            programs.append(runtime.config.num_steps * lb.num_seqs * runtime.config.topk)
            return super().check(case)

    session = Counting("cpu", "reference")
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    t0 = time.perf_counter()
    result = fuzz(session, draft_launches(cases()), RunPlan(max_examples=examples, seed=seed, targeting=False))
    elapsed = time.perf_counter() - t0
    if prof:
        prof.disable()
    assert not result.findings
    return {"examples": result.examples, "elapsed_s": round(elapsed, 2),
            "cases_per_s": round(result.examples / elapsed, 1),
            "programs": sum(programs), "ms_per_program": round(elapsed * 1e3 / sum(programs), 3)}, prof


def split(prof) -> dict:
    stats = pstats.Stats(prof).stats
    total = 0.0
    parts = {"triton": 0.0, "builtins": 0.0, "torch/numpy": 0.0, "hypothesis": 0.0, "kvfence": 0.0, "other": 0.0}
    for (filename, _, _), (_, _, tottime, _, _) in stats.items():
        total += tottime
        if "/triton/" in filename:
            parts["triton"] += tottime
        elif filename == "~":  # C builtins (isinstance, getattr, numpy ufuncs...), mostly called by triton
            parts["builtins"] += tottime
        elif "/torch/" in filename or "/numpy/" in filename:
            parts["torch/numpy"] += tottime
        elif "/hypothesis/" in filename:
            parts["hypothesis"] += tottime
        elif any(f"/{p}/" in filename for p in ("harness", "kernels", "strategies")):
            parts["kvfence"] += tottime
        else:
            parts["other"] += tottime
    return {k: round(100 * v / total, 1) for k, v in parts.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from kvfence.device import select

    select("cpu")
    from triton.runtime import interpreter

    _, prof = run(args.examples, args.seed, profile=True)  # profiled: its timing is not reported
    fast, _ = run(args.examples, args.seed, profile=False)
    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=True)  # Triton's default
    slow, _ = run(args.examples, args.seed, profile=False)
    out = {"overflow_checks_skipped": fast, "triton_default": slow, "profile_share_percent": split(prof),
           "command": "python benchmarks/interpreter.py " + " ".join(sys.argv[1:])}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(stamped(out), indent=2) + "\n")


if __name__ == "__main__":
    main()
