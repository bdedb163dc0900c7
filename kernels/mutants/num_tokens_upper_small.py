"""Mutant (kernel): ``num_tokens_upper`` too small.

Bug class (docs/contract.md §5): an upper smaller than needed. The kv_indptr sum over ``positions[0:z]`` uses
``ceil(num_tokens_upper / 2)`` lanes, so columns ``z`` past that count miss positions. Needs
``bs = num_seqs*topk >= 2``.
"""

KIND = "kernel"
#: ``strategies.configs`` pins under which the bug shows (the mutation self-test fuzzes these).
PINS = dict(topk=2, num_steps=1, page_size=1, ctx=8, max_bs=2)
#: (reference text, mutated text): applied to kernels/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        offs_p = tl.arange(0, num_tokens_upper)\n',
     '        offs_p = tl.arange(0, (num_tokens_upper + 1) // 2)  # BUG: must be num_tokens_upper\n'),
]
