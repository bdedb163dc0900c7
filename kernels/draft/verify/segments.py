"""Verify the kv_indices write set of one case and poison it back (docs/contract.md §2, recomputed).

Program ``(s, b, k)`` walks its own segment of step row ``s`` (only the part inside the row width;
what lies past it is the sizing bug and is seen by ``outside.py`` as guard or stray damage) and adds
the number of elements that do not hold their expected value to ``counts[0]``. An independent
implementation of the contract, tested equal to the plain oracle.

The expected value is computed, not loaded: entry ``p`` of pool row ``r`` is
``slot_id(seed, r*pool_len + p)`` (``kernels/verify/slots.py``; ``inputs.py`` proves the pool still
holds exactly those ids), so each element costs one load of what the kernel wrote and, with
``POISON_BACK``, one store of the poison that makes a missing write visible in the next case: the
same traffic as the kernel under test, which loads the pool and stores the row.

No constexpr depends on the batch: the prefix sum over requests loops over ``LANES``-wide blocks and
the page size is a runtime value, so one compiled variant verifies every config (a fuzz run over
thousands of configs compiles the kernel under test per variant, never its verifier).
"""

import triton
import triton.language as tl

from kvfence.kernels.draft.verify.slots import slot_ids

BLOCK_TOKENS = 1024
#: 8 warps per program: 105 us against 181 us with 4 on the large case (H200 run 12,
#: benchmarks/results/h200_verify_variants.json); with the passes in parallel, 123 against 148 (run 16).
NUM_WARPS = 8
#: Requests summed per loop iteration of the prefix sum.
LANES = 128
#: Cache hints of the load-compare-poison loop (tl.load's eviction_policy, tl.store's cache_modifier).
#: Every element is touched once, but on an H200 the hints changed the large case by no more than the
#: run-to-run spread (run 16: fused check 1.40-1.43x with them, 1.46x without), so none is set.
LOAD_EVICTION = ""
STORE_CACHE = ""


@triton.jit
def segment_geometry(seq_lens, req_pool_indices, s, b, k, topk, num_steps, page_size, LANES: tl.constexpr):
    """Program ``(s, b, k)``'s segment (docs/contract.md §2): ``L_b``, its pool row, its first element
    ``O(s, b, k)`` in step row ``s`` and its first draft slot ``e_k``."""
    n = s + 1
    L = tl.load(seq_lens + b).to(tl.int64)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    # C_b = L_0 + ... + L_{b-1}, LANES requests at a time.
    prefix_sum = tl.zeros([LANES], dtype=tl.int64)
    for lane0 in range(0, b, LANES):
        offs_b = lane0 + tl.arange(0, LANES)
        prefix_sum += tl.load(seq_lens + offs_b, mask=offs_b < b, other=0).to(tl.int64)
    start = topk * tl.sum(prefix_sum) + b * n * topk + k * (L + n)
    # First draft slot e_k: after the prefix, or after k whole paged draft spans.
    last = L % page_size
    pages = (last + num_steps + page_size - 1) // page_size
    paged = (L - last) + k * pages * page_size + last
    draft = tl.where((page_size == 1) | (topk == 1), L + k * num_steps, paged)
    return L, row, start, draft


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['rows_width', 'pool_len', 'front', 'indices_stride', 'width', 'num_steps', 'page_size',
                               'poison'])
def verify_segments_kernel(
    storage, seq_lens, req_pool_indices, rows, cursor, rows_width, counts,
    pool_len, front, indices_stride, width, num_steps, page_size, poison,
    LANES: tl.constexpr, BLOCK: tl.constexpr, POISON_BACK: tl.constexpr, EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,
):
    s = tl.program_id(0)
    b = tl.program_id(1)
    k = tl.program_id(2)
    topk = tl.num_programs(2)
    n = s + 1
    seed = tl.load(rows + tl.load(cursor) * rows_width)  # the case's token seed: staging row, column 0
    L, row, start, draft = segment_geometry(seq_lens, req_pool_indices, s, b, k, topk, num_steps, page_size, LANES)

    # The segment is storage[lo:hi] (absolute indices; only the part inside the row width). The loop
    # walks BLOCK-aligned pieces of the allocation, not pieces starting at the segment's first element:
    # aligned pieces let every warp load and store whole 128-byte lines, which measured 7x faster on an
    # H200 for load-compare-store than segment-relative pieces (run 12, h200_verify_variants.json).
    row_base = front + s.to(tl.int64) * indices_stride
    lo = row_base + start
    hi = row_base + tl.minimum(start + L + n, width)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for i0 in range((lo // BLOCK) * BLOCK, hi, BLOCK):
        i0 = tl.multiple_of(i0, BLOCK)
        i = i0 + tl.arange(0, BLOCK)
        check = (i >= lo) & (i < hi)
        t = i - lo
        token = tl.where(t < L, t, draft + (t - L))
        expected = slot_ids(row * pool_len + token, seed)
        found = tl.load(storage + i, mask=check, other=0, eviction_policy=EVICT)
        bad += (check & (found != expected)).to(tl.int32)
        if POISON_BACK:
            tl.store(storage + i, tl.full([BLOCK], poison, tl.int32), mask=check,  # ready for the next case
                     cache_modifier=STORE_CACHE)
    total = tl.sum(bad)
    if total > 0:  # atomics only when non-zero (see outside.py)
        tl.atomic_add(counts + 0, total)


def verify_segments(buf, *, seq_lens, req_pool_indices, rows, cursor, counts, pool_len: int, topk: int,
                    num_steps: int, page_size: int, poison_back: bool = False, poison: int = -1):
    """Launch over ``(num_steps, num_seqs, topk)`` on ``buf`` (the kv_indices ``kvfence.engine.tables.Guarded``).

    ``rows[cursor, 0]`` is the case's token seed (``harness/contracts/draft/device_verify.py``'s staging rows).
    ``poison_back``: each checked element is overwritten with ``poison`` after the comparison (one pass
    that reads and writes every element once), so the rows are ready for the next case without a
    separate re-poisoning pass.
    """
    num_seqs = seq_lens.shape[0]
    verify_segments_kernel[(num_steps, num_seqs, topk)](
        buf.flat, seq_lens, req_pool_indices, rows, cursor, rows.shape[1], counts,
        pool_len, buf.front, buf.stride, buf.table.width, num_steps, page_size, poison,
        LANES=LANES, BLOCK=BLOCK_TOKENS, POISON_BACK=poison_back, EVICT=LOAD_EVICTION, STORE_CACHE=STORE_CACHE,
        num_warps=NUM_WARPS,
    )
