"""Mutant (kernel): the req_to_token row is taken from the request index, not ``req_pool_indices``.

Bug class (SPEC §2 reads): program ``(s, b, k)`` reads ``req_to_token[b, ...]`` instead of
``req_to_token[req_pool_indices[b], ...]``: another request's KV slots (and, for the audit, reads outside
the row the program owns). Shows whenever the pool rows are not in order (the fuzzer permutes them).
"""

import triton
import triton.language as tl

KIND = "kernel"
#: ``strategies.configs`` pins under which the bug shows (the mutation self-test fuzzes these).
PINS = dict(topk=1, num_steps=1, page_size=1, ctx=8, max_bs=2)


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
    num_steps = tl.num_programs(0)
    topk = tl.num_programs(2)
    n = step + 1

    seq_len = tl.load(paged_kernel_lens + req)
    r = tl.arange(0, bs_upper)
    before = tl.sum(tl.load(paged_kernel_lens + r, mask=r < req, other=0))
    row_base = kv_indices + step * kv_indices_stride
    seg = row_base + topk * before + req * n * topk + branch * (seq_len + n)
    src = req_to_token + req * pool_len  # BUG: the row is req_pool_indices[req]

    for t0 in range(0, seq_len, PREFIX_BLOCK):
        t = t0 + tl.arange(0, PREFIX_BLOCK)
        tl.store(seg + t, tl.load(src + t, mask=t < seq_len), mask=t < seq_len)

    if page_size == 1:
        first = seq_len + branch * num_steps
    else:
        last = seq_len % page_size
        per_branch = (last + num_steps + page_size - 1) // page_size
        paged = seq_len - last + branch * per_branch * page_size + last
        first = tl.where(topk == 1, seq_len + branch * num_steps, paged)
    j = tl.arange(0, iter_upper)
    tl.store(seg + seq_len + j, tl.load(src + first + j, mask=j < n), mask=j < n)

    z = req * topk + branch
    z = tl.where(z == 0, tl.num_programs(1) * topk, z)
    p = tl.arange(0, num_tokens_upper)
    total = tl.sum(tl.load(positions + p, mask=p < z, other=0)) + z * n
    tl.store(kv_indptr + step * kv_indptr_stride + z, total.to(kv_indptr.dtype.element_ty))
