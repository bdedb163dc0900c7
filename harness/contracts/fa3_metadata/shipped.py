"""What SGLang's releases say of FA3's decode-metadata kernel (``kvfence.release.knowledge``, entry-point group
``kvfence.shipped``): where the wheels define it, where the FA3 backend sizes its page table, the wall case."""

from __future__ import annotations

from kvfence.release.knowledge import Shipped, ShippedSite, Upstream

SITES = (
    ShippedSite("fa3", "FlashAttentionBackend", "graph", "target_verify", "self.max_num_pages",
                "self.speculative_num_draft_tokens", (1, 16, 32, 64, 128), within="_set_decode_page_metadata",
                evidence="verify_delta = self.speculative_num_draft_tokens",
                note="topk 1, not a ragged verify (a ragged verify layout passes delta 0)", topk="1",
                guard="self.topk <= 1"),
    # Up to 0.5.15 the backend fills the same table with torch: ceil(ctx / P) pages (init_cuda_graph_state), the
    # published length seq_lens + D, the copy sliced to the row; no kernel of this contract runs there.
    ShippedSite("fa3", "FlashAttentionBackend", "graph", "target_verify",
                "(self.max_context_len + self.page_size - 1) // self.page_size", "self.speculative_num_draft_tokens",
                (1, 16, 32, 64, 128), within="init_cuda_graph_state",
                evidence="seq_lens + self.speculative_num_draft_tokens", note="topk 1, the table filled by torch",
                topk="1", guard="self.topk <= 1", fill="metadata.page_table[:, :max_seq_pages].copy_(page_indices)"),
)
#: What a deployment suffers (kvfence.release.affected states it on each line): the kernel clamps its rows, so
#: the only class is the arithmetic's.
SEVERITY = (("width formula short", "the attention kernel reads cache_seqlens[b] tokens through a page-table row "
                                    "that holds fewer pages: past the row (the next request's pages, or past the "
                                    "table for the last one)"),)


def wall(ctx: int, page_size: int, draft_tokens: int, length: int) -> dict:
    """One request of committed length ``length``; the kernel adds ``draft_tokens`` (``SEQ_LEN_DELTA``)."""
    return {"page_size": page_size, "ctx": ctx, "delta": draft_tokens, "seq_lens": [length], "req_pool_indices": [0],
            "pool_rows": 1, "zero_tail": False, "skip_page_table": False, "seed": 0}


#: 0.5.20 .. 0.5.22 define the kernel as ``_fused_metadata_kernel_general`` (``metadata.py:166``): the SWA table
#: mapped by token slot only, the page size's log2 (``SHIFT``) and ``use_swa`` as constants, no page translations and
#: no ``ZERO_TAIL`` (their ``normal_decode_set_metadata`` has none). Their launcher picks the same gather's
#: ``_fused_metadata_kernel_ps1_no_swa`` at page 1 without SWA; the adapter launches the general one at every page.
GENERAL = "_fused_metadata_kernel_general"
GENERAL_PARAMETERS = (
    "seq_lens", "seq_lens_stride_0", "req_to_token", "req_to_token_stride_0", "req_to_token_stride_1",
    "req_pool_indices", "req_pool_indices_stride_0", "cache_seqlens_int32", "cache_seqlens_int32_stride_0",
    "cu_seqlens_k", "cu_seqlens_k_stride_0", "page_table", "page_table_stride_0", "page_table_stride_1",
    "swa_page_table", "swa_page_table_stride_0", "swa_page_table_stride_1", "full_to_swa_mapping",
    "full_to_swa_mapping_stride_0", "B", "max_seq_pages", "page_size", "seq_len_delta", "use_swa", "SHIFT",
    "BLOCK_COLS", "SKIP_PAGE_TABLE")
_GENERAL_CALL = """        _fused_metadata_kernel_general(
            seq_lens, seq_lens_stride_0, req_to_token, req_to_token_stride_0, req_to_token_stride_1,
            req_pool_indices, req_pool_indices_stride_0, cache_seqlens_int32, cache_seqlens_int32_stride_0,
            cu_seqlens_k, cu_seqlens_k_stride_0, page_table, page_table_stride_0, page_table_stride_1,
            swa_page_table, swa_page_table_stride_0, swa_page_table_stride_1,
            full_to_swa_index_mapping, full_to_swa_mapping_stride_0, B, max_seq_pages,
            PAGE_SIZE, SEQ_LEN_DELTA, 0, {shift}, BLOCK_COLS, SKIP_PAGE_TABLE)
"""
#: kvfence's adapter: the contract's ABI (``kernels/fa3_metadata/fa3_decode_metadata.py``) onto the older kernel,
#: ``SHIFT`` picked by the page size as a constant (the page sizes the contract's cases hold).
GENERAL_ADAPTER = """@triton.jit
def _fused_decode_metadata_kernel(
    seq_lens, seq_lens_stride_0, req_to_token, req_to_token_stride_0, req_to_token_stride_1,
    req_pool_indices, req_pool_indices_stride_0, cache_seqlens_int32, cache_seqlens_int32_stride_0,
    cu_seqlens_k, cu_seqlens_k_stride_0, page_table, page_table_stride_0, page_table_stride_1,
    swa_page_table, swa_page_table_stride_0, swa_page_table_stride_1,
    full_to_swa_index_mapping, full_to_swa_mapping_stride_0, full_v2p, full_v2p_stride_0, swa_v2p, swa_v2p_stride_0,
    B, max_seq_pages, PAGE_SIZE: tl.constexpr, SEQ_LEN_DELTA: tl.constexpr, BLOCK_COLS: tl.constexpr,
    SKIP_PAGE_TABLE: tl.constexpr, ZERO_TAIL: tl.constexpr,
):
    tl.static_assert(not ZERO_TAIL, "this release's kernel has no ZERO_TAIL")
""" + "".join(f"    {'if' if i == 0 else 'elif'} PAGE_SIZE == {1 << shift}:\n" + _GENERAL_CALL.format(shift=shift)
              for i, shift in enumerate((0, 4, 5, 6, 7))) + """    else:
        tl.static_assert(False, "a page size the adapter does not hold")
"""

FA3_METADATA = Shipped(Upstream("_fused_decode_metadata_kernel", ("sglang/kernels/ops/attention/metadata.py",),
                                ((GENERAL, GENERAL_PARAMETERS, GENERAL_ADAPTER),)),
                       SITES, wall, ("safe", "context"), block_pages=None, severity=SEVERITY)
