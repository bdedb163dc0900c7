"""The page-table builder contracts (docs/contract.md §9): ``flashmla-page-table``, ``trtllm-mha-page-table``."""

from kvfence.contracts.page_table.record import FLASHMLA, TRTLLM_MHA

__all__ = ["FLASHMLA", "TRTLLM_MHA"]
