"""Launchers around a row overflow in the production layout, and one whose launches alternate.

A row overflow (``need > width``) makes program ``(s, b, k)``'s stores past its row land in row ``s + 1``,
on elements row ``s + 1``'s own programs write: two stores to one element. Under the CPU interpreter the
programs run in grid order, so row ``s + 1`` always stores last; on a GPU either may. These launchers fix
the other orders, for the CPU tests (tests/test_contended.py):

* ``spill_wins``: the reference kernel, then every spill of a row into the next row stored again, so
  the spilling program's value is the one left (the order a GPU may choose);
* ``spill_third_value``: the same, but the first contended element gets ``BAD_VALUE``, neither writer's.

``parity``: the reference kernel, then one bad store whose place depends on how many times it has
launched (a device counter it reads and increments): a wrong value in row 0 on even launches, a store
in row 0's slack on odd ones. Two launches of one case name different findings, like a racy kernel's.

``by_allocation``: the reference kernel, then one bad store whose place depends on the buffer it runs
on: in row 0 on the first kv_indices allocation it meets, in row 0's slack on every other. Every launch
on one buffer names the same findings, two buffers (the two paths' runners) different ones: a race whose
outcome follows where the buffers are, as the H200 showed.

They compute on the host (row widths from ``seq_lens``), so they run eagerly: CPU tests only.
"""

import torch
import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Neither writer's value: no slot id, canary or poison equals it in these cases.
BAD_VALUE = 777_777


def _reference(**kw):
    launch(generate_draft_decode_kv_indices, **kw)


def _spills(kw):
    """``(flat offsets from row 0's first element, values)`` of every store of row ``s`` past its width that
    lands in row ``s + 1`` (rows but the last), from the reference kernel run into rows wide enough."""
    kvi = kw["kv_indices"]
    rows, width = kvi.shape
    wide = int(kw["topk"] * kw["seq_lens"].sum() + kw["seq_lens"].shape[0] * kw["topk"] * kw["num_steps"])
    if wide <= width:
        return [], []
    scratch = torch.full((rows, wide), -1, dtype=kvi.dtype, device=kvi.device)
    _reference(**dict(kw, kv_indices=scratch, kv_indptr=kw["kv_indptr"].clone()))
    offsets, values = [], []
    for s in range(rows - 1):
        for j in range(width, min(wide, width + kvi.stride(0))):
            if int(scratch[s, j]) != -1:
                offsets.append(s * kvi.stride(0) + j)
                values.append(int(scratch[s, j]))
    return offsets, values


def _store_spills(kw, values_of):
    kvi = kw["kv_indices"]
    _reference(**kw)
    offsets, values = _spills(kw)
    flat = torch.as_strided(kvi, (kvi.shape[0] * kvi.stride(0),), (1,))
    for offset, value in zip(offsets, values_of(values)):
        flat[offset] = value


def spill_wins(**kw):
    """The spilling program's store lands last: any writer's value is right, so no ``VALUE_MISMATCH``."""
    _store_spills(kw, lambda values: values)


def spill_third_value(**kw):
    """The first contended element holds ``BAD_VALUE``: ``VALUE_MISMATCH`` there."""
    _store_spills(kw, lambda values: [BAD_VALUE] + values[1:])


@triton.jit
def _parity_store(counter, kvi, slack_offset, value):
    n = tl.load(counter)
    tl.store(counter, n + 1)
    tl.store(kvi + (n % 2) * slack_offset, value)


#: Launches so far, per device (a test zeroes it to fix the parity).
LAUNCHES = {}


def parity(**kw):
    """Even launches: ``BAD_VALUE`` at row 0 element 0 (``VALUE_MISMATCH``); odd ones: at row 0's last
    element, which a safe-sized row never uses (``STRAY_WRITE`` in its slack)."""
    kvi = kw["kv_indices"]
    _reference(**kw)
    counter = LAUNCHES.setdefault(kvi.device, torch.zeros(1, dtype=torch.int32, device=kvi.device))
    _parity_store[(1,)](counter, kvi, kvi.shape[1] - 1, BAD_VALUE)


#: kv_indices allocations ``by_allocation`` has met, in order (a test clears it).
ALLOCATIONS = []


def by_allocation(**kw):
    """``BAD_VALUE`` at row 0 element 0 on the first allocation met (``VALUE_MISMATCH``), at row 0's last
    element on any other (``STRAY_WRITE`` in its slack)."""
    kvi = kw["kv_indices"]
    _reference(**kw)
    storage = kvi.untyped_storage().data_ptr()
    if storage not in ALLOCATIONS:
        ALLOCATIONS.append(storage)
    kvi[0, 0 if ALLOCATIONS.index(storage) == 0 else kvi.shape[1] - 1] = BAD_VALUE
