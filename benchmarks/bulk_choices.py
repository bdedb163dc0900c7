"""How the GPU command's example shape decides time to a kill, measured without a GPU.

    python benchmarks/bulk_choices.py [--seeds 5] [--cap 20] [--shapes 32/1024,32/0,8/64,...] [--json FILE]

Each shape ``B/N`` is the strategy of ``kvfence fuzz --device cuda`` with up to ``B`` Hypothesis batches per
example (``--batches-per-example``) and a bulk of ``N`` (``--bulk-per-example``), over the GPU domain's
configs (``--scale gpu``), checked by a stub session that reports a finding as soon as a case meets a
predicate shaped like a planted bug's trigger (a config-dependent one, a batch-dependent one, one at the
context wall); nothing is launched. Per shape and predicate: the seconds from the loop's start to the first
failure over ``--seeds`` seeds (a miss counts as twice ``--cap``), with median and worst. This isolates what
the shape changes, the parent's generation (how many configs and structures per second it reaches), from
the GPU's checking; ``benchmarks/plain_fuzz_mutants.py --device cuda --compare-bulk N`` measures the real
mutants on the GPU. The default shape of ``kvfence.cli.fuzz`` (``GPU_BATCHES_PER_EXAMPLE`` /
``GPU_BULK_PER_EXAMPLE``) was chosen from this table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

from kvfence.engine.findings import Finding, Kind
from kvfence.provenance import stamped

#: Triggers shaped like the shipped mutants' (kernels/draft/mutants/): a predicate of one case (the draft
#: contract's ``DraftCase``: its config and batch).
TRIGGERS = {
    # prefix_sum_16_lanes: more than 16 lanes (requests x topk) in a multi-step launch.
    "lanes_over_16": lambda c: len(c.batch.seq_lens) * c.config.topk > 16 and c.config.num_steps > 1,
    # page1_step_major_drafts: page size 1, topk > 1, deeper drafts, more than one request.
    "page1_step_major": lambda c: (c.config.page_size == 1 and c.config.topk > 1 and c.config.num_steps > 2
                                   and len(c.batch.seq_lens) > 1),
    # page_last_capped_64: a paged request longer than 64 pages.
    "over_64_pages": lambda c: c.config.page_size > 1 and max(c.batch.seq_lens) > 64 * c.config.page_size,
    # the context wall with several requests (the bulk's kind of structure).
    "wall_with_3_requests": lambda c: (max(c.batch.seq_lens) > c.config.ctx - c.config.num_steps
                                       and len(c.batch.seq_lens) > 2),
}


class TriggerSession:
    """A stub session: a launch whose case meets ``trigger`` has one finding, every other is clean."""

    stats: dict = {}

    def __init__(self, trigger):
        self.trigger = trigger

    def check(self, launch):
        return self.check_many([launch])[0]

    def check_many(self, launches):
        return [[Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 0, 1)] if self.trigger(x.case) else []
                for x in launches]


def shape_plan(batches: int, bulk: int):
    """The plain GPU command's plan (the draft contract, the GPU domain) with this example shape."""
    from kvfence.engine.plan import RunPlan

    return RunPlan(contract="draft", device="cuda", domain="gpu", max_bytes=10 << 30, batches_per_example=batches,
                   bulk_per_example=bulk)


def shape_strategy(batches: int, bulk: int):
    """The GPU command's strategy (``kvfence.engine.run.draws`` of the plain GPU plan: the draft contract's
    launches, a list of one config per example) with this example shape."""
    from kvfence.engine.run import draws

    return draws(shape_plan(batches, bulk))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cap", type=float, default=20.0, help="seconds per run before it counts as a miss")
    parser.add_argument("--shapes", default="32/1024,32/0,8/64,8/0,4/32,8/256")
    parser.add_argument("--triggers", default=",".join(TRIGGERS), help="comma-separated, of: " + ", ".join(TRIGGERS))
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        shapes = [tuple(int(x) for x in s.split("/")) for s in args.shapes.split(",")]
        triggers = args.triggers.split(",")
        if args.seeds < 1 or args.cap <= 0 or any(len(s) != 2 or s[0] < 1 or s[1] < 0 for s in shapes) or \
                any(t not in TRIGGERS for t in triggers):
            raise ValueError
    except ValueError:
        print("bulk_choices: --shapes is B/N,... (B >= 1, N >= 0), --seeds >= 1, --cap > 0, --triggers of "
              + ", ".join(TRIGGERS), file=sys.stderr)
        return 2
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    warnings.simplefilter("ignore")  # Hypothesis's "overly large repr" of a bulk example
    start = time.monotonic()
    doc = {"benchmark": "bulk_choices", "command": " ".join(["python", *sys.argv]), "seeds": args.seeds,
           "first_seed": args.first_seed, "cap_s": args.cap, "shapes": {}}
    for batches, bulk in shapes:
        rows = {}
        for name in triggers:
            trigger, times = TRIGGERS[name], []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                result = fuzz(TriggerSession(trigger), shape_strategy(batches, bulk),
                              RunPlan(max_examples=10**9, seed=seed, max_seconds=args.cap, shrink_seconds=0))
                times.append(round(result.first_failure_s, 3) if result.first_failure_s is not None else 2 * args.cap)
            rows[name] = {"seconds": times, "median": round(statistics.median(times), 3), "worst": max(times)}
            print(f"{batches:3d}/{bulk:<5d} {name:22s} median {rows[name]['median']:7.3f} s  worst "
                  f"{rows[name]['worst']:7.3f} s", flush=True)
        doc["shapes"][f"{batches}/{bulk}"] = {
            "batches_per_example": batches, "bulk_per_example": bulk, "triggers": rows,
            "worst_median": max(r["median"] for r in rows.values()), "worst": max(r["worst"] for r in rows.values())}
    doc["elapsed_s"] = round(time.monotonic() - start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(stamped(doc), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
