"""A launcher whose Triton store lands far past its allocation, for batches whose first request has
length 3; other batches get the reference kernel. On a GPU: an illegal address. Under the interpreter
with ``--no-audit``: a store to unmapped host memory (a segfault); with the audit: an ``OOB_WRITE``."""

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Elements past kv_indices' first element: 2**36 int32s = 256 GiB, outside anything a process maps.
FAR = 1 << 36


@triton.jit
def far_store(ptr, offset):
    tl.store(ptr + offset, 1)


def fault_on_3(**kw):
    if int(kw["seq_lens"][0]) == 3:
        far_store[(1,)](kw["kv_indices"], FAR)
    launch(generate_draft_decode_kv_indices, **kw)


def fault_on_two(**kw):
    """Every batch of two or more requests faults (its second request's store lands ``FAR`` past): a run
    whose every case but the one-request ones crashes, for the budgets and the crash shrink."""
    if len(kw["seq_lens"]) >= 2:
        far_store[(1,)](kw["kv_indices"], FAR)
    launch(generate_draft_decode_kv_indices, **kw)
