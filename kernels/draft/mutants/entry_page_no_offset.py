"""Mutant (kernel): entry-page arithmetic: ``token(p) = row[p div E] * E``, the ``+ p mod E`` is missing.

Bug class (docs/contract.md §6, page-granular rows): every token of a page reads the page's first slot.
Needs ``ENTRY_PAGE_SIZE > 1`` and a read of a position that is not a multiple of it.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
PATCH = [
    ('        ids = entry.to(tl.int64) * ENTRY_PAGE_SIZE + p % ENTRY_PAGE_SIZE\n',
     '        ids = entry.to(tl.int64) * ENTRY_PAGE_SIZE  # BUG: + p % ENTRY_PAGE_SIZE missing\n'),
]
