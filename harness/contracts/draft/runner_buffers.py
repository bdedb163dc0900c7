"""The buffers the draft's CUDA-graph runner allocates for a config, and what its checker holds beside its tables.

``buffer_geometry`` is the guarded kv_indices/kv_indptr layout ``kvfence.contracts.draft.runner`` allocates from;
``runner_bytes`` prices it with everything else the draft's checker holds on the device for a config (the guarded
req_to_token pool with the verifier's copy and the graph-held temporaries that regenerate it): the draft's
``Contract.checker_bytes``. A dirty case's full verdict adds nothing there: it reads host snapshots
(``kvfence.contracts.draft.session.host_verdict``). What a config costs against the run's budget is the engine's
one number (``kvfence.engine.budget.launch_bytes``) of its widest launch (``config_bytes``), which the draws fit to
(``kvfence.contracts.draft.strategies``) and the runner cache counts (``kvfence.contracts.draft.session``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kvfence.contract import Launch
from kvfence.contracts.draft.case import Batch, Config, DraftCase
from kvfence.engine import registry
from kvfence.engine.budget import launch_bytes
from kvfence.engine.tables import GUARD
from kvfence.errors import require

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


def buffer_geometry(config: Config, n: int, absorb: bool = True) -> tuple[Geometry, Geometry]:
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


def runner_bytes(config: Config) -> int:
    """Peak device bytes of one config's runner and verifier (a bound config)."""
    n = config.max_bs  # graph: sized once at max_bs; eager: the largest batch it can be given
    kvi, kvp = buffer_geometry(config, n)
    outputs = (kvi.length + kvp.length) * GUARDED_BYTES
    # req_to_token (one entry per E tokens with page-granular rows) in its front and tail guards, and TRANSLATE's
    # page table (§6).
    pool = (config.pool_rows * config.pool_cols + 2 * GUARD + config.v2p_pages) * POOL_BYTES
    return outputs + pool


def widest_launch(config: Config) -> Launch:
    """The launch of a bound config that takes the most memory: ``max_bs`` requests of length ``ctx`` (the runner
    sizes its buffers at ``max_bs``; the longest requests need the most)."""
    require(config.bound, f"a config's bytes need its sizing, mode and layout: {config.to_dict()}")
    batch = Batch((config.ctx,) * config.max_bs, tuple(range(config.max_bs)))
    return Launch(config.contract, DraftCase(config, batch), config.row_width(config.max_bs), config.sizing,
                  "reference", config.mode, config.layout)


@lru_cache(maxsize=4096)
def config_bytes(config: Config) -> int:
    """What a bound config costs against the run's budget: ``launch_bytes`` of its widest launch, the number every
    launch of it is held to (``kvfence.engine.checking.require_fits``). Kept per config: Hypothesis draws the same
    configs again, and fitting one halves it through the same smaller ones."""
    return launch_bytes(registry.get(config.contract), widest_launch(config))
