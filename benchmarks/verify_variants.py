"""Where the device verifier's time goes on the large case, and which code shape is fastest (CUDA only).

Times (``triton.testing.do_bench`` medians, microseconds) variants of the kv_indices segment check on
the throughput benchmark's large case (256 requests x L 4096 x topk 8 x 5 steps, safe sizing), next
to the kernel's own replay measured the same way in the same run:

* ``load``: compare only; ``load_store``: compare and poison back (the shipped shape);
* ``store``: poison back only (no compare); ``fill``: ``torch.fill_`` of every row's width;
* ``*_w8``: 8 warps; ``*_b256`` / ``*_b4096``: other block sizes; ``*_cs``: streaming store;
* ``*_aligned``: the shipped kernel (``kernels/verify/segments.py``), whose loop walks BLOCK-aligned
  absolute element indices from the allocation's base (``tl.multiple_of`` hint), so loads and stores of
  a block are aligned (run 12 also timed a store-only aligned shape: 89 us, ``h200_verify_variants.json``).

Usage: ``python benchmarks/verify_variants.py --json OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.verify.segments import segment_geometry, verify_segments_kernel  # noqa: E402
from kernels.verify.slots import slot_ids  # noqa: E402


@triton.jit(do_not_specialize=['rows_width', 'pool_len', 'front', 'indices_stride', 'width', 'num_steps',
                               'page_size', 'poison'])
def segment_variant(storage, seq_lens, req_pool_indices, rows, cursor, rows_width, counts, pool_len, front,
                    indices_stride, width, num_steps, page_size, poison, LANES: tl.constexpr, BLOCK: tl.constexpr,
                    LOAD: tl.constexpr, STORE: tl.constexpr, STREAMING: tl.constexpr):
    s = tl.program_id(0)
    b = tl.program_id(1)
    k = tl.program_id(2)
    topk = tl.num_programs(2)
    n = s + 1
    seed = tl.load(rows + tl.load(cursor) * rows_width)
    L, row, start, draft = segment_geometry(seq_lens, req_pool_indices, s, b, k, topk, num_steps, page_size, LANES)
    row_base = front + s.to(tl.int64) * indices_stride
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    out = storage + row_base
    for base in range(0, L + n, BLOCK):
        t = base + tl.arange(0, BLOCK)
        e = start + t
        check = (t < L + n) & (e < width)
        token = tl.where(t < L, t, draft + (t - L))
        if LOAD:
            found = tl.load(out + e, mask=check, other=0)
            bad += (check & (found != slot_ids(row * pool_len + token, seed))).to(tl.int32)
        if STORE:
            if STREAMING:
                tl.store(out + e, tl.full([BLOCK], poison, tl.int32), mask=check, cache_modifier=".cs")
            else:
                tl.store(out + e, tl.full([BLOCK], poison, tl.int32), mask=check)
    tl.atomic_add(counts + 0, tl.sum(bad))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    import torch
    import triton.testing

    from benchmarks.throughput import LARGE
    from harness.cases.case import Batch, Case, Config
    from harness.running.guarded import POISON
    from harness.verifying.session import Session

    config = Config(sizing="safe", **LARGE)
    case = Case(config, Batch(tuple([LARGE["ctx"]] * LARGE["max_bs"]), tuple(range(1, LARGE["max_bs"] + 1)), 12345))
    session = Session("cuda", "reference")
    assert session.check(case) == []
    runner = session.runner(config)
    verifier = session._device_verifiers[runner]
    m = case.launch().num_seqs
    prepare, kernel, _ = verifier._steps(m)
    prepare()
    inputs, buf = runner.inputs, runner.kv_indices
    bench = lambda fn: round(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3, 1)  # noqa: E731

    def variant(load, store, block=1024, warps=4, streaming=False, aligned=False):
        grid = (config.num_steps, m, config.topk)
        if aligned:  # the shipped kernel: BLOCK-aligned pieces of the allocation (store only is not a shape of it)
            return lambda: verify_segments_kernel[grid](
                buf.storage, inputs.seq_lens[:m], inputs.req_pool_indices[:m], verifier.rows, verifier.cursor,
                verifier.rows.shape[1], verifier.counts, inputs.req_to_token.shape[1], buf.front, buf.stride,
                buf.width, config.num_steps, config.page_size, POISON, LANES=128, BLOCK=block, POISON_BACK=store,
                num_warps=warps)

        def go():
            segment_variant[grid](
                buf.storage, inputs.seq_lens[:m], inputs.req_pool_indices[:m], verifier.rows, verifier.cursor,
                verifier.rows.shape[1], verifier.counts, inputs.req_to_token.shape[1], buf.front, buf.stride,
                buf.width, config.num_steps, config.page_size, POISON, LANES=128, BLOCK=block, LOAD=load,
                STORE=store, STREAMING=streaming, num_warps=warps)
        return go

    out = {"kernel_replay_us": bench(kernel)}
    for name, kw in {"load": dict(load=True, store=False), "load_store": dict(load=True, store=True),
                     "store": dict(load=False, store=True), "load_store_w8": dict(load=True, store=True, warps=8),
                     "load_store_b256": dict(load=True, store=True, block=256),
                     "load_store_b4096": dict(load=True, store=True, block=4096, warps=8),
                     "load_store_cs": dict(load=True, store=True, streaming=True),
                     "load_aligned": dict(load=True, store=False, aligned=True),
                     "load_store_aligned": dict(load=True, store=True, aligned=True),
                     "load_store_aligned_w8": dict(load=True, store=True, aligned=True, warps=8)}.items():
        try:
            out[name + "_us"] = bench(variant(**kw))
        except Exception as exc:  # a variant that does not compile on this triton is reported, not fatal
            out[name + "_us"] = f"{type(exc).__name__}: {exc}"[:200]
        print(name, out[name + "_us"], flush=True)
    view = buf.view[:, :buf.width]
    out["fill_rows_us"] = bench(lambda: view.fill_(POISON))
    out["device"] = torch.cuda.get_device_name()
    out["triton"] = triton.__version__
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
