"""The draft kernel's contracts (docs/contract.md §2-§8): ``draft`` and ``window-rail``."""

from kvfence.contracts.draft.record import DRAFT, WINDOW_RAIL

__all__ = ["DRAFT", "WINDOW_RAIL"]
