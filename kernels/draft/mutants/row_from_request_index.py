"""Mutant (kernel): the req_to_token row is taken from the request index, not ``req_pool_indices``.

Bug class (docs/contract.md §2 reads): program ``(s, b, k)`` reads ``req_to_token[b, ...]`` instead of
``req_to_token[req_pool_indices[b], ...]``: another request's KV slots (and, for the audit, reads outside
the row the program owns). Shows whenever the pool rows are not in order (the fuzzer permutes them).
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH", "OOB_READ")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    src = req_to_token + rpi * pool_len\n',
     '    src = req_to_token + b * pool_len  # BUG: the row is req_pool_indices[b]\n'),
]
