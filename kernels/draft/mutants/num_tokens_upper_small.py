"""Mutant (kernel): ``num_tokens_upper`` too small.

Bug class (docs/contract.md §5): an upper smaller than needed. The kv_indptr sum over ``positions[0:z]`` uses
``ceil(num_tokens_upper / 2)`` lanes, so columns ``z`` past that count miss positions. Needs
``bs = num_seqs*topk >= 2``.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        offs_p = tl.arange(0, num_tokens_upper)\n',
     '        offs_p = tl.arange(0, (num_tokens_upper + 1) // 2)  # BUG: must be num_tokens_upper\n'),
]
