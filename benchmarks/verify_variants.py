"""Tune the device verifier on a GPU: the shipped passes timed under each setting of their tunables (CUDA only).

Each variant sets the module constants the launchers read at launch time, builds a fresh ``Session`` (so
its graphs are captured with them) and times, in the same run and the same way:

* on the throughput benchmark's large case (256 requests x L 4096 x topk 8 x 5 steps, safe sizing, no
  slack): ``throughput.large`` (kernel replay, verify graph, prepare graph, the fused per-case graph,
  each pass alone; ``triton.testing.do_bench`` medians, microseconds);
* ``slack_verify_us``: the verify graph on the same config with one token per request, so nearly every
  kv_indices column is slack that ``kernels/verify/outside.py`` must read (its worst case);
* ``small_fused_us``: the fused per-case graph of the pinned small config (``throughput.SMALL``), full
  bucket; and ``check_us_small`` (``throughput.check_small``: ``Session.check_many`` per case, host
  time included) for the variants that change the graph's shape.

The tunables: ``kernels/verify/segments.py`` ``BLOCK_TOKENS``, ``NUM_WARPS``, ``LOAD_EVICTION``,
``STORE_CACHE``; ``kernels/verify/outside.py`` ``PROGRAMS_PER_ROW``; ``harness/contracts/draft/device_verify.py``
``PARALLEL_BRANCHES``. The first variant is the shipped setting.

Usage: ``python benchmarks/verify_variants.py --json OUT.json [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from kvfence.provenance import stamped

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kvfence.contracts.draft.device_verify as device_verify  # noqa: E402
import kvfence.kernels.draft.verify.outside as outside  # noqa: E402
import kvfence.kernels.draft.verify.segments as segments  # noqa: E402

#: name -> {(module, constant): value}; unnamed constants keep the shipped value.
VARIANTS = {
    "shipped": {},
    "serial": {(device_verify, "PARALLEL_BRANCHES"): False},
    "b2048_w8": {(segments, "BLOCK_TOKENS"): 2048},
    "b2048_w16": {(segments, "BLOCK_TOKENS"): 2048, (segments, "NUM_WARPS"): 16},
    "b4096_w16": {(segments, "BLOCK_TOKENS"): 4096, (segments, "NUM_WARPS"): 16},
    "b1024_w4": {(segments, "NUM_WARPS"): 4},
    "evict_first": {(segments, "LOAD_EVICTION"): "evict_first"},
    "store_cs": {(segments, "STORE_CACHE"): ".cs"},
    "evict_first_store_cs": {(segments, "LOAD_EVICTION"): "evict_first", (segments, "STORE_CACHE"): ".cs"},
    "programs64": {(outside, "PROGRAMS_PER_ROW"): 64},
    "programs256": {(outside, "PROGRAMS_PER_ROW"): 256},
    "programs4096": {(outside, "PROGRAMS_PER_ROW"): 4096},
}
#: Variants whose graph shape differs enough to time the small-case check path too.
SMALL_PATH = ("shipped", "serial")


def _measure(name: str) -> dict:
    import throughput
    import triton.testing

    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.session import Session

    out = {k: v for k, v in throughput.large("cuda", naive=False).items() if not k.startswith("naive")}
    # The slack case: same config, one token per request.
    config = Config(sizing="safe", **throughput.LARGE)
    mb = throughput.LARGE["max_bs"]
    case = Case(config, Batch(tuple([1] * mb), tuple(range(1, mb + 1)), 777))
    session = Session("cuda", "reference")
    assert session.check(case) == []
    verifier = session._device_verifiers[session.runner(config)]
    _, _, verify = verifier._steps(mb)
    out["slack_verify_us"] = round(triton.testing.do_bench(verify, warmup=10, rep=100, return_mode="median") * 1e3, 1)
    # The small config's fused per-case graph at its full bucket.
    small = Config(sizing="safe", **throughput.SMALL)
    sb = throughput.SMALL["max_bs"]
    case = Case(small, Batch(tuple(range(1, sb + 1)), tuple(range(1, sb + 1)), 4242))
    session = Session("cuda", "reference")
    assert session.check(case) == []
    verifier = session._device_verifiers[session.runner(small)]
    fused = verifier._case_graph(sb)
    out["small_fused_us"] = round(triton.testing.do_bench(lambda: (verifier.cursor.zero_(), fused()), warmup=25,
                                                          rep=200, return_mode="median") * 1e3, 1)
    if name in SMALL_PATH:
        out.update(throughput.check_small("cuda"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    args = parser.parse_args()
    import torch
    import triton

    names = args.only or list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        print(f"verify_variants: error: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}",
              file=sys.stderr)
        return 2
    shipped = {(m, k): getattr(m, k) for v in VARIANTS.values() for (m, k) in v}
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "shipped": {f"{m.__name__}.{k}": v for (m, k), v in shipped.items()}, "variants": {}}
    for name in names:
        for (m, k), v in shipped.items():
            setattr(m, k, v)
        for (m, k), v in VARIANTS[name].items():
            setattr(m, k, v)
        try:
            out["variants"][name] = _measure(name)
        except Exception as exc:  # a variant that does not compile on this triton is reported, not fatal
            out["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            traceback.print_exc()
        row = out["variants"][name]
        print(name, {k: row.get(k) for k in ("kernel_replay_us_large", "verify_us_large", "prepare_us_large",
                                             "large_check_over_kernel", "large_steps_check_over_kernel",
                                             "slack_verify_us", "small_fused_us", "check_us_small", "error")},
              flush=True)
        Path(args.json).write_text(json.dumps(stamped(out), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
