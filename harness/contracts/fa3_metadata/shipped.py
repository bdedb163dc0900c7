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


FA3_METADATA = Shipped(Upstream("_fused_decode_metadata_kernel", ("sglang/kernels/ops/attention/metadata.py",)),
                       SITES, wall, ("safe", "context"), block_pages=None, severity=SEVERITY)
