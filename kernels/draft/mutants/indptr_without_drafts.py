"""Mutant (kernel): kv_indptr without the draft tokens.

Bug class (docs/contract.md §2 kv_indptr): ``kv_indptr[s, z]`` is ``sum(positions[0:z])`` without ``+ z*n``, so the
consumer's ranges omit every branch's draft tokens. Shows with any config.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('(tl.sum(pos) + z * n).to(kv_indptr.dtype.element_ty))\n',
     'tl.sum(pos).to(kv_indptr.dtype.element_ty))  # BUG: + z*n missing\n'),
]
