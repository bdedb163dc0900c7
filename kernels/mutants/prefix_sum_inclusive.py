"""Mutant (kernel): the prefix sum ``C_b`` includes the current request.

Bug class (docs/contract.md §5): prefix sum including the current request. ``C_b = L_0 + ... + L_b`` pushes every
segment ``topk*L_b`` to the right: later requests land past their place (and past the row's used
length). Shows with any config.
"""

KIND = "kernel"
#: ``strategies.configs`` pins under which the bug shows (the mutation self-test fuzzes these).
PINS = dict(topk=1, num_steps=1, page_size=1, ctx=8, max_bs=2)
#: (reference text, mutated text): applied to kernels/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('mask=offs_b < b, other=0)',
     'mask=offs_b <= b, other=0)  # BUG: C_b must exclude request b'),
]
