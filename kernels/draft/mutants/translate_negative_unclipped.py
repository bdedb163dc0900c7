"""Mutant (kernel): translation: a page mapped to a negative id is not clipped to 0.

Bug class (docs/contract.md §6, TRANSLATE): ``max(v2p[id div P] * P + id mod P, 0)``; without the
``max`` a negative page table entry leaks a negative KV slot id into kv_indices. Needs ``TRANSLATE``
and a drawn page table with a negative entry that a request reads.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
PATCH = [
    ('        ids = tl.where(ids < 0, 0, tl.maximum(phys, 0))\n',
     '        ids = tl.where(ids < 0, 0, phys)  # BUG: a negative physical id must read as 0\n'),
]
