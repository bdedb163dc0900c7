"""Mutant (kernel): step-major draft-slot layout.

Bug class (SPEC §5): wrong draft-slot layout. Draft token ``j`` of branch ``k`` is read from
``req_to_token[rpi, L + j*topk + k]`` (step-major) instead of ``L + k*num_steps + j`` (branch-major).
Needs ``topk >= 2`` and ``num_steps >= 2`` (with one of them 1 the two layouts coincide), page size 1.
"""

import triton
import triton.language as tl

KIND = "kernel"
#: ``strategies.configs`` pins under which the bug shows (the mutation self-test fuzzes these).
PINS = dict(topk=2, num_steps=2, page_size=1, ctx=8, max_bs=2)


@triton.jit
def generate_draft_decode_kv_indices(
    req_pool_indices,
    req_to_token,
    paged_kernel_lens,
    kv_indices,
    kv_indptr,
    positions,
    pool_len,
    kv_indices_stride,
    kv_indptr_stride,
    bs_upper: tl.constexpr,
    iter_upper: tl.constexpr,
    num_tokens_upper: tl.constexpr,
    page_size: tl.constexpr,
    PREFIX_BLOCK: tl.constexpr = 64,
):
    step = tl.program_id(0)
    req = tl.program_id(1)
    branch = tl.program_id(2)
    topk = tl.num_programs(2)
    n = step + 1

    seq_len = tl.load(paged_kernel_lens + req)
    pool_row = tl.load(req_pool_indices + req)
    r = tl.arange(0, bs_upper)
    before = tl.sum(tl.load(paged_kernel_lens + r, mask=r < req, other=0))
    row_base = kv_indices + step * kv_indices_stride
    seg = row_base + topk * before + req * n * topk + branch * (seq_len + n)
    src = req_to_token + pool_row * pool_len

    for t0 in range(0, seq_len, PREFIX_BLOCK):
        t = t0 + tl.arange(0, PREFIX_BLOCK)
        tl.store(seg + t, tl.load(src + t, mask=t < seq_len), mask=t < seq_len)

    j = tl.arange(0, iter_upper)
    # BUG: step-major slots L + j*topk + k instead of branch-major L + k*num_steps + j
    tl.store(seg + seq_len + j, tl.load(src + seq_len + j * topk + branch, mask=j < n), mask=j < n)

    z = req * topk + branch
    z = tl.where(z == 0, tl.num_programs(1) * topk, z)
    p = tl.arange(0, num_tokens_upper)
    total = tl.sum(tl.load(positions + p, mask=p < z, other=0)) + z * n
    tl.store(kv_indptr + step * kv_indptr_stride + z, total.to(kv_indptr.dtype.element_ty))
