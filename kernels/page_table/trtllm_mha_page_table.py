"""kvfence's TRTLLM-MHA page-table builder, written from docs/contract.md §9 (the ``trtllm_mha`` ABI).

One program per (request ``b``, page block ``blk``), grid ``(num_seqs, ceil(width / PAGES_PER_BLOCK))`` with
``PAGES_PER_BLOCK = BLOCK_TOKENS // PAGE_SIZE``. Program ``(b, blk)`` writes page ``j`` of row ``b`` for
every ``j`` of its block below ``ceil(L_b / PAGE_SIZE)``: ``req_to_token[rpi_b, j*PAGE_SIZE] // PAGE_SIZE``.
With ``HAS_SWA`` it also writes the sliding-window table: the same slot looked up in ``full_to_swa`` (the
index clamped to ``[0, full_to_swa_numel)``), divided by the page size. Stores are bounded by the length,
not the row width (§9).
"""

import triton
import triton.language as tl

#: Tokens one program covers along grid axis 1.
BLOCK_TOKENS = 4096
_BLOCK_TOKENS = tl.constexpr(BLOCK_TOKENS)


@triton.jit
def create_trtllm_mha_kv_indices_triton(
    req_to_token,            # [pool_rows, row stride] token position -> KV slot
    req_pool_indices,        # [num_seqs]
    seq_lens,                # [num_seqs] tokens per request
    full_to_swa,             # [full_to_swa_numel] slot -> SWA slot (read when HAS_SWA)
    page_table,              # [num_seqs, row stride] output page ids
    swa_page_table,          # [num_seqs, row stride] output SWA page ids (written when HAS_SWA)
    full_to_swa_numel,
    req_to_token_stride: tl.constexpr,
    page_table_stride: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
):
    PAGES_PER_BLOCK: tl.constexpr = _BLOCK_TOKENS // PAGE_SIZE
    b = tl.program_id(0)
    blk = tl.program_id(1)

    length = tl.load(seq_lens + b)
    num_pages = tl.cdiv(length, PAGE_SIZE)
    if blk * PAGES_PER_BLOCK >= num_pages:
        return
    pool_row = tl.load(req_pool_indices + b).to(tl.int64)
    page = blk * PAGES_PER_BLOCK + tl.arange(0, PAGES_PER_BLOCK)
    mask = page < num_pages
    slot = tl.load(req_to_token + pool_row * req_to_token_stride + page.to(tl.int64) * PAGE_SIZE, mask=mask)
    out = b * page_table_stride + page
    tl.store(page_table + out, (slot // PAGE_SIZE).to(tl.int32), mask=mask)
    if HAS_SWA:
        index = tl.minimum(tl.maximum(slot, 0), full_to_swa_numel - 1)
        swa_slot = tl.load(full_to_swa + index.to(tl.int64), mask=mask)
        tl.store(swa_page_table + out, (swa_slot // PAGE_SIZE).to(tl.int32), mask=mask)


def num_blocks(width: int, page_size: int) -> int:
    """Grid axis 1: page blocks spanning a row of ``width`` pages (upstream's helper does the same)."""
    per_block = BLOCK_TOKENS // page_size
    return (width + per_block - 1) // per_block


def launch(kernel, *, req_to_token, req_pool_indices, seq_lens, full_to_swa, page_table, swa_page_table, width,
           page_size):
    """The ``trtllm_mha`` ABI: grid ``(num_seqs, num_blocks(width, page_size))``; SWA iff ``full_to_swa``."""
    has_swa = full_to_swa is not None
    grid = (seq_lens.shape[0], num_blocks(width, page_size))
    kernel[grid](req_to_token, req_pool_indices, seq_lens, full_to_swa if has_swa else page_table,
                 page_table, swa_page_table if has_swa else page_table,
                 full_to_swa.numel() if has_swa else 0,
                 req_to_token.stride(0), page_table.stride(0), PAGE_SIZE=page_size, HAS_SWA=has_swa)
