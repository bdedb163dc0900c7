"""Count changed input elements: the kernel under test must only read its inputs.

``req_to_token`` is compared with the slot ids regenerated from the case's token seed (no copy of
the pool is kept), and the whole of ``seq_lens`` / ``req_pool_indices`` / ``positions`` (all ``max_bs``
rows, not only the launched bucket) with the staging row ``cursor`` of ``rows``, which ``prepare.py``
copied in full: live rows, the runner's padding, and padding values past the bucket. The pool's guards
(``front`` elements before it, ``tail`` after it, in the same allocation) must still hold the engine's input
poison, ``poison_base - position`` with positions counted from the guards' start
(``kvfence.engine.tables.guard_values``). A write anywhere in an input or its guards is counted in ``counts[3]``.

Grid ``(cdiv(pool_numel, BLOCK) + 2,)``: the pool's blocks, the per-request inputs, the pool's guards.
"""

import triton
import triton.language as tl

from kvfence.kernels.draft.verify.prepare import BLOCK_ELEMENTS
from kvfence.kernels.draft.verify.slots import slot_ids


@triton.jit(do_not_specialize=['width', 'max_bs', 'topk', 'pool_numel', 'front', 'tail', 'poison_base'])
def verify_inputs_kernel(rows, cursor, width, seq_lens, req_pool_indices, positions, max_bs, topk, req_to_token,
                         pool_numel, front, tail, poison_base, counts, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = rows + tl.load(cursor) * width
    pool_blocks = tl.cdiv(pool_numel, BLOCK)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    if pid < pool_blocks:
        i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = i < pool_numel
        found = tl.load(req_to_token + i, mask=live, other=0)
        bad += (live & (found != slot_ids(i, tl.load(row)))).to(tl.int32)
    elif pid == pool_blocks:
        for start in range(0, max_bs, BLOCK):
            j = start + tl.arange(0, BLOCK)
            live = j < max_bs
            lens = tl.load(seq_lens + j, mask=live, other=0).to(tl.int64)
            pool_rows = tl.load(req_pool_indices + j, mask=live, other=0).to(tl.int64)
            bad += (live & (lens != tl.load(row + 1 + j, mask=live, other=0))).to(tl.int32)
            bad += (live & (pool_rows != tl.load(row + 1 + max_bs + j, mask=live, other=0))).to(tl.int32)
        for start in range(0, max_bs * topk, BLOCK):
            j = start + tl.arange(0, BLOCK)
            live = j < max_bs * topk
            pos = tl.load(positions + j, mask=live, other=0).to(tl.int64)
            bad += (live & (pos != tl.load(row + 1 + 2 * max_bs + j, mask=live, other=0))).to(tl.int32)
    else:  # the guards: before the pool, then after it (guard positions front + pool_numel onwards)
        for start in range(0, front, BLOCK):
            k = start + tl.arange(0, BLOCK)
            live = k < front
            found = tl.load(req_to_token + (k.to(tl.int64) - front), mask=live, other=0).to(tl.int64)
            bad += (live & (found != poison_base - k.to(tl.int64))).to(tl.int32)
        for start in range(0, tail, BLOCK):
            k = start + tl.arange(0, BLOCK)
            live = k < tail
            found = tl.load(req_to_token + (pool_numel + k.to(tl.int64)), mask=live, other=0).to(tl.int64)
            bad += (live & (found != poison_base - (front + pool_numel + k.to(tl.int64)))).to(tl.int32)
    total = tl.sum(bad)
    if total > 0:  # atomics only when non-zero (see outside.py)
        tl.atomic_add(counts + 3, total)


def verify_inputs(*, rows, cursor, seq_lens, req_pool_indices, positions, req_to_token, counts, max_bs: int,
                  topk: int, front: int, tail: int, poison_base: int):
    """``req_to_token``: the pool's rows (contiguous), with ``front`` and ``tail`` guard elements around them."""
    pool_numel = req_to_token.numel()
    grid = (triton.cdiv(pool_numel, BLOCK_ELEMENTS) + 2,)
    verify_inputs_kernel[grid](rows, cursor, rows.shape[1], seq_lens, req_pool_indices, positions, max_bs, topk,
                               req_to_token, pool_numel, front, tail, poison_base, counts, BLOCK=BLOCK_ELEMENTS)
