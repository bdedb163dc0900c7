"""How often the draws reach each mutant's trigger: a CPU simulation of the prior, no kernel launched.

    python benchmarks/prior_reach.py [--seeds 20] [--cpu-examples 60] [--gpu-examples 100]
        [--gpu-family-shares 0.125,0.25] [--json FILE]
    python benchmarks/prior_reach.py --examples-to-trigger [--seeds 40] [--gpu-examples 400]
        [--gpu-path-on 0.5] [--json FILE]

For each domain it draws what ``kvfence fuzz`` (and ``kvfence mutants``) would draw under each seed: the
CPU domain's single cases with the §6 fields drawn, the GPU domain's runs of up to 32 batches of one
config (the §6 fields in one example in four), through Hypothesis with the same seed and phases (generate
only). For every mutant whose bug
depends on the config (its module docstring's "Needs ..."), it counts the seeds whose draws reach the
trigger at least once within the example budget, and the share of cases that do. A trigger reached is
necessary for a detection, not sufficient (the bug must also change a verified element): the detection
rates themselves come from ``kvfence mutants`` on the device.

``--gpu-family-shares`` also simulates the GPU domain under other shares of §6 examples than
``GPU_FAMILY_SHARE`` (``gpu_by_family_share`` in the file), beside it in one run: the evidence the
share was chosen on.

``--examples-to-trigger`` measures what time to a kill rests on instead: the plain ``kvfence fuzz --device
cuda`` strategy (its default example shape, ``bulk_choices.shape_strategy``), and per mutant the examples
drawn until the first that holds a case meeting its trigger, per seed (``None``: not within
``--gpu-examples``), with median and worst (a miss counts as ``--gpu-examples`` + 1). ``--gpu-path-on`` adds
the same at other odds of a §6 path being on in a §6 config than ``kvfence.contracts.draft.strategies.RARE_PATH_ON``
(``by_path_on``): the evidence those odds were chosen on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import saver  # noqa: E402

from kvfence.contracts.draft import domain as domains  # noqa: E402
from kvfence.contracts.draft.strategies import case_runs, cases, configs  # noqa: E402
from kvfence.contracts.draft.tokens import v2p_table  # noqa: E402
from kvfence.engine.budget import default_budget  # noqa: E402


def _launched(case) -> int:
    return case.sizing_summary()["num_seqs"]


def _cap(case) -> int:
    """``window_size + sink_size``: a request longer than this is clipped (docs/contract.md §6)."""
    return case.config.window_size + case.config.sink_size


def _width_rows(case) -> int:
    """Requests a sizing policy budgets for: ``max_bs`` in graph mode, the batch in eager mode."""
    return case.config.max_bs if case.config.mode == "graph" else _launched(case)


#: mutant -> (domain it ships for, trigger predicate on one case). Written from each mutant's docstring.
TRIGGERS = {
    "bs_upper_small": ("cpu", lambda c: _launched(c) >= 3),
    "copy_first_block_only": ("gpu", lambda c: max(c.batch.seq_lens) > 512),
    "entry_page_no_offset": ("cpu", lambda c: c.config.entry_page_size > 1),
    "indptr_stride_rows": ("cpu", lambda c: c.config.num_steps >= 2),
    "indptr_sum_64_branches": ("gpu", lambda c: _launched(c) * c.config.topk > 64),
    "iter_upper_small": ("cpu", lambda c: c.config.num_steps >= 2),
    "num_tokens_upper_small": ("cpu", lambda c: _launched(c) * c.config.topk >= 2),
    "page_last_capped_64": ("gpu", lambda c: c.config.page_size == 128 and c.config.topk >= 2
                            and any(L % 128 >= 64 for L in c.batch.seq_lens)),
    "paged_no_last": ("cpu", lambda c: c.config.page_size > 1 and c.config.topk >= 2
                      and any(L % c.config.page_size for L in c.batch.seq_lens)),
    "prefix_sum_16_lanes": ("gpu", lambda c: _launched(c) >= 18),
    "row_from_request_index": ("cpu", lambda c: any(r != b for b, r in enumerate(c.batch.req_pool_indices))),
    "sizing_missing_topk": ("cpu", lambda c: c.config.topk >= 2
                            and c.sizing_summary()["need"] > _width_rows(c) * c.config.ctx),
    "sizing_no_draft_headroom": ("cpu", lambda c: c.sizing_summary()["need"]
                                 > _width_rows(c) * c.config.topk * c.config.ctx),
    "step_major_drafts": ("cpu", lambda c: c.config.topk >= 2 and c.config.num_steps >= 2),
    "page1_step_major_drafts": ("cpu", lambda c: c.config.page_size == 1 and c.config.topk >= 2
                                and c.config.num_steps >= 2),
    "translate_page_unscaled": ("cpu", lambda c: c.config.translate and c.config.page_size > 1),
    # §6 (docs/contract.md): drawn on the GPU domain in its share of examples (kvfence.contracts.draft.domain).
    "translate_negative_unclipped": ("cpu", lambda c: c.config.translate and c.batch.v2p_seed > 0
                                     and min(v2p_table(c.config, c.batch.v2p_seed)) < 0),
    "window_offsets_unclipped": ("cpu", lambda c: c.config.window_size > 0 and any(
        L > _cap(c) for L in c.batch.seq_lens[:_launched(c) - 1])),
    "window_sinks_dropped": ("cpu", lambda c: c.config.sink_size > 0 and any(L > _cap(c) for L in c.batch.seq_lens)),
    "window_recent_off_by_one": ("cpu", lambda c: c.config.window_size > 0
                                 and any(L > _cap(c) for L in c.batch.seq_lens)),
}


def strategy(domain: str, family_share=None):
    """What the default ``kvfence fuzz`` of each domain draws (as ``kvfence.selftest.mutants.self_test`` draws the draft
    contract's: up to ``GPU_BATCHES`` batches of one config on the GPU domain; the CPU domain under the CPU's default
    memory budget, as ``kvfence mutants --device cpu`` runs it), the
    §6 fields in the domain's share of examples (``--family auto``), or in ``family_share`` of the GPU's."""
    if domain == "gpu":
        gpu = domains.GPU if family_share is None else dataclasses.replace(domains.GPU, family_share=family_share)
        return case_runs(configs(domain=gpu, max_bytes=8 * 2**30, family="auto"), max_batches=32)
    return cases(configs(domain="cpu", max_bytes=default_budget("cpu"), family="auto"))


def examples_drawn(strategy_, seed: int, examples: int) -> list:
    """Each example a seeded Hypothesis run of ``examples`` (generate phase only) draws from ``strategy_``, as a
    list of its cases."""
    out = []

    @hyp_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy_)
    def collect(value):
        out.append(value if isinstance(value, list) else [value])

    collect()
    return out


def draws(domain: str, seed: int, examples: int, family_share=None):
    """Every case a seeded Hypothesis run of ``examples`` draws from ``strategy(domain, family_share)``."""
    return [case for run in examples_drawn(strategy(domain, family_share), seed, examples) for case in run]


def simulate(domain: str, seeds: int, examples: int, family_share=None) -> dict:
    names = [n for n, (d, _) in TRIGGERS.items() if d == domain or domain == "gpu"]
    reached = {n: 0 for n in names}
    hits = {n: 0 for n in names}
    total = 0
    pages = {}
    for s in range(seeds):
        drawn = draws(domain, s, examples, family_share)
        total += len(drawn)
        for case in drawn:
            pages[case.config.page_size] = pages.get(case.config.page_size, 0) + 1
        for n in names:
            count = sum(1 for case in drawn if TRIGGERS[n][1](case))
            hits[n] += count
            reached[n] += count > 0
    return {"seeds": seeds, "examples": examples, "cases": total,
            "page_share": {str(p): round(k / total, 3) for p, k in sorted(pages.items())},
            "mutants": {n: {"seeds_reached": reached[n], "case_share": round(hits[n] / total, 4)} for n in names}}


def examples_to_trigger(seeds: int, examples: int, path_on=None) -> dict:
    """Per mutant of ``TRIGGERS``, the examples the plain GPU command's strategy draws until its trigger (module
    docstring), at ``kvfence.contracts.draft.strategies.RARE_PATH_ON`` or at ``path_on``."""
    import statistics

    from bulk_choices import shape_strategy

    import kvfence.contracts.draft.strategies as strategies
    from kvfence.cli.fuzz import GPU_BATCHES_PER_EXAMPLE, GPU_BULK_PER_EXAMPLE
    from kvfence.contracts.draft.session import runtime_case

    default = strategies.RARE_PATH_ON
    strategies.RARE_PATH_ON = default if path_on is None else path_on
    try:
        first = {name: [] for name in TRIGGERS}
        for s in range(seeds):
            # The engine's launches, as the runner's cases the triggers read (their sizing summary, the bound config).
            drawn = [[runtime_case(x) for x in run]
                     for run in examples_drawn(shape_strategy(GPU_BATCHES_PER_EXAMPLE, GPU_BULK_PER_EXAMPLE), s,
                                               examples)]
            for name, (_, trigger) in TRIGGERS.items():
                first[name].append(next((i + 1 for i, run in enumerate(drawn) if any(trigger(c) for c in run)), None))
    finally:
        strategies.RARE_PATH_ON = default
    counted = lambda row: [examples + 1 if k is None else k for k in row]  # noqa: E731
    return {"path_on": strategies.RARE_PATH_ON if path_on is None else path_on, "seeds": seeds, "examples": examples,
            "mutants": {name: {"examples": row, "median": statistics.median(counted(row)), "worst": max(counted(row)),
                               "seeds_reached": sum(k is not None for k in row)} for name, row in first.items()}}


def _print_examples_to_trigger(row: dict) -> None:
    print(f"examples to the trigger, §6 paths on at {row['path_on']:g} "
          f"({row['seeds']} seeds, up to {row['examples']}):")
    for name, m in row["mutants"].items():
        print(f"  {name:30s} median {m['median']:6.1f}  worst {m['worst']:4d}  "
              f"reached {m['seeds_reached']}/{row['seeds']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--cpu-examples", type=int, default=60, help="the draft record's selftest_examples['cpu']")
    parser.add_argument("--gpu-examples", type=int, default=100, help="beside the draft's selftest_examples['gpu']")
    parser.add_argument("--gpu-family-shares", default="",
                        help="comma-separated shares of §6 examples to simulate beside GPU_FAMILY_SHARE")
    parser.add_argument("--examples-to-trigger", action="store_true",
                        help="examples to each trigger under the plain GPU command's strategy (module docstring)")
    parser.add_argument("--gpu-path-on", default="",
                        help="with --examples-to-trigger: comma-separated odds of a §6 path on, beside RARE_PATH_ON")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"benchmark": "prior_reach", "command": shlex.join(["python", *sys.argv]),
              "gpu_family_share": domains.GPU_FAMILY_SHARE}
    save = saver(args.json, result)
    if args.examples_to_trigger:
        start = time.perf_counter()
        result["examples_to_trigger"] = examples_to_trigger(args.seeds, args.gpu_examples)
        result["examples_to_trigger"]["seconds"] = round(time.perf_counter() - start, 1)
        save()
        _print_examples_to_trigger(result["examples_to_trigger"])
        for odds in (float(x) for x in args.gpu_path_on.split(",") if x.strip()):
            start = time.perf_counter()
            row = examples_to_trigger(args.seeds, args.gpu_examples, path_on=odds)
            row["seconds"] = round(time.perf_counter() - start, 1)
            result.setdefault("by_path_on", {})[str(odds)] = row
            save()
            _print_examples_to_trigger(row)
        return 0
    for domain, examples in (("cpu", args.cpu_examples), ("gpu", args.gpu_examples)):
        start = time.perf_counter()
        result[domain] = simulate(domain, args.seeds, examples)
        result[domain]["seconds"] = round(time.perf_counter() - start, 1)
        save()
        print(f"{domain}: {result[domain]['cases']} cases, pages {result[domain]['page_share']}")
        for name, row in result[domain]["mutants"].items():
            print(f"  {name:26s} {row['seeds_reached']:3d}/{args.seeds} seeds  {row['case_share']:.1%} of cases")
    shares = [float(x) for x in args.gpu_family_shares.split(",") if x.strip()]
    for share in shares:
        start = time.perf_counter()
        row = simulate("gpu", args.seeds, args.gpu_examples, family_share=share)
        row["seconds"] = round(time.perf_counter() - start, 1)
        result.setdefault("gpu_by_family_share", {})[str(share)] = row
        save()
        family = [(n, r) for n, r in row["mutants"].items() if n.startswith(("window", "translate"))]
        print(f"gpu, §6 share {share:g}: " + ", ".join(f"{n} {r['seeds_reached']}/{args.seeds}" for n, r in family))
    print(json.dumps({d: {n: r["seeds_reached"] for n, r in result[d]["mutants"].items()} for d in ("cpu", "gpu")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
