"""Count changed elements of the kv_indices allocation outside the write set.

Every element that the contract does not write must still hold what the harness put there before
the launch: the positional canary in guards (front, after each row, tail) and poison in a row past
its used length ``U(s)``. Written elements (row ``s``, columns ``[0, U(s))``) are skipped:
``segments.py`` checks them. (kv_indptr is small; ``indptr.py`` checks all of it in one pass.)

Grid ``(blocks, rows + 2)``: program ``(blk, s)`` with ``s < rows`` checks columns ``blk*BLOCK ...`` of
row ``s`` plus the guard after it (``stride`` columns in all); ``s == rows`` is the front guard and
``s == rows + 1`` the tail. (Blocks on the first axis: a row can need more than the 65,535 blocks
CUDA allows on the others.) ``sum(L)`` of the launch comes from the case's staging row (its last
column, ``harness/device_verify.py``): one load per program instead of a loop over the requests. No division per element, and a block wholly inside the written part of
a row loads nothing (all its lanes are masked). Adds the count to ``counts[slot]``.
"""

import triton
import triton.language as tl

BLOCK_ELEMENTS = 1024


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['slot', 'front', 'rows', 'width', 'stride', 'tail', 'num_seqs', 'topk', 'seed_term',
                               'poison', 'rows_width'])
def verify_outside_kernel(
    storage, counts, staging, cursor, rows_width, slot, front, rows, width, stride, tail, num_seqs, topk, seed_term,
    poison, BLOCK: tl.constexpr,
):
    blk = tl.program_id(0)
    s = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)

    # Written columns of row s: [0, U(s)) with U(s) = topk*sum(L) + bs*(s+1), clipped to the width.
    total = tl.load(staging + tl.load(cursor) * rows_width + rows_width - 1)  # sum(L), staged by the host
    used = tl.minimum(topk * total + num_seqs * topk * (s + 1), width)

    # Branch-free region selection: rows, then the front guard (s == rows), then the tail.
    is_row = s < rows
    is_front = s == rows
    base = tl.where(is_row, front + s * stride, tl.where(is_front, 0, front + rows * stride))
    count = tl.where(is_row, stride, tl.where(is_front, front, tail))
    # (cols < width*is_row) rather than is_row & (...): the interpreter keeps a scalar&block mask as int32.
    live = cols < width * is_row.to(tl.int32)
    written = live & (cols < used)
    in_range = cols < count
    i = (base + cols).to(tl.int64)

    # harness.guarded.canary_values; seed_term = (canary_seed * 0x9E37) mod 2**30, precomputed on the host.
    h = (i * 0x2545F491 + seed_term) & ((1 << 30) - 1)
    expected = tl.where(live, poison, -(h + 2))
    check = in_range & ~written
    found = tl.load(storage + i, mask=check, other=0).to(tl.int64)
    bad = (check & (found != expected)).to(tl.int32)
    total = tl.sum(bad)
    # Only a non-zero count is added: tens of thousands of programs adding 0 to one address serialise
    # on it (78 us of the large case's check on an H200 before this).
    if total > 0:
        tl.atomic_add(counts + slot, total)


def verify_outside(buf, *, counts, slot: int, rows, cursor, num_seqs: int, topk: int, poison: int):
    """Launch over the whole allocation of ``buf`` (the kv_indices ``harness.guarded.GuardedBuffer``)
    for a launch of ``num_seqs`` requests; ``rows[cursor, -1]`` is the sum of their (padded) lengths.
    The canary seed is the buffer's own."""
    span = max(buf.stride, buf.front, buf.tail)
    grid = (triton.cdiv(span, BLOCK_ELEMENTS), buf.rows + 2)
    verify_outside_kernel[grid](
        buf.storage, counts, rows, cursor, rows.shape[1], slot, buf.front, buf.rows, buf.width, buf.stride, buf.tail,
        num_seqs, topk, (buf.canary_seed * 0x9E37) & ((1 << 30) - 1), poison, BLOCK=BLOCK_ELEMENTS,
    )
