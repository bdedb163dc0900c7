"""Launchers that run the reference kernel and then make one genuine bad write with a Triton kernel.

Each is a kvfence launcher plug-in (``tests/targets/bad_writes.py:NAME``): keyword arguments as in
``kvfence.contracts.draft.targets.LAUNCH_KWARGS``, ``kv_indices`` / ``kv_indptr`` as 2-D step-row views. Offsets are
relative to the view's first element, so negative offsets reach the front guard and offsets past the
last row reach the tail, exactly where a buggy kernel's stores would land.
"""

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Written by every bad store: no slot id, canary or poison value equals it at these positions.
BAD_VALUE = 777_777


@triton.jit
def poke(ptr, offset, value):
    tl.store(ptr + offset, value)


def _reference(**kw):
    launch(generate_draft_decode_kv_indices, **kw)


def _poke(tensor, offset, value=BAD_VALUE):
    poke[(1,)](tensor, offset, value)


def row_value(**kw):
    """Element 0 of row 0 gets a wrong value: VALUE_MISMATCH in ``row 0``."""
    _reference(**kw)
    _poke(kw["kv_indices"], 0)


def last_row_missing(**kw):
    """Launch over all rows but the last (correct for topk == 1): MISSING_WRITE in the last row."""
    steps = kw["num_steps"]
    rows = dict(kw, kv_indices=kw["kv_indices"][: steps - 1], kv_indptr=kw["kv_indptr"][: steps - 1],
                num_steps=steps - 1)
    _reference(**rows)


def slack_write(**kw):
    """A store at the last element of row 0, which a safe-sized row never uses: STRAY_WRITE in
    ``slack of row 0``. (From shapes only: no host sync, so it also works inside graph capture.)"""
    _reference(**kw)
    _poke(kw["kv_indices"], kw["kv_indices"].shape[1] - 1)


def row_guard_write(**kw):
    """A store one past row 0's width: GUARD_OVERWRITE in ``guard after row 0`` (redzone layout)."""
    _reference(**kw)
    _poke(kw["kv_indices"], kw["kv_indices"].shape[1])


def front_guard_write(**kw):
    """A store just before row 0: GUARD_OVERWRITE in ``front guard``."""
    _reference(**kw)
    _poke(kw["kv_indices"], -1)


def tail_write(**kw):
    """A store past the last row (and its guard): GUARD_OVERWRITE in ``tail``."""
    _reference(**kw)
    v = kw["kv_indices"]
    _poke(v, v.shape[0] * v.stride(0) + 3)


def indptr_column0_write(**kw):
    """kv_indptr column 0 must never be written: STRAY_WRITE in kv_indptr ``row 0``."""
    _reference(**kw)
    _poke(kw["kv_indptr"], 0)


def indptr_column0_zero(**kw):
    """kv_indptr column 0 written with 0, the value production keeps there: still a STRAY_WRITE, since
    kvfence keeps a canary in that column (a buffer pre-set to 0 would hide this write)."""
    _reference(**kw)
    _poke(kw["kv_indptr"], 0, 0)


def indptr_value(**kw):
    """kv_indptr[0, 1] gets a wrong value: VALUE_MISMATCH."""
    _reference(**kw)
    _poke(kw["kv_indptr"], 1)


def indptr_last_column(**kw):
    """kv_indptr[0, bs] (written by program 0: the total) gets a wrong value: VALUE_MISMATCH. With more
    than a few hundred branches it sits past the first piece a verifier prefix-sums."""
    _reference(**kw)
    _poke(kw["kv_indptr"], kw["positions"].shape[0])


def input_write(**kw):
    """The kernel writes its input req_to_token: STRAY_WRITE on an input."""
    _reference(**kw)
    _poke(kw["req_to_token"], 0)


def bad_uppers(**kw):
    """bs_upper = 3 is not a power of two: the launch itself fails (LAUNCH_ERROR)."""
    v = kw["kv_indices"]
    generate_draft_decode_kv_indices[(kw["num_steps"], kw["seq_lens"].shape[0], kw["topk"])](
        kw["req_pool_indices"], kw["req_to_token"], kw["seq_lens"], v, kw["kv_indptr"], kw["positions"],
        kw["req_to_token"].shape[1], v.stride(0), kw["kv_indptr"].stride(0), 3, 4, 4, kw["page_size"])


def tail_write_past_two(**kw):
    """``tail_write`` only in launches of more than two requests (a graph bucket of 4 or more), clean
    otherwise: one config's batch mixes clean and dirty cases. (Decided by the launch's shape, so it
    also works inside graph capture.)"""
    _reference(**kw)
    if kw["seq_lens"].shape[0] > 2:
        v = kw["kv_indices"]
        _poke(v, v.shape[0] * v.stride(0) + 3)


#: The one request length ``rare_length_value`` goes wrong at: not an edge length of a 16-token
#: context (kvfence.contracts.draft.strategies.edge_lengths), so drawn only uniformly (tests/test_bulk.py).
RARE_LENGTH = 11


def rare_length_value(**kw):
    """Element 0 of row 0 gets a wrong value when a request has length ``RARE_LENGTH``: VALUE_MISMATCH
    in ``row 0``, a bug the bulk generator meets long before Hypothesis's own batches do. It reads
    ``seq_lens`` on the host, so it is for the CPU interpreter (a host read cannot be graph-captured)."""
    _reference(**kw)
    if RARE_LENGTH in kw["seq_lens"].tolist():
        _poke(kw["kv_indices"], 0)
