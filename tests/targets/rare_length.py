"""A launcher with a bug only one request length reaches: the reference kernel, then a wrong value at
element 0 of row 0 when any request has length ``RARE`` (``tests/test_bulk.py``: a bug the bulk meets
long before Hypothesis's own batches do).

It reads ``seq_lens`` on the host, so it is for the CPU interpreter only (a host read cannot be captured
in a CUDA graph).
"""

import triton
import triton.language as tl

from kvfence.kernels.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Not an edge length of a 16-token context (kvfence.strategies.edge_lengths): drawn uniformly only.
RARE = 11


@triton.jit
def poke(ptr, offset, value):
    tl.store(ptr + offset, value)


def rare_length_value(**kw):
    """VALUE_MISMATCH in ``row 0`` when a request has length ``RARE``."""
    launch(generate_draft_decode_kv_indices, **kw)
    if RARE in kw["seq_lens"].tolist():
        poke[(1,)](kw["kv_indices"], 0, 777_777)
