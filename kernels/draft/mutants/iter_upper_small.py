"""Mutant (kernel): ``iter_upper`` too small.

Bug class (docs/contract.md §5): an upper smaller than needed. The draft-token copy uses ``ceil(iter_upper / 2)``
lanes, so steps with ``n`` above that leave their last draft tokens unwritten. Needs
``num_steps >= 2``.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("MISSING_WRITE",)
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        offs_j = tl.arange(0, iter_upper)\n',
     '        offs_j = tl.arange(0, (iter_upper + 1) // 2)  # BUG: must be iter_upper\n'),
]
