"""Mutant (kernel): off-by-one in ``n``: step ``s`` copies ``s`` draft tokens instead of ``s + 1``.

Bug class (docs/contract.md §5): off-by-one in ``n``. ``n = s`` shifts every segment offset and drops the last
draft token of each branch; kv_indptr is off by ``z`` per step. Shows with any config.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    n = s + 1\n',
     "    n = s  # BUG: the spec's n is s + 1\n"),
]
