"""Count elements of the write set that do not hold their expected value (docs/contract.md §2, recomputed).

Program ``(s, b, k)`` walks its own segment of step row ``s`` (only the part inside the row width;
what lies past it is the sizing bug and is seen by ``outside.py`` as guard or stray damage) and its
kv_indptr column, and adds its mismatch counts to ``counts[0]`` (kv_indices) and ``counts[1]``
(kv_indptr). An independent implementation of the contract, tested equal to the plain oracle.

With ``POISON_BACK`` each checked element is set back to the poison after its comparison: the
verification is also the re-poisoning for the next case. No constexpr depends on the batch: sums over requests and branches loop over ``LANES``-wide blocks and
the page size is a runtime value, so one compiled variant verifies every config (a fuzz run over
thousands of configs compiles the kernel under test per variant, never its verifier).
"""

import triton
import triton.language as tl

BLOCK_TOKENS = 512


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['pool_len', 'indices_stride', 'indptr_stride', 'width', 'num_steps', 'page_size', 'poison'])
def verify_segments_kernel(
    kv_indices, kv_indptr, req_to_token, seq_lens, req_pool_indices, positions, counts,
    pool_len, indices_stride, indptr_stride, width, num_steps, page_size, poison,
    LANES: tl.constexpr, BLOCK: tl.constexpr, POISON_BACK: tl.constexpr,
):
    s = tl.program_id(0)
    b = tl.program_id(1)
    k = tl.program_id(2)
    num_seqs = tl.num_programs(1)
    topk = tl.num_programs(2)
    n = s + 1

    L = tl.load(seq_lens + b).to(tl.int64)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    # C_b = L_0 + ... + L_{b-1}, LANES requests at a time.
    prefix_sum = tl.zeros([LANES], dtype=tl.int64)
    for lane0 in range(0, b, LANES):
        offs_b = lane0 + tl.arange(0, LANES)
        prefix_sum += tl.load(seq_lens + offs_b, mask=offs_b < b, other=0).to(tl.int64)
    start = topk * tl.sum(prefix_sum) + b * n * topk + k * (L + n)

    last = L % page_size
    pages = (last + num_steps + page_size - 1) // page_size
    paged = (L - last) + k * pages * page_size + last
    draft = tl.where((page_size == 1) | (topk == 1), L + k * num_steps, paged)

    src = req_to_token + row * pool_len
    out = kv_indices + s.to(tl.int64) * indices_stride
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for base in range(0, L + n, BLOCK):
        t = base + tl.arange(0, BLOCK)
        e = start + t
        check = (t < L + n) & (e < width)
        token = tl.where(t < L, t, draft + (t - L))
        expected = tl.load(src + token, mask=check, other=0)
        found = tl.load(out + e, mask=check, other=0)
        bad += (check & (found != expected)).to(tl.int32)
        if POISON_BACK:
            tl.store(out + e, tl.full([BLOCK], poison, tl.int32), mask=check)  # ready for the next case
    tl.atomic_add(counts + 0, tl.sum(bad))

    z = b * topk + k
    z = tl.where(z == 0, num_seqs * topk, z)
    # sum(positions[0:z]), LANES branches at a time.
    pos = tl.zeros([LANES], dtype=tl.int64)
    for lane0 in range(0, z, LANES):
        offs_p = lane0 + tl.arange(0, LANES)
        pos += tl.load(positions + offs_p, mask=offs_p < z, other=0).to(tl.int64)
    found_ptr = tl.load(kv_indptr + s.to(tl.int64) * indptr_stride + z).to(tl.int64)
    tl.atomic_add(counts + 1, (found_ptr != tl.sum(pos) + z * n).to(tl.int32))
    if POISON_BACK:
        tl.store(kv_indptr + s.to(tl.int64) * indptr_stride + z, poison)


#: Requests (and branches) summed per loop iteration.
LANES = 128


def verify_segments(*, kv_indices, kv_indptr, req_to_token, seq_lens, req_pool_indices, positions, counts,
                    topk: int, num_steps: int, page_size: int, poison_back: bool = False, poison: int = -1):
    """Launch over ``(num_steps, num_seqs, topk)``; ``kv_indices``/``kv_indptr`` are 2-D row views.

    ``poison_back``: each checked element is overwritten with ``poison`` after the comparison (one pass
    that reads and writes every element once), so the rows are ready for the next case without a
    separate re-poisoning pass.
    """
    num_seqs = seq_lens.shape[0]
    verify_segments_kernel[(num_steps, num_seqs, topk)](
        kv_indices, kv_indptr, req_to_token, seq_lens, req_pool_indices, positions, counts,
        req_to_token.shape[1], kv_indices.stride(0), kv_indptr.stride(0), kv_indices.shape[1], num_steps, page_size,
        poison, LANES=LANES, BLOCK=BLOCK_TOKENS, POISON_BACK=poison_back,
    )
