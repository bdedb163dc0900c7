"""Count changed elements of the kv_indices allocation outside the write set.

Every element that the contract does not write must still hold what the harness put there before
the launch: the positional canary in guards (front, after each row, tail) and poison in a row past
its used length ``U(s)``. Written elements (row ``s``, columns ``[0, U(s))``) are skipped:
``segments.py`` checks them. (kv_indptr is small; ``indptr.py`` checks all of it in one pass.)

Grid ``(chunks, rows + 2)``: program ``(c, s)`` with ``s < rows`` checks chunk ``c`` (``CHUNK`` columns)
of row ``s`` plus the guard after it (``stride`` columns in all); ``s == rows`` is the front guard and
``s == rows + 1`` the tail. (Chunks on the first axis: a row can need more than the 65,535 programs
CUDA allows on the others.) A program loops over its chunk from the first unwritten column, so a
chunk wholly inside the written part costs two scalar loads: ``sum(L)`` of the launch comes from the
case's staging row (its last column, ``harness/verifying/device_verify.py``), not from a loop over requests.
(One program per 1,024 columns measured 76 us on the large case of an H200 when this pass ran alone
after the others, nearly all of it programs that had nothing to check; it now runs beside the write-set
pass, ``harness/verifying/device_verify.py``.) Adds the count to ``counts[slot]``.
"""

import triton
import triton.language as tl

BLOCK_ELEMENTS = 1024
#: Columns per program: 4 blocks. On an H200 (run 16, benchmarks/verify_variants.py) 4 blocks beat 16
#: and 64 on every case timed: the small config's fused case graph 26 us against 44 (its rows are mostly
#: slack, and fewer blocks per program means fewer serial loads on the longest program), the large case's
#: verify graph 119 against 123 us, a large all-slack row 117 against 124 (16) and 166 (64).
CHUNK = 4 * BLOCK_ELEMENTS


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['slot', 'front', 'rows', 'width', 'stride', 'tail', 'num_seqs', 'topk', 'seed_term',
                               'poison', 'rows_width'])
def verify_outside_kernel(
    storage, counts, staging, cursor, rows_width, slot, front, rows, width, stride, tail, num_seqs, topk, seed_term,
    poison, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
):
    c = tl.program_id(0)
    s = tl.program_id(1)

    # Branch-free region selection: rows, then the front guard (s == rows), then the tail.
    is_row = s < rows
    is_front = s == rows
    base = tl.where(is_row, front + s * stride, tl.where(is_front, 0, front + rows * stride))
    count = tl.where(is_row, stride, tl.where(is_front, front, tail))

    # Written columns of row s: [0, U(s)) with U(s) = topk*sum(L) + bs*(s+1), clipped to the width
    # (guards have none).
    sum_lens = tl.load(staging + tl.load(cursor) * rows_width + rows_width - 1)  # staged by the host
    used = tl.where(is_row, tl.minimum(topk * sum_lens + num_seqs * topk * (s + 1), width), 0)
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, count)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for c0 in range(tl.maximum(lo, used), hi, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        # (cols < width*is_row) rather than is_row & (...): the interpreter keeps a scalar&block mask as int32.
        live = cols < width * is_row.to(tl.int32)
        check = cols < hi
        i = (base + cols).to(tl.int64)
        # harness.running.guarded.canary_values; seed_term = (canary_seed * 0x9E37) mod 2**30, precomputed on the host.
        h = (i * 0x2545F491 + seed_term) & ((1 << 30) - 1)
        expected = tl.where(live, poison, -(h + 2))
        found = tl.load(storage + i, mask=check, other=0).to(tl.int64)
        bad += (check & (found != expected)).to(tl.int32)
    wrong = tl.sum(bad)
    # Only a non-zero count is added: thousands of programs adding 0 to one address serialise on it.
    if wrong > 0:
        tl.atomic_add(counts + slot, wrong)


def verify_outside(buf, *, counts, slot: int, rows, cursor, num_seqs: int, topk: int, poison: int):
    """Launch over the whole allocation of ``buf`` (the kv_indices ``harness.running.guarded.GuardedBuffer``)
    for a launch of ``num_seqs`` requests; ``rows[cursor, -1]`` is the sum of their (padded) lengths.
    The canary seed is the buffer's own."""
    span = max(buf.stride, buf.front, buf.tail)
    grid = (triton.cdiv(span, CHUNK), buf.rows + 2)
    verify_outside_kernel[grid](
        buf.storage, counts, rows, cursor, rows.shape[1], slot, buf.front, buf.rows, buf.width, buf.stride, buf.tail,
        num_seqs, topk, (buf.canary_seed * 0x9E37) & ((1 << 30) - 1), poison, BLOCK=BLOCK_ELEMENTS, CHUNK=CHUNK,
    )
