"""The DeepSeek-V4 top-k global-index contract (docs/contract.md §12): ``dsv4-topk-indices``, vLLM's
``compute_global_topk_indices_and_lens``."""

from kvfence.contracts.dsv4_topk.record import DSV4_TOPK

__all__ = ["DSV4_TOPK"]
