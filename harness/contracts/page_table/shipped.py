"""What SGLang's releases say of the page-table builders (``kvfence.release.knowledge``, entry-point group
``kvfence.shipped``): where the wheels define each kernel, where backends size its table, and the wall case."""

from __future__ import annotations

from kvfence.contracts.page_table.record import BLOCK_TOKENS
from kvfence.release.knowledge import Shipped, ShippedSite, Upstream

#: Where releases define the kernels (the newest first), read from the wheels 0.4.4.post2 .. 0.5.23.
_KV_INDICES = ("sglang/kernels/ops/attention/kv_indices.py", "sglang/kernels/ops/kvcache/kv_indices.py",
               "sglang/srt/layers/attention/triton_ops/kv_indices.py", "sglang/srt/layers/attention/utils.py")
_TRTLLM_MHA = tuple(p.replace("kv_indices.py", "trtllm_mha_page_table.py") for p in _KV_INDICES[:3])

#: Where SGLang's backends size the tables these kernels write (docs/contract.md §9, "Shipped sizing of the
#: plug-in contracts"), as the backends spell it in 0.5.23; other releases are read the same way, and a text a
#: release lacks is reported as not found there.
_FLASHMLA_SITES = (
    ShippedSite("flashmla", "FlashMLABackend", "graph", "target_verify",
                "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE", "self.num_draft_tokens", (64,),
                within="init_cuda_graph_state", evidence="seq_lens + self.num_draft_tokens", page_default=64),
    ShippedSite("flashmla", "FlashMLABackend", "graph", "decode",
                "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE", "0", (64,), within="init_cuda_graph_state",
                page_default=64),
    ShippedSite("flashmla", "FlashMLABackend", "eager", "target_verify",
                "triton.cdiv(eager_max_k + self.num_draft_tokens, PAGE_SIZE)", "self.num_draft_tokens", (64,),
                within="init_forward_metadata", evidence="forward_batch.seq_lens + self.num_draft_tokens",
                page_default=64),
    ShippedSite("aiter", "AiterAttnBackend", "eager", "decode", "max_kv_len", "0", (1,),
                within="init_forward_metadata", symbols=(("max_kv_len", "max_len"),),
                note="the page-table decode path (decode_uses_page_table): a table of page 1 (PAGED_SIZE 1 at the "
                     "launch) as wide as the batch's longest length, max_kv_len = "
                     "forward_batch.seq_lens_cpu.max().item() (aiter_backend.py:2057 in 0.5.23), built per batch",
                page_default=1),
    ShippedSite("cutlass_mla", "CutlassMLABackend", "graph", "decode",
                "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE", "0", (128,), within="init_cuda_graph_state",
                page_default=128,
                note="decode without speculation only: a speculative batch goes to its FlashInfer-MLA base class"),
    ShippedSite("cutlass_mla", "CutlassMLABackend", "eager", "decode",
                "triton.cdiv(forward_batch.seq_lens_cpu.max().item(), PAGE_SIZE)", "0", (128,),
                within="init_forward_metadata", page_default=128,
                note="decode without speculation only: a speculative batch goes to its FlashInfer-MLA base class"),
    ShippedSite("trtllm_mla", "TRTLLMMLABackend", "graph", "target_verify",
                "self._calc_padded_blocks(self.max_context_len)", "self.num_draft_tokens", (32, 64),
                within="init_cuda_graph_state", evidence="torch.add(seq_lens[:bs], self.num_draft_tokens, "
                                                         "out=metadata.global_seq_lens_k)", page_default=64),
)
_TRTLLM_MHA_SITES = (
    ShippedSite("trtllm_mha", "TRTLLMHAAttnBackend", "eager", "target_verify", "self.max_num_pages",
                "tokens_per_req", (16, 32, 64, 128), within="init_forward_metadata", page_default=64,
                evidence="forward_batch.seq_lens + tokens_per_req",
                symbols=(("forward_batch.input_ids.shape[0] // batch_size", "d"),),
                note="tokens per request in target verify are the draft tokens (topk 1); the CUDA-graph verify "
                     "builds its table with another kernel; page 128 from 0.5.20 (SGLang changes it to 64 before)"),
)



def wall(ctx: int, page_size: int, draft_tokens: int, length: int) -> dict:
    """One request of committed length ``length``: the kernel receives ``length + draft_tokens`` (target
    verify's lengths)."""
    return {"page_size": page_size, "ctx": ctx, "draft_tokens": draft_tokens, "seq_lens": [length + draft_tokens],
            "req_pool_indices": [0], "pool_rows": 1, "kv_start": None, "swa": False, "seed": 0}


def block_pages(page_size: int) -> int:
    """Both kernels' block arithmetic (kvfence.kernels.page_table, as the wheels' launchers from 0.5.4 on):
    grid axis 1 is ``ceil(W / (4096 / P))`` blocks of ``4096 / P`` pages, each storing the pages of its block
    the length needs, whatever the width."""
    return max(1, BLOCK_TOKENS // page_size)


#: What a deployment suffers, per class (kvfence.release.affected states it on each line).
SEVERITY = (("writes past its row", "the next request's page-table row is overwritten in the same launch: its "
                                    "attention reads another request's KV pages, silently"),
            ("width formula short", "the attention kernel, given the length, reads pages past the table row (the "
                                    "next request's, or past the table for the last one)"))
SIZINGS = ("safe", "context", "flashmla-graph", "context-floor")
FLASHMLA = Shipped(Upstream("create_flashmla_kv_indices_triton", _KV_INDICES), _FLASHMLA_SITES, wall, SIZINGS,
                   block_pages=block_pages, severity=SEVERITY)
TRTLLM_MHA = Shipped(Upstream("create_trtllm_mha_kv_indices_triton", _TRTLLM_MHA), _TRTLLM_MHA_SITES, wall, SIZINGS,
                     block_pages=block_pages, severity=SEVERITY)
