"""Slot ids of the req_to_token pool, computed where they are needed instead of loaded.

``kvfence.contracts.draft.case.slot_id(seed, i)`` is defined modulo 2**30, and the low 30 bits of a product depend only
on the low 30 bits of its factors, so 32-bit unsigned arithmetic (which wraps) gives exactly the same
ids as the 64-bit definition at a fraction of the instructions: the verifier computes the expected
value of every kv_indices element on the fly rather than gathering it from the pool.
"""

import triton
import triton.language as tl


@triton.jit
def slot_ids(i, seed):
    """``kvfence.contracts.draft.case.slot_id(seed, i)`` for a block of flat pool indices ``i`` (any integer type)."""
    h = (i.to(tl.uint32) * 0x9E3779B1 + seed.to(tl.uint32)) & 0x3FFFFFFF
    h = h ^ (h >> 13)
    h = (h * 0x5BD1E995) & 0x3FFFFFFF
    return (h + 1).to(tl.int32)
