"""kvfence's own Triton implementation of the window rail, ``generate_draft_decode_window_kv_indices``
(docs/contract.md §6). Written from the contract, not from upstream code.

For a model's sliding-window layers, step ``s`` of branch ``(b, k)`` attends to the last
``min(L_b + n, w)`` of the ``L_b + n`` tokens it sees: its committed prefix, then its own draft chain.
Grid ``(num_steps, num_seqs, topk)``; program ``(s, b, k)``, ``z = b*topk + k``, writes its window at
``B(s, z) = sum(min(positions[i] + n, w) for i < z)`` of step row ``s``, and one column of the indptr.

ABI: the first 13 parameters are the classic ABI of docs/contract.md §2 (``pool_len`` is the row
stride), then the constexpr ``window``, then §6's ``ENTRY_PAGE_SIZE``, ``v2p`` and ``TRANSLATE`` with
defaults; tokens are read through ``kvfence.kernels.draft.draft_kv_indices.read_tokens``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import read_tokens

#: Prefix tokens one program copies per loop iteration.
TOKEN_BLOCK = 512


@triton.jit(do_not_specialize=['pool_len', 'kv_indices_stride', 'kv_indptr_stride'])
def generate_draft_decode_window_kv_indices(
    req_pool_indices,  # [num_seqs] pool row of each request
    req_to_token,  # [pool_rows, pool_len] token position (div ENTRY_PAGE_SIZE) -> KV slot id
    paged_kernel_lens,  # [num_seqs] committed length L_b
    window_kv_indices,  # step row s starts at window_kv_indices + s * kv_indices_stride
    window_kv_indptr,  # step row s starts at window_kv_indptr + s * kv_indptr_stride
    positions,  # [num_seqs * topk]
    pool_len,  # req_to_token's row stride
    kv_indices_stride,
    kv_indptr_stride,
    bs_upper: tl.constexpr,  # next_pow2(num_seqs) (part of the ABI; the rail sums over branches)
    iter_upper: tl.constexpr,  # next_pow2(num_steps)
    num_tokens_upper: tl.constexpr,  # next_pow2(num_seqs * topk)
    page_size: tl.constexpr,
    window: tl.constexpr,  # w: tokens a sliding-window layer attends to
    ENTRY_PAGE_SIZE: tl.constexpr = 1,
    v2p=None,
    TRANSLATE: tl.constexpr = False,
    BLOCK: tl.constexpr = TOKEN_BLOCK,
):
    s = tl.program_id(0)
    b = tl.program_id(1)
    k = tl.program_id(2)
    num_steps = tl.num_programs(0)
    num_seqs = tl.num_programs(1)
    topk = tl.num_programs(2)
    n = s + 1
    z = b * topk + k

    L = tl.load(paged_kernel_lens + b)
    rpi = tl.load(req_pool_indices + b)
    src = req_to_token + rpi * pool_len

    # The window over prefix-then-chain: total = L + n tokens, keep the last wl = min(total, w) from
    # position start = total - wl. Prefix part: P0 = min(start, L) .. L-1; chain part from c0.
    total = L + n
    wl = tl.minimum(total, window)
    start = total - wl
    prefix_from = tl.minimum(start, L)
    prefix_len = L - prefix_from
    chain_from = tl.maximum(start - L, 0)

    # B(s, z): window lengths of the branches before z, from positions (as the indptr).
    offs_p = tl.arange(0, num_tokens_upper)
    pos = tl.load(positions + offs_p, mask=offs_p < z, other=0)
    base = tl.sum(tl.where(offs_p < z, tl.minimum(pos + n, window), 0))
    out = window_kv_indices + s * kv_indices_stride + base

    # Prefix part: row[B + t] = token(P0 + t) for t in [0, PL), BLOCK tokens at a time.
    for t0 in range(0, prefix_len, BLOCK):
        offs_t = t0 + tl.arange(0, BLOCK)
        mask_t = offs_t < prefix_len
        tok = read_tokens(src, prefix_from + offs_t, mask_t, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)
        tl.store(out + offs_t, tok.to(window_kv_indices.dtype.element_ty), mask=mask_t)

    # Chain part: row[B + PL + j] = token(e_k + c0 + j) for c0 + j < n; e_k as in §2.
    if page_size == 1:
        draft_start = L + k * num_steps
    else:
        last = L % page_size
        pages_per_branch = (last + num_steps + page_size - 1) // page_size
        draft_start = tl.where(topk == 1, L + k * num_steps,
                               (L - last) + k * pages_per_branch * page_size + last)
    offs_j = tl.arange(0, iter_upper)
    mask_j = offs_j < n - chain_from
    chain = read_tokens(src, draft_start + chain_from + offs_j, mask_j, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)
    tl.store(out + prefix_len + offs_j, chain.to(window_kv_indices.dtype.element_ty), mask=mask_j)

    # window_kv_indptr[s, z] = B(s, z), z == 0 writing column bs with B(s, bs); column 0 is never written.
    column = tl.where(z == 0, num_seqs * topk, z)
    pos_all = tl.load(positions + offs_p, mask=offs_p < column, other=0)
    total_before = tl.sum(tl.where(offs_p < column, tl.minimum(pos_all + n, window), 0))
    tl.store(window_kv_indptr + s * kv_indptr_stride + column, total_before.to(window_kv_indptr.dtype.element_ty))


def launch(kernel, *, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps,
           page_size, window: int, **constexprs):
    """Launch a rail ``kernel`` (ours or one of the same ABI) over the 2-D ``(num_steps, .)`` output views.

    ``window`` is the 14th (constexpr) argument; ``constexprs`` are §6's ``ENTRY_PAGE_SIZE``, ``v2p``,
    ``TRANSLATE`` when a config sets them."""
    num_seqs = seq_lens.shape[0]
    kernel[(num_steps, num_seqs, topk)](
        req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions,
        req_to_token.shape[1], kv_indices.stride(0), kv_indptr.stride(0),
        triton.next_power_of_2(num_seqs), triton.next_power_of_2(num_steps),
        triton.next_power_of_2(num_seqs * topk), page_size, window, **constexprs)
