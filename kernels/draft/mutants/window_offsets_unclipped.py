"""Mutant (kernel): window clip: ``C'_b`` sums the full lengths, not the clipped ``L' = min(L, w + S)``.

Bug class (docs/contract.md §6, sliding window): segment offsets of later requests use ``sum(L)``
where the window clipped the earlier ones, so they land past where the indptr (clipped) says, leaving
gaps and writing past ``U(s)``. Needs a window shorter than an earlier request of the batch.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "MISSING_WRITE", "STRAY_WRITE", "GUARD_OVERWRITE")
PATCH = [
    ('        lens_before = tl.minimum(lens_before, window_size + sink_size)\n',
     '        lens_before = lens_before  # BUG: C\'_b must sum the clipped lengths\n'),
]
