"""Mutant (kernel): the prefix sum ``C_b`` includes the current request.

Bug class (docs/contract.md §5): prefix sum including the current request. ``C_b = L_0 + ... + L_b`` pushes every
segment ``topk*L_b`` to the right: later requests land past their place (and past the row's used
length). Shows with any config.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE", "STRAY_WRITE", "GUARD_OVERWRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('mask=offs_b < b, other=0)',
     'mask=offs_b <= b, other=0)  # BUG: C_b must exclude request b'),
]
