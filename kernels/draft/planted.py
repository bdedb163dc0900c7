"""Planted bad writes: the reference kernel, then one store where a buggy kernel's store would land.

``python -m kvfence mutants --verifiers both`` (``kvfence.contracts.draft.compare``) runs each through the device
verifier and through the oracle path on the same cases and checks that both see it the same way. There is one
plant per region of each output buffer and one per input tensor (live rows, the bucket's last row and
the rows past the bucket), so a verifier that ignores any region disagrees with the other one.

Each is a kvfence launcher plug-in (``kvfence.kernels.draft.planted:NAME``; keyword arguments of
``kvfence.contracts.draft.targets.LAUNCH_KWARGS``, ``kv_indices`` / ``kv_indptr`` as 2-D step-row views). Offsets are
relative to a view's first element and come from shapes and strides only (no host sync), so every
plant also runs inside CUDA-graph capture. A plant whose place does not exist in a launch (no row past
the bucket in a tensor exactly one bucket long) stores nothing, and that case is clean.
"""

from typing import Optional

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Written by the bad stores: no slot id, canary, poison or kv_indptr value equals it in these cases.
BAD_VALUE = 777_777
#: What a "missing write" leaves: the poison the harness fills rows with (kvfence.engine.tables.POISON).
POISON = -1


@triton.jit
def _store(ptr, offset, value):
    tl.store(ptr + offset, value)


@triton.jit
def _next_row(ptr, offset, rows):
    """``ptr[offset] = (ptr[offset] + 1) % rows``: another pool row, still inside the pool."""
    tl.store(ptr + offset, (tl.load(ptr + offset) + 1) % rows)


def _poke(tensor, offset: int, value: int = BAD_VALUE) -> None:
    _store[(1,)](tensor, offset, value)


def _reference(kw) -> None:
    launch(generate_draft_decode_kv_indices, **kw)


def _bs(kw) -> int:
    return kw["seq_lens"].shape[0] * kw["topk"]


def _room_past(t) -> bool:
    """Whether ``t``'s storage holds an element after the view (a static input past the bucket)."""
    return t.untyped_storage().nbytes() // t.element_size() > t.storage_offset() + t.numel()


def _plant(buffer: str, offset, value: Optional[int] = BAD_VALUE, where: str = ""):
    """A launcher: the reference kernel, then ``buffer[offset(kw)] = value`` (skipped when offset is None).

    ``req_pool_indices`` gets the next pool row instead (``value`` is ignored): a row index past the pool
    would make the verifiers themselves read outside it.
    """

    def launcher(**kw):
        _reference(kw)
        at = offset(kw)
        if at is None:
            return
        if buffer == "req_pool_indices":
            _next_row[(1,)](kw[buffer], at, kw["req_to_token"].shape[0])
        else:
            _poke(kw[buffer], at, value)

    launcher.__doc__ = f"{buffer}: {where}"
    return launcher


def _last_row(v) -> int:
    return (v.shape[0] - 1) * v.stride(0)


def _past_rows(v) -> int:
    """Offset of the first element after the last row and its guard (the tail guard)."""
    return v.shape[0] * v.stride(0)


# -- kv_indices: every region -----------------------------------------------------------------------------
kvi_value = _plant("kv_indices", lambda kw: 0, where="row 0, element 0 gets a wrong value (VALUE_MISMATCH)")
kvi_missing = _plant("kv_indices", lambda kw: 0, POISON,
                     where="row 0, element 0 is put back to poison: a missing write (MISSING_WRITE)")
kvi_other_row = _plant("kv_indices", lambda kw: _last_row(kw["kv_indices"]),
                       where="the last row's element 0 gets a wrong value (another row)")
kvi_slack = _plant("kv_indices", lambda kw: kw["kv_indices"].shape[1] - 1,
                   where="the last element of row 0: the slack after the used length (STRAY_WRITE)")
kvi_row_overflow = _plant("kv_indices", lambda kw: kw["kv_indices"].shape[1],
                          where="one past row 0's width: the guard after row 0, or row 1 in the production layout")
