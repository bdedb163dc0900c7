"""The request-row writer contract (docs/contract.md §10): ``req-to-token``."""

from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN

__all__ = ["REQ_TO_TOKEN"]
