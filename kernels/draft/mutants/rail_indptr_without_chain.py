"""Mutant (kernel): rail indptr: ``window_kv_indptr[s, z]`` sums ``min(positions[i], w)``, without the chain's ``n``.

Bug class (docs/contract.md §6, window rail): the rail's analogue of ``indptr_without_drafts``; the
indptr must be ``B(s, z) = sum(min(positions[i] + n, w))``. Segments stay right; only the indptr is off.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
CONTRACT = "window-rail"
PATCH = [
    ('    total_before = tl.sum(tl.where(offs_p < column, tl.minimum(pos_all + n, window), 0))\n',
     '    total_before = tl.sum(tl.where(offs_p < column, tl.minimum(pos_all, window), 0))  # BUG: + n missing\n'),
]
