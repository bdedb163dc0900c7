"""Mutant (kernel): the prefix copy stops after its first 512-token block.

Bug class (docs/contract.md §5, scale): a copy loop that drops every block after the first. Requests
of at most 512 tokens are copied correctly, so the bug appears only once a request is longer than one
copy block (``L > 512``): the interpreter-sized CPU domain (ctx <= 48) can never reach it.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("MISSING_WRITE",)
#: The domain whose default draws must reach the bug (``kvfence.contracts.draft.domain``): production-sized.
DOMAIN = "gpu"
#: Config pins that reach the bug, for ``mutants --verifiers both``'s extra rounds when default draws
#: did not (kvfence.contracts.draft.compare): requests up to 2048 tokens: most are longer than one 512-token block.
AIM = {"ctx": 2048}
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    for start in range(blk * BLOCK, L, num_blocks * BLOCK):\n',
     '    for start in range(blk * BLOCK, tl.minimum(L, BLOCK), num_blocks * BLOCK):  # BUG: first block only\n'),
]
