"""Mutant (kernel): recent start: the recent part starts one token early, at ``R_b - 1``.

Bug class (docs/contract.md §6, sliding window): ``R_b = L_b - (L'_b - S_b)`` off by one, so a clipped
request copies token ``R_b - 1`` and misses its last committed token. Needs a request longer than
``window_size + sink_size``.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
PATCH = [
    ('    recent = seq_len - (L - sinks)\n',
     '    recent = seq_len - (L - sinks) - 1  # BUG: R_b = L_b - (L\'_b - S_b)\n'),
]
