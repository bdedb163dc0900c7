"""Mutant (kernel): the prefix sum over request lengths stops at 16 lanes.

Bug class (docs/contract.md §5, scale): a reduction over requests that hard-codes a lane width.
``C_b`` ignores requests 16 and later, so the segments of request 17 onwards start too early. Appears
only when a launch has at least 18 requests (a bucket of 18 or more in graph mode): the CPU domain
(max_bs <= 4) can never reach it.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE")
#: The domain whose default draws must reach the bug (``kvfence.contracts.draft.domain``): production-sized.
DOMAIN = "gpu"
#: Config pins that reach the bug, for ``mutants --verifiers both``'s extra rounds when default draws
#: did not (kvfence.contracts.draft.compare): 32 requests at most: a full batch, or a count past 17, has the 18 the bug
#: needs.
AIM = {"max_bs": 32}
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('mask=offs_b < b, other=0)',
     'mask=(offs_b < b) & (offs_b < 16), other=0)  # BUG: 16 lanes only'),
]
