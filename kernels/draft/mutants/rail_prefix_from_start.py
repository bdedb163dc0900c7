"""Mutant (kernel): rail prefix/chain split: the window's prefix part is the oldest ``PL`` tokens, not the last.

Bug class (docs/contract.md §6, window rail): the prefix part must be positions ``P0 .. L-1`` with
``P0 = min(start, L)``; reading ``0 .. PL-1`` keeps the wrong end of the prefix. Needs a window that
clips the prefix (``L + n > w`` and ``start < L``).
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
CONTRACT = "window-rail"
PATCH = [
    ('        tok = read_tokens(src, prefix_from + offs_t, mask_t, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)\n',
     '        tok = read_tokens(src, offs_t, mask_t, v2p, page_size, ENTRY_PAGE_SIZE, TRANSLATE)  # BUG: from P0\n'),
]
