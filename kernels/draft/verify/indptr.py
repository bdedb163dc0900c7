"""Verify the whole kv_indptr allocation of one case and poison its written columns back.

Row ``s`` (draft step ``s``, ``n = s + 1``) must hold, per docs/contract.md §2 and §4:

* column 0: kvfence's canary (the kernel never writes it);
* columns ``c = 1 .. bs`` (``bs = num_seqs * topk``): ``positions[0] + ... + positions[c-1] + c*n``
  (program ``z != 0`` writes column ``z``; program 0 writes column ``bs``);
* columns ``bs+1 .. width-1``: the poison (never written);
* the guard after the row, and the front and tail guards: their positional canaries.

Grid ``(cdiv(span, BLOCK), rows + 2)``: program ``(blk, s)`` checks columns ``blk*BLOCK ...`` of row
``s`` and its guard (``s == rows``: the front guard, ``s == rows + 1``: the tail). It first sums the
positions before its piece (``blk`` loads of ``BLOCK`` lanes: a handful even at 4096 branches), then
prefix-sums its own piece (``tl.cumsum``). Mismatches in the written columns go to ``counts[1]``,
anything else to ``counts[2]`` (as ``outside.py`` counts them).
"""

import triton
import triton.language as tl

BLOCK_COLUMNS = 512


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['front', 'rows', 'width', 'stride', 'tail', 'num_seqs', 'topk', 'seed_term',
                               'poison'])
def verify_indptr_kernel(
    storage, positions, counts, front, rows, width, stride, tail, num_seqs, topk, seed_term, poison,
    BLOCK: tl.constexpr, GUARD_COL0: tl.constexpr, POISON_BACK: tl.constexpr,
):
    blk = tl.program_id(0)
    s = tl.program_id(1)
    bs = num_seqs * topk
    n = s + 1
    is_row = s < rows
    is_front = s == rows
    base = tl.where(is_row, front + s * stride, tl.where(is_front, 0, front + rows * stride))
    count = tl.where(is_row, stride, tl.where(is_front, front, tail))
    col0 = blk * BLOCK
    cols = col0 + tl.arange(0, BLOCK)

    # Column c holds positions[0] + ... + positions[c-1]: first the positions before this piece.
    before = tl.zeros([BLOCK], dtype=tl.int64)
    first = tl.where(is_row, tl.minimum(col0, bs + 1) - 1, 0)  # positions[0:first] come before column col0
    for j0 in range(0, first, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        before += tl.load(positions + j, mask=j < first, other=0).to(tl.int64)

    in_range = cols < count
    i = (base + cols).to(tl.int64)
    # kvfence.engine.tables.seeded_canaries; seed_term = (canary_seed * 0x9E37) mod 2**30, precomputed on the
    # host.
    canary = -(((i * 0x2545F491 + seed_term) & ((1 << 30) - 1)) + 2)
    # (cols < width*is_row) rather than is_row & (...): the interpreter keeps a scalar&block mask as int32.
    live = cols < width * is_row.to(tl.int32)
    written = live & (cols >= 1) & (cols <= bs)
    pos = tl.load(positions + cols - 1, mask=written, other=0).to(tl.int64)
    ptr = tl.sum(before) + tl.cumsum(pos, 0) + cols.to(tl.int64) * n
    expected = tl.where(written, ptr, tl.where(live, poison, canary))
    if GUARD_COL0:
        expected = tl.where(live & (cols == 0), canary, expected)  # the canary stays in column 0
    found = tl.load(storage + i, mask=in_range, other=0).to(tl.int64)
    wrong = in_range & (found != expected)
    bad_written = tl.sum((wrong & written).to(tl.int32))
    bad_other = tl.sum((wrong & ~written).to(tl.int32))
    if bad_written > 0:  # atomics only when non-zero (see outside.py)
        tl.atomic_add(counts + 1, bad_written)
    if bad_other > 0:
        tl.atomic_add(counts + 2, bad_other)
    if POISON_BACK:
        tl.store(storage + i, tl.full([BLOCK], poison, tl.int32), mask=written)  # ready for the next case


def verify_indptr(buf, *, positions, counts, num_seqs: int, topk: int, poison: int, poison_back: bool = False):
    """Launch over ``buf`` (the kv_indptr ``kvfence.engine.tables.Guarded`` of the draft's runner) for a launch of
    ``num_seqs`` requests whose ``positions`` (``num_seqs * topk`` of them) are on the device."""
    span = max(buf.stride, buf.front, buf.tail)
    verify_indptr_kernel[(triton.cdiv(span, BLOCK_COLUMNS), buf.rows + 2)](
        buf.flat, positions, counts, buf.front, buf.rows, buf.table.width, buf.stride, buf.tail, num_seqs, topk,
        (buf.canary_seed * 0x9E37) & ((1 << 30) - 1), poison,
        BLOCK=BLOCK_COLUMNS, GUARD_COL0=buf.column0_canary, POISON_BACK=poison_back,
    )
