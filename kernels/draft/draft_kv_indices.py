"""kvfence's own Triton implementation of the EAGLE draft-decode kv-indices kernel (docs/contract.md §2, §6).

Written from the contract, not from upstream code. Two launch shapes share one kernel:

* classic (``NUM_STEPS == 0``): grid ``(num_steps, num_seqs, topk)``, program ``(s, b, k)``;
* token-block (``NUM_STEPS > 0``): grid ``(NUM_STEPS * blocks, num_seqs, topk)``; axis 0 packs the step
  and a 512-wide token block, so long prefixes are copied by several programs. Output is bit-identical.

ABI choice: the first 13 parameters are the classic ABI, in the order of docs/contract.md §2 (the 7th is
``pool_len``, which for kvfence's contiguous table is also the row stride §6 passes at runtime). The §6
family comes as trailing constexprs with defaults equal to §2: ``window_size = 0`` and ``sink_size = 0``
(sliding window with sinks), ``ENTRY_PAGE_SIZE = 1`` (page-granular req_to_token rows), ``v2p = None``
and ``TRANSLATE = False`` (page-table translation). A classic 13-argument launch works unchanged.
``read_tokens`` is the one token lookup of §6; ``kernels/draft/window_kv_indices.py`` (the window rail) uses it too.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Prefix tokens one program copies per loop iteration (and, in the token-block variant, per block).
TOKEN_BLOCK = 512


@triton.jit
def read_tokens(src, p, mask, v2p, page_size: tl.constexpr, ENTRY_PAGE_SIZE: tl.constexpr, TRANSLATE: tl.constexpr):
    """``token_b(p)`` of docs/contract.md §6 for the lanes ``p`` of one request's pool row ``src``."""
    if ENTRY_PAGE_SIZE == 1:
        ids = tl.load(src + p, mask=mask)
    else:
        # The row holds one entry per page of ENTRY_PAGE_SIZE tokens; 64-bit, as the contract says.
        entry = tl.load(src + p // ENTRY_PAGE_SIZE, mask=mask, other=0)
        ids = entry.to(tl.int64) * ENTRY_PAGE_SIZE + p % ENTRY_PAGE_SIZE
    if TRANSLATE:
        # Virtual id -> physical through v2p (one entry per page of page_size tokens). A negative id
        # reads as 0 and never loads v2p (that would read before the table); a negative result is 0.
        ids = ids.to(tl.int64)
        virtual = tl.maximum(ids, 0)
        page = tl.load(v2p + virtual // page_size, mask=mask & (ids >= 0), other=0)
        phys = page.to(tl.int64) * page_size + virtual % page_size
        ids = tl.where(ids < 0, 0, tl.maximum(phys, 0))
    return ids


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['pool_len', 'kv_indices_stride', 'kv_indptr_stride'])
def generate_draft_decode_kv_indices(
    req_pool_indices,  # [num_seqs] pool row of each request
    req_to_token,  # [pool_rows, pool_len] token position (div ENTRY_PAGE_SIZE) -> KV slot id
    paged_kernel_lens,  # [num_seqs] committed length L_b
    kv_indices,  # step row s starts at kv_indices + s * kv_indices_stride
    kv_indptr,  # step row s starts at kv_indptr + s * kv_indptr_stride
    positions,  # [num_seqs * topk]
    pool_len,  # req_to_token's row stride
    kv_indices_stride,
    kv_indptr_stride,
    bs_upper: tl.constexpr,  # next_pow2(num_seqs)
    iter_upper: tl.constexpr,  # next_pow2(num_steps)
    num_tokens_upper: tl.constexpr,  # next_pow2(num_seqs * topk)
    page_size: tl.constexpr,
    BLOCK: tl.constexpr = TOKEN_BLOCK,
    NUM_STEPS: tl.constexpr = 0,
    window_size: tl.constexpr = 0,  # §6: > 0 keeps sink_size first tokens and the most recent ones
    sink_size: tl.constexpr = 0,
    ENTRY_PAGE_SIZE: tl.constexpr = 1,  # §6: req_to_token holds one entry per page of this many tokens
    v2p=None,  # §6: virtual page -> physical page, read with TRANSLATE
    TRANSLATE: tl.constexpr = False,
):
    if NUM_STEPS == 0:
        s = tl.program_id(0)
        blk = 0
        num_blocks = 1
        num_steps = tl.num_programs(0)
    else:
        s = tl.program_id(0) % NUM_STEPS
        blk = tl.program_id(0) // NUM_STEPS
        num_blocks = tl.num_programs(0) // NUM_STEPS
        num_steps = NUM_STEPS
    b = tl.program_id(1)
    k = tl.program_id(2)
    num_seqs = tl.num_programs(1)
    topk = tl.num_programs(2)
    n = s + 1

    seq_len = tl.load(paged_kernel_lens + b)  # L_b, the whole committed prefix
    # L: the prefix this program copies, L'_b = min(L_b, window_size + sink_size) under a window (§6).
    if window_size > 0:
        L = tl.minimum(seq_len, window_size + sink_size)
    else:
        L = seq_len
    if blk > 0 and blk * BLOCK >= L:
        return  # token-block variant: this block has no prefix tokens to copy
    rpi = tl.load(req_pool_indices + b)

    # C_b: (clipped) lengths of the requests before b (exclusive prefix sum).
    offs_b = tl.arange(0, bs_upper)
    lens_before = tl.load(paged_kernel_lens + offs_b, mask=offs_b < b, other=0)
    if window_size > 0:
        lens_before = tl.minimum(lens_before, window_size + sink_size)
    prefix_sum = tl.sum(lens_before)

    # O(s, b, k) = topk*C_b + b*n*topk + k*(L_b + n): this program's segment of step row s.
    out = kv_indices + s * kv_indices_stride + topk * prefix_sum + b * n * topk + k * (L + n)
    src = req_to_token + rpi * pool_len

    # Prefix copy: row[O + t] = token(t) for t in [0, L), BLOCK tokens at a time. Under a window the
    # first S_b = min(S, L_b) are sinks and the rest the most recent, from R_b = L_b - (L'_b - S_b).
    sinks = tl.minimum(seq_len, sink_size)
    recent = seq_len - (L - sinks)
    for start in range(blk * BLOCK, L, num_blocks * BLOCK):
        offs_t = start + tl.arange(0, BLOCK)
        mask_t = offs_t < L
        if window_size > 0:
            src_t = tl.where(offs_t < sinks, offs_t, recent + offs_t - sinks)
        else:
            src_t = offs_t
        tok = read_tokens(src, src_t, mask_t, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)
        tl.store(out + offs_t, tok.to(kv_indices.dtype.element_ty), mask=mask_t)

    if blk == 0:
        # Draft tokens: row[O + L + j] = token(e_k + j) for j in [0, n); e_k from the full L_b.
        if page_size == 1:
            draft_start = seq_len + k * num_steps
        else:
            last = seq_len % page_size
            pages_per_branch = (last + num_steps + page_size - 1) // page_size
            paged_start = (seq_len - last) + k * pages_per_branch * page_size + last
            # topk == 1 keeps the flat layout even with pages.
            draft_start = tl.where(topk == 1, seq_len + k * num_steps, paged_start)
        offs_j = tl.arange(0, iter_upper)
        mask_j = offs_j < n
        draft = read_tokens(src, draft_start + offs_j, mask_j, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)
        tl.store(out + L + offs_j, draft.to(kv_indices.dtype.element_ty), mask=mask_j)

        # kv_indptr[s, z] = sum(positions[0:z]) + z*n, z = b*topk + k, with z == 0 moved to bs:
        # column 0 is never written (production relies on a zeroed buffer). Under a window each
        # position counts at most window_size + sink_size.
        z = b * topk + k
        z = tl.where(z == 0, num_seqs * topk, z)
        offs_p = tl.arange(0, num_tokens_upper)
        pos = tl.load(positions + offs_p, mask=offs_p < z, other=0)
        if window_size > 0:
            pos = tl.minimum(pos, window_size + sink_size)
        tl.store(kv_indptr + s * kv_indptr_stride + z, (tl.sum(pos) + z * n).to(kv_indptr.dtype.element_ty))


def launch(kernel, *, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps,
           page_size, token_blocks: int = 0, **constexprs):
    """Launch ``kernel`` (ours or any classic-ABI kernel) over the 2-D ``(num_steps, .)`` output views.

    ``kv_indices.stride(0)`` is the distance between step rows. ``token_blocks > 0`` selects the
    token-block variant with that many 512-wide blocks per step (only for kernels with ``NUM_STEPS``).
    ``constexprs``: §6 parameters by the kernel's names (``window_size``, ``ENTRY_PAGE_SIZE``, ``v2p``, ...),
    passed only when a config sets them (``kvfence.contracts.draft.targets.family_constexprs``).
    """
    num_seqs = seq_lens.shape[0]
    args = (
        req_pool_indices,
        req_to_token,
        seq_lens,
        kv_indices,
        kv_indptr,
        positions,
        req_to_token.shape[1],
        kv_indices.stride(0),
        kv_indptr.stride(0),
        triton.next_power_of_2(num_seqs),
        triton.next_power_of_2(num_steps),
        triton.next_power_of_2(num_seqs * topk),
        page_size,
    )
    if token_blocks:
        kernel[(num_steps * token_blocks, num_seqs, topk)](*args, NUM_STEPS=num_steps, **constexprs)
    else:
        kernel[(num_steps, num_seqs, topk)](*args, **constexprs)


def token_blocks_for(max_seq_len: int) -> int:
    """Blocks the token-block variant needs so that every block of the longest prefix has a program."""
    return max(1, triton.cdiv(max_seq_len, TOKEN_BLOCK))
