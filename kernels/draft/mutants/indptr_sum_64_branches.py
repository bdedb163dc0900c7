"""Mutant (kernel): the kv_indptr sum over positions stops at 64 branches.

Bug class (docs/contract.md §5, scale): a reduction over branches that hard-codes a lane width.
``kv_indptr[s, z]`` sums only ``positions[0:64]``, so every column past 64 (and column ``bs``, written
by program ``(s, 0, 0)``) is wrong once the batch has more than 64 real branches
(``raw_bs * topk > 64``): the CPU domain (at most 4 requests x topk 8 = 32 branches) can never reach it.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
#: The domain whose default draws must reach the bug (``kvfence.contracts.draft.domain``): production-sized.
DOMAIN = "gpu"
#: Config pins that reach the bug, for ``mutants --verifiers both``'s extra rounds when default draws
#: did not (kvfence.contracts.draft.compare): up to 256 branches: a batch of 9 or more requests has more than 64.
AIM = {"max_bs": 32, "topk": 8}
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('mask=offs_p < z, other=0)',
     'mask=(offs_p < z) & (offs_p < 64), other=0)  # BUG: 64 branches only'),
]
