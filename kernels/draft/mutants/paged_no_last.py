"""Mutant (kernel): paged draft-slot formula without ``last``.

Bug class (docs/contract.md §5): paged formula without ``last``. With ``page_size > 1`` and ``topk > 1`` branch
``k``'s draft tokens start at ``base + k*pages_per_branch*page_size`` instead of ``... + last``: the copy
of the partial last page is skipped. Needs ``page_size > 1``, ``topk >= 2`` and a length that is not a
multiple of the page size.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('            paged_start = (seq_len - last) + k * pages_per_branch * page_size + last\n',
     '            paged_start = (seq_len - last) + k * pages_per_branch * page_size  # BUG: + last missing\n'),
]
