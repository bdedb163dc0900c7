"""Count changed elements of the kv_indices allocation outside the write set.

Every element that the contract does not write must still hold what the harness put there before
the launch: the positional canary in guards (front, after each row, tail) and poison in a row past
its used length ``U(s)``. Written elements (row ``s``, columns ``[0, U(s))``) are skipped:
``segments.py`` checks them. (kv_indptr is small; ``indptr.py`` checks all of it in one pass.)

Grid ``(P, rows + 2)``: programs ``(0..P-1, s)`` with ``s < rows`` check row ``s`` from its first
unwritten column plus the guard after it (``stride`` columns in all); ``s == rows`` is the front guard
and ``s == rows + 1`` the tail. Program ``p`` takes BLOCK-wide pieces ``p, p + P, p + 2P, ...`` of the
region, counted from its start and beginning with the piece that holds ``U(s)``: the work follows the
slack wherever ``U(s)`` puts it. A full row costs each program two scalar loads; a row that is all
slack is read by all ``P`` programs in step. ``sum(L)`` of the launch comes from the case's staging row
(its last column, ``harness/contracts/draft/device_verify.py``), not from a loop over requests. (P is on the
first axis: it can exceed the 65,535 programs CUDA allows on the others.) Adds the count to
``counts[slot]``.

History (H200, this pass alone on the large case; benchmarks/results): one program per 1,024 columns,
76 us, nearly all of it programs with nothing to check (run 13); one per 16,384 columns, 19 us (run 15);
one per 4,096 columns, 13 us, and 26 us instead of 44 for the small config's whole fused case graph,
whose rows are mostly slack (runs 16-17); at most ``PROGRAMS_PER_ROW`` strided programs per row, 9 us,
the small case's graph 23 us (runs 18-19).
"""

import triton
import triton.language as tl

BLOCK_ELEMENTS = 1024
#: Programs per row (fewer when a row has fewer blocks). H200 run 18 (benchmarks/verify_variants.py):
#: 1,024 costs the large full case what 256 does (verify graph 114 us) and reads an all-slack row faster
#: (140 against 170 us); 4,096 slows the full case (127 us), 64 the slack (453 us).
PROGRAMS_PER_ROW = 1024


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['slot', 'front', 'rows', 'width', 'stride', 'tail', 'num_seqs', 'topk', 'seed_term',
                               'poison', 'rows_width'])
def verify_outside_kernel(
    storage, counts, staging, cursor, rows_width, slot, front, rows, width, stride, tail, num_seqs, topk, seed_term,
    poison, BLOCK: tl.constexpr,
):
    p = tl.program_id(0)
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
    programs = tl.num_programs(0)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for c0 in range((used // BLOCK + p) * BLOCK, count, programs * BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        # (cols < width*is_row) rather than is_row & (...): the interpreter keeps a scalar&block mask as int32.
        live = cols < width * is_row.to(tl.int32)
        check = (cols >= used) & (cols < count)
        i = (base + cols).to(tl.int64)
        # kvfence.engine.tables.seeded_canaries; seed_term = (canary_seed * 0x9E37) mod 2**30, precomputed on
        # the host.
        h = (i * 0x2545F491 + seed_term) & ((1 << 30) - 1)
        expected = tl.where(live, poison, -(h + 2))
        found = tl.load(storage + i, mask=check, other=0).to(tl.int64)
        bad += (check & (found != expected)).to(tl.int32)
    wrong = tl.sum(bad)
    # Only a non-zero count is added: thousands of programs adding 0 to one address serialise on it.
    if wrong > 0:
        tl.atomic_add(counts + slot, wrong)


def verify_outside(buf, *, counts, slot: int, rows, cursor, num_seqs: int, topk: int, poison: int):
    """Launch over the whole allocation of ``buf`` (the kv_indices ``kvfence.engine.tables.Guarded`` of the runner)
    for a launch of ``num_seqs`` requests; ``rows[cursor, -1]`` is the sum of their (padded) lengths.
    The canary seed is the buffer's own."""
    span = max(buf.stride, buf.front, buf.tail)
    grid = (min(triton.cdiv(span, BLOCK_ELEMENTS), PROGRAMS_PER_ROW), buf.rows + 2)
    verify_outside_kernel[grid](
        buf.flat, counts, rows, cursor, rows.shape[1], slot, buf.front, buf.rows, buf.table.width, buf.stride, buf.tail,
        num_seqs, topk, (buf.canary_seed * 0x9E37) & ((1 << 30) - 1), poison, BLOCK=BLOCK_ELEMENTS,
    )
