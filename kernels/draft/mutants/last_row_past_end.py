"""Mutant (kernel): the last step writes a whole row past its buffer.

Bug class (docs/contract.md §3/§5): an out-of-bounds row. The last step ``s = num_steps - 1`` writes at row
``s + 1``, one whole row past the last row of kv_indices, and leaves that row unwritten. kvfence's
tail guard holds one whole row (``kvfence.contracts.draft.runner_buffers``), so the stores land there on every path;
without a tail guard (``--no-absorb``) they leave the allocation, where the interpreter address audit
reports them as ``OOB_WRITE`` and drops them. Shows with any config.
"""

KIND = "kernel"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("MISSING_WRITE", "GUARD_OVERWRITE", "OOB_WRITE")
#: (reference text, mutated text): applied to kernels/draft/draft_kv_indices.py, each matching exactly once.
PATCH = [
    ('    out = kv_indices + s * kv_indices_stride + topk * prefix_sum + b * n * topk + k * (L + n)',
     '    out = kv_indices + tl.where(s == num_steps - 1, s + 1, s) * kv_indices_stride + topk * prefix_sum'
     ' + b * n * topk + k * (L + n)  # BUG: the last step writes one row past the buffer'),
]
