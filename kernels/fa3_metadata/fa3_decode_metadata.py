"""kvfence's FA3 fused decode-metadata builder, written from docs/contract.md §9 (the ``fa3_metadata`` ABI).

Grid ``(B, ceil(max_seq_pages / BLOCK_COLS))``. Program ``(0, 0)`` also publishes the lengths:
``cache_seqlens[b] = seq_lens[b] + SEQ_LEN_DELTA`` and their exclusive prefix sum ``cu_seqlens_k[0..B]``.
Unless ``SKIP_PAGE_TABLE``, program ``(b, c)`` writes columns ``c*BLOCK_COLS ..`` of row ``b`` below
``live_b = min(ceil((seq_lens[b] + SEQ_LEN_DELTA) / PAGE_SIZE), max_seq_pages)``: the page id of the slot of
the column's first token, ``req_to_token[rpi_b, j*PAGE_SIZE] // PAGE_SIZE``; with ``ZERO_TAIL`` it writes 0
to the columns from ``live_b`` up to ``max_seq_pages``. The table rows are clamped to ``max_seq_pages``; the
published lengths are not. The SWA table and the page translations (``full_v2p``, ``swa_v2p``,
``full_to_swa_index_mapping``) are part of the ABI; kvfence's contract passes none of them.
"""

import triton
import triton.language as tl


@triton.jit
def _fused_decode_metadata_kernel(
    seq_lens, seq_lens_stride_0,
    req_to_token, req_to_token_stride_0, req_to_token_stride_1,
    req_pool_indices, req_pool_indices_stride_0,
    cache_seqlens_int32, cache_seqlens_int32_stride_0,
    cu_seqlens_k, cu_seqlens_k_stride_0,
    page_table, page_table_stride_0, page_table_stride_1,
    swa_page_table, swa_page_table_stride_0, swa_page_table_stride_1,
    full_to_swa_index_mapping, full_to_swa_mapping_stride_0,
    full_v2p, full_v2p_stride_0,
    swa_v2p, swa_v2p_stride_0,
    B,
    max_seq_pages,
    PAGE_SIZE: tl.constexpr,
    SEQ_LEN_DELTA: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    SKIP_PAGE_TABLE: tl.constexpr,
    ZERO_TAIL: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1)
    if b == 0 and c == 0:  # one program publishes the lengths and their prefix sum
        total = 0
        for i in range(B):
            length = (tl.load(seq_lens + i * seq_lens_stride_0) + SEQ_LEN_DELTA).to(tl.int32)
            tl.store(cache_seqlens_int32 + i * cache_seqlens_int32_stride_0, length)
            tl.store(cu_seqlens_k + i * cu_seqlens_k_stride_0, total)
            total += length
        tl.store(cu_seqlens_k + B * cu_seqlens_k_stride_0, total)
    if SKIP_PAGE_TABLE:
        return
    if max_seq_pages == 0:
        return
    length = tl.load(seq_lens + b * seq_lens_stride_0).to(tl.int32) + SEQ_LEN_DELTA
    live = tl.minimum(tl.cdiv(length, PAGE_SIZE), max_seq_pages)
    first = c * BLOCK_COLS
    if not ZERO_TAIL and first >= live:
        return
    pool_row = tl.load(req_pool_indices + b * req_pool_indices_stride_0)
    cols = first + tl.arange(0, BLOCK_COLS)
    live_mask = cols < live
    slot = tl.load(req_to_token + pool_row * req_to_token_stride_0 + cols * PAGE_SIZE * req_to_token_stride_1,
                   mask=live_mask, other=0)
    store_mask = cols < max_seq_pages if ZERO_TAIL else live_mask
    tl.store(page_table + b * page_table_stride_0 + cols * page_table_stride_1, slot // PAGE_SIZE, mask=store_mask)


def block_cols(page_size: int, skip_page_table: bool) -> int:
    """256 columns a program for lengths only or unmapped page-1 gathers, else 128 (as upstream's launcher)."""
    return 256 if skip_page_table or page_size == 1 else 128


def launch(kernel, *, seq_lens, req_to_token, req_pool_indices, cache_seqlens, cu_seqlens_k, page_table, width,
           page_size, delta, skip_page_table, zero_tail):
    """The ``fa3_metadata`` ABI: ``max_seq_pages`` is the row width; no SWA table, no translation."""
    cols = block_cols(page_size, skip_page_table)
    batch = cache_seqlens.shape[0]
    grid = (1, 1) if skip_page_table or width == 0 else (batch, triton.cdiv(width, cols))
    kernel[grid](seq_lens, seq_lens.stride(0), req_to_token, req_to_token.stride(0), req_to_token.stride(1),
                 req_pool_indices, req_pool_indices.stride(0), cache_seqlens, cache_seqlens.stride(0),
                 cu_seqlens_k, cu_seqlens_k.stride(0), page_table, page_table.stride(0), page_table.stride(1),
                 None, 0, 0, None, 0, None, 0, None, 0, batch, width, PAGE_SIZE=page_size, SEQ_LEN_DELTA=delta,
                 BLOCK_COLS=cols, SKIP_PAGE_TABLE=skip_page_table, ZERO_TAIL=zero_tail)
