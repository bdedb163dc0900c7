"""kvfence's own Triton implementation of the EAGLE draft-decode kv-indices kernel (docs/contract.md §2).

Written from the contract, not from upstream code. Two launch shapes share one kernel:

* classic (``NUM_STEPS == 0``): grid ``(num_steps, num_seqs, topk)``, program ``(s, b, k)``;
* token-block (``NUM_STEPS > 0``): grid ``(NUM_STEPS * blocks, num_seqs, topk)``; axis 0 packs the step
  and a 512-wide token block, so long prefixes are copied by several programs. Output is bit-identical.

The first 13 parameters are the classic ABI, in the order of docs/contract.md §2; ``BLOCK`` and
``NUM_STEPS`` are trailing constexprs with defaults, so a classic 13-argument launch works unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Prefix tokens one program copies per loop iteration (and, in the token-block variant, per block).
TOKEN_BLOCK = 512


# Runtime sizes are not specialised (== 1, multiple of 16): one variant per constexpr set.
@triton.jit(do_not_specialize=['pool_len', 'kv_indices_stride', 'kv_indptr_stride'])
def generate_draft_decode_kv_indices(
    req_pool_indices,  # [num_seqs] pool row of each request
    req_to_token,  # [pool_rows, pool_len] token position -> KV slot id
    paged_kernel_lens,  # [num_seqs] committed length L_b
    kv_indices,  # step row s starts at kv_indices + s * kv_indices_stride
    kv_indptr,  # step row s starts at kv_indptr + s * kv_indptr_stride
    positions,  # [num_seqs * topk]
    pool_len,
    kv_indices_stride,
    kv_indptr_stride,
    bs_upper: tl.constexpr,  # next_pow2(num_seqs)
    iter_upper: tl.constexpr,  # next_pow2(num_steps)
    num_tokens_upper: tl.constexpr,  # next_pow2(num_seqs * topk)
    page_size: tl.constexpr,
    BLOCK: tl.constexpr = TOKEN_BLOCK,
    NUM_STEPS: tl.constexpr = 0,
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

    L = tl.load(paged_kernel_lens + b)
    if blk > 0 and blk * BLOCK >= L:
        return  # token-block variant: this block has no prefix tokens to copy
    rpi = tl.load(req_pool_indices + b)

    # C_b: lengths of the requests before b (exclusive prefix sum).
    offs_b = tl.arange(0, bs_upper)
    lens_before = tl.load(paged_kernel_lens + offs_b, mask=offs_b < b, other=0)
    prefix_sum = tl.sum(lens_before)

    # O(s, b, k) = topk*C_b + b*n*topk + k*(L_b + n): this program's segment of step row s.
    out = kv_indices + s * kv_indices_stride + topk * prefix_sum + b * n * topk + k * (L + n)
    src = req_to_token + rpi * pool_len

    # Prefix copy: row[O + t] = req_to_token[rpi, t] for t in [0, L), BLOCK tokens at a time.
    for start in range(blk * BLOCK, L, num_blocks * BLOCK):
        offs_t = start + tl.arange(0, BLOCK)
        mask_t = offs_t < L
        tok = tl.load(src + offs_t, mask=mask_t)
        tl.store(out + offs_t, tok, mask=mask_t)

    if blk == 0:
        # Draft tokens: row[O + L + j] = req_to_token[rpi, e_k + j] for j in [0, n).
        if page_size == 1:
            draft_start = L + k * num_steps
        else:
            last = L % page_size
            pages_per_branch = (last + num_steps + page_size - 1) // page_size
            paged_start = (L - last) + k * pages_per_branch * page_size + last
            # topk == 1 keeps the flat layout even with pages.
            draft_start = tl.where(topk == 1, L + k * num_steps, paged_start)
        offs_j = tl.arange(0, iter_upper)
        mask_j = offs_j < n
        draft = tl.load(src + draft_start + offs_j, mask=mask_j)
        tl.store(out + L + offs_j, draft, mask=mask_j)

        # kv_indptr[s, z] = sum(positions[0:z]) + z*n, z = b*topk + k, with z == 0 moved to bs:
        # column 0 is never written (production relies on a zeroed buffer).
        z = b * topk + k
        z = tl.where(z == 0, num_seqs * topk, z)
        offs_p = tl.arange(0, num_tokens_upper)
        pos = tl.load(positions + offs_p, mask=offs_p < z, other=0)
        tl.store(kv_indptr + s * kv_indptr_stride + z, (tl.sum(pos) + z * n).to(kv_indptr.dtype.element_ty))


def launch(kernel, *, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps,
           page_size, token_blocks: int = 0):
    """Launch ``kernel`` (ours or any classic-ABI kernel) over the 2-D ``(num_steps, .)`` output views.

    ``kv_indices.stride(0)`` is the distance between step rows. ``token_blocks > 0`` selects the
    token-block variant with that many 512-wide blocks per step (only for kernels with ``NUM_STEPS``).
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
        kernel[(num_steps * token_blocks, num_seqs, topk)](*args, NUM_STEPS=num_steps)
    else:
        kernel[(num_steps, num_seqs, topk)](*args)


def token_blocks_for(max_seq_len: int) -> int:
    """Blocks the token-block variant needs so that every block of the longest prefix has a program."""
    return max(1, triton.cdiv(max_seq_len, TOKEN_BLOCK))
