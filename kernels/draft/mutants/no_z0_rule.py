"""Mutant (kernel): the ``z == 0`` rule of kv_indptr is dropped.

Bug class (docs/contract.md §5): dropping the ``z == 0`` rule. Program ``(s, 0, 0)`` writes column 0 (with 0, which
the zeroed buffer already holds) instead of column ``bs``, so ``kv_indptr[s, bs]`` (the row's used
length) is never written. Shows with any config.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("MISSING_WRITE", "STRAY_WRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        z = tl.where(z == 0, num_seqs * topk, z)\n',
     '        # BUG: no z == 0 -> bs rule: column 0 is written and column bs is not\n'),
]
