"""Mutant (kernel): sink: the first ``S`` tokens are not kept; the window holds the last ``L'`` tokens.

Bug class (docs/contract.md §6, attention sinks): ``S_b = min(S, L_b)`` taken as 0, so a clipped request
copies its most recent ``L'_b`` tokens and drops the sinks. Needs ``sink_size > 0`` and a request longer
than ``window_size + sink_size``.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
PATCH = [
    ('    sinks = tl.minimum(seq_len, sink_size)\n',
     '    sinks = 0 * seq_len  # BUG: the first sink_size tokens must be kept\n'),
]
