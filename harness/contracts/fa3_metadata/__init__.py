"""The FA3 fused decode-metadata contract (docs/contract.md §9): ``fa3-decode-metadata``."""

from kvfence.contracts.fa3_metadata.record import FA3_METADATA

__all__ = ["FA3_METADATA"]
