"""Mutant (kernel): step-major draft slots on the page-1 path only.

Bug class (docs/contract.md §5): wrong draft-slot layout, confined to SGLang's default page size. At
``page_size == 1`` draft token ``j`` of branch ``k`` is read from ``req_to_token[rpi, L + j*topk + k]``
(step-major) instead of ``L + k*num_steps + j`` (branch-major); the paged path (``page_size > 1``) stays
correct. Needs ``page_size == 1``, ``topk >= 2`` and ``num_steps >= 2`` (with either of them 1 the two
layouts coincide): a bug that a prior drawing page 1 one time in eight rarely reaches.
"""

KIND = "kernel"
#: Finding kinds a detection must name: wrong draft tokens inside the written segments.
DETECTS = ("VALUE_MISMATCH",)
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        if page_size == 1:\n            draft_start = seq_len + k * num_steps\n',
     '        if page_size == 1:\n'
     '            draft_start = seq_len + k + tl.arange(0, iter_upper) * (topk - 1)'
     '  # BUG: step-major slots at page 1\n'),
]
