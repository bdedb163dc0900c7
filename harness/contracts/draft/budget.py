"""Device memory a config costs, known before anything is allocated, and fitting draws to a budget.

A production-sized draw (256 requests x 131072 tokens x topk 16 x 16 steps) would need tens of GB for
kv_indices alone. Every buffer kvfence allocates for a config is sized here first: the guarded outputs
(``buffer_geometry`` is also what ``kvfence.contracts.draft.runner`` allocates from, so the estimate cannot drift),
the req_to_token pool with the verifier's copy and the graph-held temporaries that regenerate it, and
the full verdict's transient tensors for a dirty case. ``fit`` shrinks a draw's free fields until it
fits, so an over-budget draw becomes a smaller config instead of an out-of-memory crash.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional

#: kvfence's minimum guard (elements) at the front, after rows (redzone layout) and at the tail.
MIN_GUARD = 64
#: Elements past kv_indices' last row (and its guard) that its tail guard always covers: past the
#: detection matrix's far-tail store (``kvfence.kernels.draft.bugclasses.FAR_ELEMENTS``, 1,024).
TAIL_REACH = 2048
#: The most elements of one extra row that kv_indices' tail guard holds (4 MiB of int32).
TAIL_ROW_CAP = 1 << 20
#: Bytes per element of a guarded int32 buffer: its storage, the CPU's never-read spacer, and the
#: canaries, live mask (bool) and temporaries that ``reset`` and the verdict compute when needed.
GUARDED_BYTES = 4 + 4 + 1 + 4
#: Bytes per req_to_token element: the table, the verifier's copy, and the int64 temporaries of the
#: regeneration that a captured graph keeps in its pool.
POOL_BYTES = 4 + 4 + 3 * 8
#: Bytes per written element on the full (dirty-case) path: two snapshots and the verdict's expected
#: copy and masks, plus the torch write-set builder's int64 temporaries.
FULL_PATH_BYTES = 3 * 4 + 2 + 8 * 8


@dataclass(frozen=True)
class Geometry:
    """One guarded buffer: ``rows`` of ``width`` elements, guards in front, after each row, at the tail."""

    rows: int
    width: int
    row_guard: int
    front: int
    tail: int

    @property
    def length(self) -> int:
        return self.front + self.rows * (self.width + self.row_guard) + self.tail


def buffer_geometry(config, n: int, absorb: bool = True):
    """``(kv_indices, kv_indptr)`` geometries for a launch sized with ``n`` (``max_bs`` in graph mode).

    Guards are at least as long as the farthest element a correct kernel can write past a row under
    this sizing (``Config.worst_overflow``), so even the pre-fix policy stays inside the allocation;
    kv_indices' tail adds one whole row (at least ``TAIL_REACH``, at most ``TAIL_ROW_CAP`` elements), so
    a kernel that writes a row past the buffer hits kvfence's own guard on both verifiers.
    ``absorb=False`` keeps ``MIN_GUARD`` before and between rows but no tail guard after kv_indices' last
    row: an overflow past the buffer then leaves the allocation at its first element, as it does in
    production. Only for runs under compute-sanitizer, which is what reports such writes.
    """
    overflow = max(0, config.worst_overflow()) if absorb else 0
    redzone = config.layout == "redzone"
    width = config.row_width(n)
    row_guard = MIN_GUARD + overflow if redzone else 0
    # The tail also holds one whole row (up to TAIL_ROW_CAP elements, and never less than TAIL_REACH):
    # a store up to a row past the last one lands in kvfence's own guard, on every path and device,
    # instead of wherever the allocator put the next tensor.
    tail = MIN_GUARD + overflow + max(TAIL_REACH, min(width + row_guard, TAIL_ROW_CAP)) if absorb else 0
    kv_indices = Geometry(config.num_steps, width, row_guard, MIN_GUARD, tail)
    kv_indptr = Geometry(config.num_steps, n * config.topk + 1, MIN_GUARD if redzone else 0, MIN_GUARD, MIN_GUARD)
    return kv_indices, kv_indptr


def estimate_bytes(config) -> int:
    """Peak device bytes of one config's runner, verifier and a dirty case's full verdict."""
    n = config.max_bs  # graph: sized once at max_bs; eager: the largest batch it can be given
    kvi, kvp = buffer_geometry(config, n)
    outputs = (kvi.length + kvp.length) * GUARDED_BYTES
    # req_to_token (one entry per E tokens with page-granular rows) and TRANSLATE's page table (§6).
    pool = (config.pool_rows * config.pool_cols + config.v2p_pages) * POOL_BYTES
    # The full path builds the write set of every step row (at most need entries each).
    written = config.num_steps * config.worst_need(n)
    transient = kvi.length * 3 * 4 + written * FULL_PATH_BYTES
    return outputs + pool + transient


def fit(config, max_bytes: Optional[int], free: Iterable[str] = ("ctx", "max_bs", "topk", "num_steps")):
    """The config itself if it fits ``max_bytes``, else a smaller one: halve the ``free`` fields in order
    (ctx first: long contexts are what cost memory), keeping ``ctx > num_steps``. Deterministic, so a
    shrinking Hypothesis draw maps to a shrinking config. ``None`` when even the smallest does not fit.
    """
    if max_bytes is None:
        return config
    free = list(free)
    while estimate_bytes(config) > max_bytes:
        for name in free:
            value = getattr(config, name)
            floor = config.num_steps + 1 if name == "ctx" else 1
            if value > floor:
                changes = {name: max(floor, value // 2)}
                if name == "max_bs":
                    changes["buckets"] = tuple(b for b in config.buckets if b < changes[name]) + (changes[name],)
                config = replace(config, **changes)
                break
        else:
            return None
    return config
