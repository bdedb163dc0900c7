"""The slot-mapping contract (docs/contract.md §11): ``slot-mapping``, vLLM's per-token KV slots."""

from kvfence.contracts.slot_mapping.record import SLOT_MAPPING

__all__ = ["SLOT_MAPPING"]
