"""Mutant (kernel): stride mismatch between rows.

Bug class (docs/contract.md §5): stride mismatch between rows. Step rows of kv_indices are placed with
``kv_indptr_stride`` instead of ``kv_indices_stride``: every row after row 0 lands at the wrong place
(inside an earlier row or its guard). Needs ``num_steps >= 2``.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE", "STRAY_WRITE", "GUARD_OVERWRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    out = kv_indices + s * kv_indices_stride + topk * prefix_sum + b * n * topk + k * (L + n)',
     '    out = kv_indices + s * kv_indptr_stride + topk * prefix_sum + b * n * topk + k * (L + n)'
     '  # BUG: rows are kv_indices_stride apart'),
]
