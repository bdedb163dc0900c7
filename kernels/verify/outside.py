"""Count changed elements outside the write set of one guarded buffer.

Every element of the allocation that the contract does not write must still hold what the harness
put there before the launch: the positional canary in guards (front, after each row, tail), poison in
a row past its used length ``U(s)``, and the canary in column 0 when the buffer guards it (kv_indptr). Written
elements (row ``s``, columns ``[first_col, U(s))``) are skipped: ``segments.py`` checks them.

Grid ``(rows + 2, blocks)``: program ``(s, blk)`` with ``s < rows`` checks columns ``blk*BLOCK ...`` of
row ``s`` plus the guard after it (``stride`` columns in all); ``s == rows`` is the front guard and
``s == rows + 1`` the tail. No division per element, and a block wholly inside the written part of
a row loads nothing (all its lanes are masked). Adds the count to ``counts[slot]``.
"""

import triton
import triton.language as tl

BLOCK_ELEMENTS = 1024


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['slot', 'front', 'rows', 'width', 'stride', 'tail', 'num_seqs', 'topk', 'seed_term', 'first_col', 'poison'])
def verify_outside_kernel(
    storage, counts, seq_lens, slot, front, rows, width, stride, tail, num_seqs, topk, seed_term, first_col, poison,
    LANES: tl.constexpr, GUARD_COL0: tl.constexpr, SUM_LENS: tl.constexpr, BLOCK: tl.constexpr,
):
    s = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)

    # Written columns of row s: [first_col, used). kv_indices: U(s) = topk*sum(L) + bs*(s+1);
    # kv_indptr: columns 1..bs.
    bs = num_seqs * topk
    if SUM_LENS:
        total = tl.zeros([LANES], dtype=tl.int64)  # sum(L), LANES requests at a time
        for lane0 in range(0, num_seqs, LANES):
            offs_b = lane0 + tl.arange(0, LANES)
            total += tl.load(seq_lens + offs_b, mask=offs_b < num_seqs, other=0).to(tl.int64)
        used = topk * tl.sum(total) + bs * (s + 1)
    else:
        used = bs + 1
    used = tl.minimum(used, width)

    # Branch-free region selection: rows, then the front guard (s == rows), then the tail.
    is_row = s < rows
    is_front = s == rows
    base = tl.where(is_row, front + s * stride, tl.where(is_front, 0, front + rows * stride))
    count = tl.where(is_row, stride, tl.where(is_front, front, tail))
    # (cols < width*is_row) rather than is_row & (...): the interpreter keeps a scalar&block mask as int32.
    live = cols < width * is_row.to(tl.int32)
    written = live & (cols >= first_col) & (cols < used)
    in_range = cols < count
    i = (base + cols).to(tl.int64)

    # harness.guarded.canary_values; seed_term = (canary_seed * 0x9E37) mod 2**30, precomputed on the host.
    h = (i * 0x2545F491 + seed_term) & ((1 << 30) - 1)
    expected = tl.where(live, poison, -(h + 2))
    if GUARD_COL0:
        expected = tl.where(live & (cols == 0), -(h + 2), expected)  # the canary stays in column 0
    check = in_range & ~written
    found = tl.load(storage + i, mask=check, other=0).to(tl.int64)
    bad = (check & (found != expected)).to(tl.int32)
    tl.atomic_add(counts + slot, tl.sum(bad))


def verify_outside(buf, *, counts, slot: int, seq_lens, topk: int, is_indptr: bool, poison: int):
    """Launch over the whole allocation of ``buf`` (a ``harness.guarded.GuardedBuffer``).

    ``seq_lens`` are the launch's (padded) lengths; the canary seed is the buffer's own.
    """
    num_seqs = seq_lens.shape[0]
    span = max(buf.stride, buf.front, buf.tail)
    grid = (buf.rows + 2, triton.cdiv(span, BLOCK_ELEMENTS))
    verify_outside_kernel[grid](
        buf.storage, counts, seq_lens, slot, buf.front, buf.rows, buf.width, buf.stride, buf.tail, num_seqs, topk,
        (buf.canary_seed * 0x9E37) & ((1 << 30) - 1), 1 if is_indptr else 0, poison,
        LANES=128, GUARD_COL0=buf.guard_column0, SUM_LENS=not is_indptr,
        BLOCK=BLOCK_ELEMENTS,
    )
