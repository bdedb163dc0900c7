"""Mutant (kernel): ``bs_upper`` too small.

Bug class (docs/contract.md §5): an upper smaller than needed. The prefix sum over request lengths uses
``ceil(bs_upper / 2)`` lanes, so ``C_b`` misses requests from that index on. Needs at least 3
requests in the launch (graph mode pads 3 to a bucket of 4).
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    offs_b = tl.arange(0, bs_upper)\n',
     '    offs_b = tl.arange(0, (bs_upper + 1) // 2)  # BUG: must be bs_upper\n'),
]
