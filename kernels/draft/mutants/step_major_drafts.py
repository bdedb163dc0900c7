"""Mutant (kernel): step-major draft-slot layout.

Bug class (docs/contract.md §5): wrong draft-slot layout. Draft token ``j`` of branch ``k`` is read from
``req_to_token[rpi, L + j*topk + k]`` (step-major) instead of ``L + k*num_steps + j`` (branch-major).
Needs ``topk >= 2`` and ``num_steps >= 2`` (with one of them 1 the two layouts coincide), page size 1.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('        draft = read_tokens(src, draft_start + offs_j, mask_j, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)\n',
     '        draft = read_tokens(src, seq_len + offs_j * topk + k, mask_j, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)'
     '  # BUG: step-major slots L + j*topk + k\n'),
]