kvi_front_guard = _plant("kv_indices", lambda kw: -1, where="just before row 0: the front guard")
kvi_tail = _plant("kv_indices", lambda kw: _past_rows(kw["kv_indices"]) + 3, where="past the last row: the tail guard")

# -- kv_indptr: every column kind, and its guards ---------------------------------------------------------
indptr_column0 = _plant("kv_indptr", lambda kw: 0, where="column 0, never written by the contract (STRAY_WRITE)")
indptr_column0_zero = _plant("kv_indptr", lambda kw: 0, 0,
                             where="column 0 written with 0, the value production keeps there (STRAY_WRITE)")
indptr_first = _plant("kv_indptr", lambda kw: 1, where="column 1 gets a wrong value (VALUE_MISMATCH)")
indptr_bs = _plant("kv_indptr", lambda kw: _bs(kw), where="column bs, written by program (s, 0, 0), gets a wrong value")
indptr_past_bs = _plant("kv_indptr", lambda kw: _bs(kw) + 1,
                        where="column bs + 1, past the launch's columns (a stray write, or the row's guard)")
indptr_missing = _plant("kv_indptr", lambda kw: _last_row(kw["kv_indptr"]) + 1, POISON,
                        where="the last row's column 1 is put back to poison (a missing write)")
indptr_front_guard = _plant("kv_indptr", lambda kw: -1, where="just before row 0: the front guard")
indptr_tail = _plant("kv_indptr", lambda kw: _past_rows(kw["kv_indptr"]) + 3, where="past the last row: the tail guard")


# -- inputs: live rows, the bucket's last row, rows past the bucket ---------------------------------------
#: Values written into the per-request inputs: each differs from every value the input can hold, and
#: keeps the verifiers' own reads in bounds (a length of 777,777 would have them walk far past a row).
INPUT_VALUES = {"seq_lens": 0, "positions": -1, "req_pool_indices": None}  # None: the next pool row


def _input_plants(name: str):
    """Three plants into input ``name``: a live row, the bucket's last row, the first row past the bucket."""

    def past(kw):
        t = kw[name]
        return t.shape[0] if _room_past(t) else None

    value = INPUT_VALUES[name]
    return (_plant(name, lambda kw: 0, value, where="element 0 (a live request)"),
            _plant(name, lambda kw: kw[name].shape[0] - 1, value,
                   where="the bucket's last row (the runner's padding when the batch is short)"),
            _plant(name, past, value, where="the first row past the bucket (nothing when the tensor ends there)"))


seq_lens_live, seq_lens_bucket_end, seq_lens_past = _input_plants("seq_lens")
req_pool_indices_live, req_pool_indices_bucket_end, req_pool_indices_past = _input_plants("req_pool_indices")
positions_live, positions_bucket_end, positions_past = _input_plants("positions")
req_to_token_first = _plant("req_to_token", lambda kw: 0, where="the pool's first element")
req_to_token_last = _plant("req_to_token", lambda kw: kw["req_to_token"].numel() - 1,
                           where="the pool's last element (a row no request may own)")
req_to_token_front_guard = _plant("req_to_token", lambda kw: -1, where="just before the pool: its front guard")
req_to_token_tail = _plant("req_to_token", lambda kw: kw["req_to_token"].numel() + 3,
                           where="past the pool's last element: its tail guard")

#: Every plant, in table order.
PLANTS = (
    "kvi_value", "kvi_missing", "kvi_other_row", "kvi_slack", "kvi_row_overflow", "kvi_front_guard", "kvi_tail",
    "indptr_column0", "indptr_column0_zero", "indptr_first", "indptr_bs", "indptr_past_bs", "indptr_missing",
    "indptr_front_guard", "indptr_tail",
    "seq_lens_live", "seq_lens_bucket_end", "seq_lens_past",
    "req_pool_indices_live", "req_pool_indices_bucket_end", "req_pool_indices_past",
    "positions_live", "positions_bucket_end", "positions_past",
    "req_to_token_first", "req_to_token_last", "req_to_token_front_guard", "req_to_token_tail",
)
