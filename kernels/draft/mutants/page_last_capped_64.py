"""Mutant (kernel): the partial last page is computed for pages of at most 64 tokens.

Bug class (docs/contract.md §5, scale): paged draft-slot arithmetic that assumes small pages.
``last = L % 64`` when ``page_size > 64``: with pages of 128 tokens, topk >= 2 and ``L % 128 >= 64``,
branch ``k``'s draft tokens are read from the wrong slots. Appears only with ``page_size = 128``, which
the CPU domain (pages up to 64) never draws.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("VALUE_MISMATCH",)
#: The domain whose default draws must reach the bug (``kvfence.contracts.draft.domain``): production-sized.
DOMAIN = "gpu"
#: Config pins that reach the bug, for ``mutants --verifiers both``'s extra rounds when default draws
#: did not (kvfence.contracts.draft.compare): pages of 128 tokens and several branches.
AIM = {"page_size": 128, "topk": 4}
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('            last = seq_len % page_size\n',
     '            last = seq_len % (page_size if page_size <= 64 else 64)  # BUG: pages > 64 tokens\n'),
]
