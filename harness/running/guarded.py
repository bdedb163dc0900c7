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

from harness.cases.case import SLOT_BITS

#: Fills the live region before a launch; every valid kv_indices / kv_indptr value is >= 0.
POISON = -1


def canary_values(seed: int, length: int, device) -> torch.Tensor:
    """Canary for flat position ``i``: ``-(2 + ((i*0x2545F491 + seed*0x9E37) mod 2**30))``, always < POISON."""
    i = torch.arange(length, dtype=torch.int64, device=device)
    h = (i * 0x2545F491 + seed * 0x9E37) & ((1 << SLOT_BITS) - 1)
    return (-(h + 2)).to(torch.int32)


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
                 device, canary_seed: int, guard_column0: bool = False):
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
        live = torch.zeros(self.length, dtype=torch.bool, device=self.device)
        live[front: front + rows * self.stride].view(rows, self.stride)[:, :width] = True
        self.live_mask = live
        self.canary_seed = canary_seed
        self.canaries = canary_values(canary_seed, self.length, self.device)
        self.reset()

    def flat_index(self, row: int, element: int) -> int:
        """Flat storage position of ``(row, element)``; ``element`` may exceed ``width`` (an overflow)."""
        return self.front + row * self.stride + element

    def reset(self) -> None:
        """Canaries everywhere outside the rows, poison in the rows; with ``guard_column0`` the canary
        stays in column 0 of every row too (the kernel never writes it)."""
        live = self.live_mask
        if self.guard_column0:
            live = live.clone()
            live[self.front: self.front + self.rows * self.stride: self.stride] = False
        self.storage.copy_(torch.where(live, torch.full_like(self.canaries, POISON), self.canaries))

    def snapshot(self) -> torch.Tensor:
        return self.storage.clone()

    def guards_intact(self) -> bool:
        return bool(torch.equal(self.storage[~self.live_mask], self.canaries[~self.live_mask]))

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
