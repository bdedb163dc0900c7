"""Mutant (kernel): kv_indptr without the draft tokens.

Bug class (docs/contract.md §2 kv_indptr): ``kv_indptr[s, z]`` is ``sum(positions[0:z])`` without ``+ z*n``, so the
consumer's ranges omit every branch's draft tokens. Shows with any config.
"""

KIND = "kernel"
#: ``strategies.configs`` pins under which the bug shows (the mutation self-test fuzzes these).
PINS = dict(topk=1, num_steps=1, page_size=1, ctx=8, max_bs=2)
#: (reference text, mutated text): applied to kernels/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('(tl.sum(pos) + z * n).to(kv_indptr.dtype.element_ty))\n',
     'tl.sum(pos).to(kv_indptr.dtype.element_ty))  # BUG: + z*n missing\n'),
]
