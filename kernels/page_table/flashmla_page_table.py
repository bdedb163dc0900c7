"""kvfence's FlashMLA page-table builder, written from docs/contract.md §9 (the ``flashmla`` ABI).

One program per (request ``b``, page block ``blk``): the grid is ``(num_seqs, ceil(width / PAGES_PER_BLOCK))``,
``PAGES_PER_BLOCK = BLOCK_TOKENS // PAGED_SIZE``. Program ``(b, blk)`` fills the pages
``blk*PAGES_PER_BLOCK .. (blk+1)*PAGES_PER_BLOCK - 1`` of row ``b`` that the request has
(``page < ceil(L_b / PAGED_SIZE)``): the page id of page ``j`` is the slot of its first token,
``req_to_token[rpi_b, start_b + j*PAGED_SIZE]``, divided by the page size. Like upstream it bounds its
stores by the request's length only, never by the row width: that is the contract, and the row width
the launch needs is the caller's sizing (§9, "Sizing").
"""

import triton
import triton.language as tl

#: Tokens one program covers along grid axis 1 (so ``BLOCK_TOKENS // PAGED_SIZE`` pages).
BLOCK_TOKENS = 4096
_BLOCK_TOKENS = tl.constexpr(BLOCK_TOKENS)


@triton.jit
def create_flashmla_kv_indices_triton(
    req_to_token,            # [pool_rows, row stride] token position -> KV slot
    req_pool_indices,        # [num_seqs]
    page_kernel_lens,        # [num_seqs] tokens per request
    kv_start_idx,            # [num_seqs] first token position, or None (0)
    kv_indices,              # [num_seqs, row stride] output page ids
    req_to_token_stride: tl.constexpr,
    kv_indices_stride: tl.constexpr,
    PAGED_SIZE: tl.constexpr = 64,
):
    PAGES_PER_BLOCK: tl.constexpr = _BLOCK_TOKENS // PAGED_SIZE
    b = tl.program_id(axis=0)
    blk = tl.program_id(axis=1)

    pool_row = tl.load(req_pool_indices + b).to(tl.int64)
    start = 0
    if kv_start_idx:
        start = tl.load(kv_start_idx + b).to(tl.int32)
    length = tl.load(page_kernel_lens + b).to(tl.int32)
    num_pages = tl.cdiv(length, PAGED_SIZE)

    page = blk * PAGES_PER_BLOCK + tl.arange(0, PAGES_PER_BLOCK)
    mask = page < num_pages
    # 64-bit: a long pool row times the stride passes 2**31
    first_token = start + page.to(tl.int64) * PAGED_SIZE
    slot = tl.load(req_to_token + pool_row * req_to_token_stride + first_token, mask=mask)
    tl.store(kv_indices + b * kv_indices_stride + page, slot // PAGED_SIZE, mask=mask)


def num_blocks(width: int, page_size: int) -> int:
    """Grid axis 1: page blocks spanning a row of ``width`` pages (upstream's helper does the same)."""
    per_block = BLOCK_TOKENS // page_size
    return (width + per_block - 1) // per_block


def launch(kernel, *, req_to_token, req_pool_indices, seq_lens, kv_start, kv_indices, width, page_size):
    """The ``flashmla`` ABI: grid ``(num_seqs, num_blocks(width, page_size))``, strides from the tensors."""
    grid = (seq_lens.shape[0], num_blocks(width, page_size))
    kernel[grid](req_to_token, req_pool_indices, seq_lens, kv_start, kv_indices,
                 req_to_token.stride(0), kv_indices.stride(0), PAGED_SIZE=page_size)
