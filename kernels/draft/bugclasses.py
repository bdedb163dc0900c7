"""One launcher per memory-bug class of the detection matrix (``kvfence.sanitizer.matrix``).

Each launcher runs the reference kernel, then one Triton store lands where that class of bug lands. They
are kvfence launcher plug-ins (``kvfence.kernels.draft.bugclasses:NAME``, keyword arguments of
``kvfence.contracts.draft.targets.LAUNCH_KWARGS``); offsets are relative to the first element of the ``kv_indices``
view, whose rows are ``stride(0)`` apart. The classes differ in *where* the stray store lands, which is what
decides which detector can see it:

* ``row_to_row``: one past row 0's width. In the production layout that is row 1's first element, inside
  the same allocation (the pre-fix sizing's bug: a row overflow landing in the next row).
* ``short_tail``: a few elements past the last row: just past the end of the buffer, within memcheck's
  ``--padding`` (and within the caching allocator's rounding of the block).
* ``far_tail``: ``FAR_ELEMENTS`` past the last row: past any guard and any padding.
* ``input_write``: into the input ``req_to_token``, a valid allocation the kernel must only read.
"""

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: Written by every stray store: no slot id, canary or poison value equals it.
BAD_VALUE = 777_777
#: Elements past the last row for ``short_tail`` (12 bytes: inside a 256-byte --padding).
SHORT_ELEMENTS = 3
#: Elements past the last row for ``far_tail`` (4 KiB: past kvfence's 64-element guards and the padding).
FAR_ELEMENTS = 1024

#: class name -> (launcher attr, one line on what it models)
CLASSES = {
    "row-to-row overflow": ("row_to_row", "a store one past row 0's width (production: into row 1)"),
    "short tail overflow": ("short_tail", f"a store {SHORT_ELEMENTS} elements past the last row"),
    "far tail overflow": ("far_tail", f"a store {FAR_ELEMENTS} elements past the last row"),
    "stray write into an input": ("input_write", "a store into req_to_token, which the kernel must only read"),
}


@triton.jit
def _store(ptr, offset, value):
    tl.store(ptr + offset, value)


def _poke(tensor, offset: int) -> None:
    _store[(1,)](tensor, offset, BAD_VALUE)


def _end(view) -> int:
    """Offset of the first element after the last row (shapes only: no host sync, capture-safe)."""
    return (view.shape[0] - 1) * view.stride(0) + view.shape[1]


def row_to_row(**kw):
    launch(generate_draft_decode_kv_indices, **kw)
    _poke(kw["kv_indices"], kw["kv_indices"].shape[1])


def short_tail(**kw):
    launch(generate_draft_decode_kv_indices, **kw)
    _poke(kw["kv_indices"], _end(kw["kv_indices"]) + SHORT_ELEMENTS - 1)


def far_tail(**kw):
    launch(generate_draft_decode_kv_indices, **kw)
    _poke(kw["kv_indices"], _end(kw["kv_indices"]) + FAR_ELEMENTS - 1)


def input_write(**kw):
    launch(generate_draft_decode_kv_indices, **kw)
    _poke(kw["req_to_token"], 0)
