"""Mutant (kernel): step-major draft-slot layout.

Bug class (docs/contract.md §5): wrong draft-slot layout. Draft token ``j`` of branch ``k`` is read from
``req_to_token[rpi, L + j*topk + k]`` (step-major) instead of ``L + k*num_steps + j`` (branch-major).
Needs ``topk >= 2`` and ``num_steps >= 2`` (with one of them 1 the two layouts coincide), page size 1.
"""

KIND = "kernel"
#: (reference text, mutated text): applied to kernels/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        draft = tl.load(src + draft_start + offs_j, mask=mask_j)\n',
     '        draft = tl.load(src + L + offs_j * topk + k, mask=mask_j)  # BUG: step-major slots L + j*topk + k\n'),
]
