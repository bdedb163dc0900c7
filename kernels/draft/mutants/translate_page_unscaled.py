"""Mutant (kernel): translation: the physical page is not scaled, ``v2p[id div P] + id mod P``.

Bug class (docs/contract.md §6, TRANSLATE): the page table maps pages, so a physical token id is
``v2p[page] * page_size + offset``; without the factor ids collide across pages. Needs ``TRANSLATE``
and ``page_size > 1`` (and a page mapped to an id other than 0).
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
PATCH = [
    ('        phys = page.to(tl.int64) * page_size + virtual % page_size\n',
     '        phys = page.to(tl.int64) + virtual % page_size  # BUG: * page_size missing\n'),
]
