"""Guard-padded output buffers.

A ``GuardedBuffer`` is one allocation laid out as::

    [front guard][row 0][guard after row 0][row 1]...[row R-1][guard after row R-1][tail guard]

The kernel sees a ``(rows, width)`` view whose ``stride(0)`` is ``width + row_guard``. In the
``production`` layout ``row_guard == 0``: rows are contiguous as upstream allocates them, so a row
overflow lands in the next row and only the write-set check can see it. Guards hold canaries whose
value depends on the element's position and a per-case seed, so a shifted copy of a canary is wrong.
The rows ("live region") are poisoned with ``POISON`` before a launch when asked: no slot id or
indptr value is negative, so an element still holding poison after a launch was not written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from kvfence.contracts.draft.tokens import SLOT_BITS

#: Fills the live region before a launch; every valid kv_indices / kv_indptr value is >= 0.
POISON = -1


#: Elements whose canaries ``GuardedBuffer.reset`` computes at once (bounds its int64 temporaries).
RESET_CHUNK = 1 << 22


def canary_of(seed: int, i: torch.Tensor) -> torch.Tensor:
    """Canary for flat positions ``i``: ``-(2 + ((i*0x2545F491 + seed*0x9E37) mod 2**30))``, always < POISON."""
    h = (i.to(torch.int64) * 0x2545F491 + seed * 0x9E37) & ((1 << SLOT_BITS) - 1)
    return (-(h + 2)).to(torch.int32)


def canary_values(seed: int, length: int, device, start: int = 0) -> torch.Tensor:
    """``canary_of`` flat positions ``start .. start + length - 1``."""
    return canary_of(seed, torch.arange(start, start + length, dtype=torch.int64, device=device))


@dataclass(frozen=True)
class Region:
    """Where a flat element of a ``GuardedBuffer`` sits: the region's name, row, and offset in it."""

    name: str
    row: Optional[int]
    offset: int

    @property
    def is_guard(self) -> bool:
        return self.row is None or self.name.startswith("guard")


class GuardedBuffer:
    """One output buffer of ``rows x width`` int32 elements inside guards (see module docstring)."""

    def __init__(self, name: str, rows: int, width: int, *, row_guard: int, front: int, tail: int,
                 device, canary_seed: int, guard_column0: bool = False, spacer: bool = False):
        self.name = name
        self.rows = rows
        self.width = width
        self.row_guard = row_guard
        self.front = front
        self.tail = tail
        self.stride = width + row_guard
        self.length = front + rows * self.stride + tail
        self.device = torch.device(device)
        # kv_indptr column 0 is never written by the kernel (production zeroes it once and relies on it).
        # kvfence keeps its canary there instead of 0, so a write of any value, 0 included, is seen.
        self.guard_column0 = guard_column0
        self.storage = torch.empty(self.length, dtype=torch.int32, device=self.device)
        self.view = self.storage.as_strided((rows, width), (self.stride, 1), front)
        # ``spacer``: a never-read allocation of the buffer's size made right after it, so that a store
        # running past the end most likely lands where nothing is read instead of in the next tensor
        # (under the CPU address audit such a store is dropped and named after this buffer; see _buffers).
        self._spacer = torch.empty(self.length, dtype=torch.int32, device=self.device) if spacer else None
        self.canary_seed = canary_seed
        # Nothing else of the buffer lives on the device: which elements are live and what the canaries
        # are is computed when needed. A kernel that stores past the end of the allocation hits whatever
        # the caching allocator put next to it, and a mask or canary table kept there would silently
        # change what the verdict calls a guard (seen on an H200: last_row_past_end, production layout).
        self.reset()

    @property
    def canaries(self) -> torch.Tensor:
        """The canary of every flat position (``canary_values``), computed afresh."""
        return canary_values(self.canary_seed, self.length, self.device)

    def is_live(self, flat: torch.Tensor) -> torch.Tensor:
        """Whether each flat position is inside a row (not a guard)."""
        rel = flat - self.front
        return (rel >= 0) & (rel < self.rows * self.stride) & (torch.remainder(rel, self.stride) < self.width)

    @property
    def live_mask(self) -> torch.Tensor:
        """``is_live`` of every position, computed afresh."""
        return self.is_live(torch.arange(self.length, dtype=torch.int64, device=self.device))

    def _column0(self) -> torch.Tensor:
        return torch.arange(self.front, self.front + self.rows * self.stride, self.stride, dtype=torch.int64,
                            device=self.device)

    def flat_index(self, row: int, element: int) -> int:
        """Flat storage position of ``(row, element)``; ``element`` may exceed ``width`` (an overflow)."""
        return self.front + row * self.stride + element

    def reset(self) -> None:
        """Canaries everywhere outside the rows, poison in the rows; with ``guard_column0`` the canary
        stays in column 0 of every row too (the kernel never writes it)."""
        for lo in range(0, self.length, RESET_CHUNK):
            hi = min(lo + RESET_CHUNK, self.length)
            self.storage[lo:hi].copy_(canary_values(self.canary_seed, hi - lo, self.device, start=lo))
        self.view.fill_(POISON)
        if self.guard_column0:
            column0 = self._column0()
            self.storage[column0] = canary_of(self.canary_seed, column0)

    def snapshot(self) -> torch.Tensor:
        return self.storage.clone()

    def guards_intact(self) -> bool:
        guard = ~self.live_mask
        return bool(torch.equal(self.storage[guard], self.canaries[guard]))

    def region_of(self, flat: int, used: Optional[Sequence[int]] = None) -> Region:
        """Name the region of a flat position; ``used[s]`` splits row ``s`` into written part and slack."""
        if flat < self.front:
            return Region("front guard", None, flat)
        rel = flat - self.front
        if rel >= self.rows * self.stride:
            return Region("tail", None, rel - self.rows * self.stride)
        row, col = divmod(rel, self.stride)
        if col >= self.width:
            return Region(f"guard after row {row}", row, col - self.width)
        if used is not None and col >= used[row]:
            return Region(f"slack of row {row}", row, col)
        return Region(f"row {row}", row, col)
