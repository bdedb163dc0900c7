"""Mutant (kernel): rail prefix/chain split: the chain part always starts at its first token (``c0 = 0``).

Bug class (docs/contract.md §6, window rail): when the window starts inside the draft chain
(``start > L``, i.e. ``w < n``) only ``n - c0`` chain tokens belong to it, from ``e_k + c0``; taking
all ``n`` writes ``c0`` tokens past the segment, over the next branch's window.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "STRAY_WRITE")
CONTRACT = "window-rail"
PATCH = [
    ('    chain_from = tl.maximum(start - L, 0)\n',
     '    chain_from = 0 * start  # BUG: c0 = max(start - L, 0)\n'),
]
