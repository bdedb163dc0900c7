"""Guarded buffers for any contract's tables (``kvfence.contract.Table``), and one launch on them.

Every table lives inside one flat tensor laid out as

    front guard (G) | row 0 (width) | guard after row 0 (G) | row 1 | ... | guard after the last row (G) | tail (G)

and the kernel gets the strided view of the rows (``stride(0) = width + G``), so a write past a row lands in
kvfence's guard, not in the next row, and a read past an input row returns a guard value. Output rows start
as ``POISON`` (no page id or slot is negative) and output guards hold position-dependent canaries below
``CANARY_BASE``; input guards hold ``INPUT_POISON - position``, which no legitimate read returns, so an
over-read shows as a poison-derived value in the output (docs/contract.md §9, "Buffers").

A table whose ``guards`` are ``ends`` keeps its rows contiguous in every layout (its kernel takes no row stride).
The ``production`` layout lays the rows out contiguously, as upstream does (no guard between rows: a write past
a row lands in the next one), keeping the front and tail guards; without ``absorb`` (``--no-absorb``, for
compute-sanitizer) there is no tail either, so a write past the last row leaves the allocation.

An output table's tail holds what a launch can store past its last row within the contract's own bounds
(``tail_guard``): one whole row with its guard (a row index one past the end), or the launch's spill
(``need - width``: a correct kernel under a too-narrow sizing writes that far past a row) where that is longer,
plus ``GUARD``. So such a store lands in kvfence's own guard (``GUARD_OVERWRITE``), never past the allocation into
another tensor (docs/contract.md §9, "Buffers"). An input's tail stays ``GUARD``: a read past it corrupts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from kvfence.contract import Contract, Launch, Table
from kvfence.engine.capture import collector_paused

if TYPE_CHECKING:  # torch is imported where a table is allocated, not at start-up
    import torch

POISON = -1
CANARY_BASE = -1000
INPUT_POISON = -(1 << 24)
GUARD = 64


@dataclass
class Guarded:
    table: Table
    flat: torch.Tensor
    view: torch.Tensor  # what the kernel gets
    guard: int  # elements between two rows
    front: int = GUARD
    tail: int = GUARD

    @property
    def stride(self) -> int:
        return self.table.width + self.guard

    @property
    def rows(self) -> int:
        return 1 if self.table.rows is None else self.table.rows

    def locate(self, position: int) -> Tuple[str, Optional[int], int]:
        """``(region, row, offset)`` of a flat position: region is ``front guard``, ``row``, ``guard after row``
        or ``tail``."""
        w = self.table.width
        if position < self.front:
            return "front guard", None, position
        rel = position - self.front
        body = self.rows * self.stride
        if rel >= body:
            return "tail", None, rel - body
        if self.stride == 0:
            return "tail", None, rel
        row, col = divmod(rel, self.stride)
        return ("row", row, col) if col < w else ("guard after row", row, col - w)

    def position(self, row: int, column: int) -> int:
        return self.front + row * self.stride + column


def contents_of(table: Table) -> Optional[Sequence[Any]]:
    """An input's contents, built now if the contract gave a callable."""
    return table.contents() if callable(table.contents) else table.contents


def row_guard(table: Table, layout: str) -> int:
    """Elements between two rows of ``table`` under ``layout``."""
    return GUARD if layout == "redzone" and table.guards == "rows" else 0


def tail_guard(table: Table, *, layout: str = "redzone", absorb: bool = True, spill: int = 0) -> int:
    """Elements after ``table``'s last row: ``GUARD`` for an input; for an output ``GUARD`` plus the longer of one
    row with its guard and ``spill`` (how far past a row the launch may store within the contract's bounds); none
    without ``absorb`` in the production layout (``--no-absorb``)."""
    if not (layout == "redzone" or absorb):
        return 0
    if table.role != "output":
        return GUARD
    return GUARD + max(table.width + row_guard(table, layout), spill)


def allocated_elements(table: Table, *, layout: str = "redzone", absorb: bool = True, spill: int = 0) -> int:
    """Elements ``allocate`` gives ``table``: front guard, rows with their guards, tail."""
    rows = 1 if table.rows is None else table.rows
    stride = table.width + row_guard(table, layout)
    return GUARD + rows * stride + tail_guard(table, layout=layout, absorb=absorb, spill=spill)


def allocate(table: Table, device: str, *, layout: str = "redzone", absorb: bool = True, spill: int = 0
             ) -> Guarded:
    """``table`` in a guarded buffer on ``device`` (the module docstring's layout). ``spill``: elements past a row
    that the launch may store within the contract's bounds (``need - width`` when positive), which the tail holds."""
    import torch

    rows = 1 if table.rows is None else table.rows
    guard = row_guard(table, layout)
    tail = tail_guard(table, layout=layout, absorb=absorb, spill=spill)
    stride = table.width + guard
    total = GUARD + rows * stride + tail
    dtype = getattr(torch, table.dtype)
    base = CANARY_BASE if table.role == "output" else INPUT_POISON
    flat = (base - torch.arange(total, dtype=torch.int64)).to(dtype)
    body = flat[GUARD:GUARD + rows * stride].view(rows, stride)[:, :table.width]
    if table.role == "output":
        body.fill_(POISON)
    elif rows * table.width:
        contents = torch.as_tensor(contents_of(table), dtype=dtype)
        body.copy_(contents.reshape(rows, table.width))
    flat = flat.to(device)
    body = flat[GUARD:GUARD + rows * stride].view(rows, stride)[:, :table.width]
    return Guarded(table, flat, body[0] if table.rows is None else body, guard, GUARD, tail)


def allocate_all(tables: List[Table], device: str, *, layout: str = "redzone", absorb: bool = True, spill: int = 0
                 ) -> Dict[str, Guarded]:
    return {t.name: allocate(t, device, layout=layout, absorb=absorb, spill=spill) for t in tables}


def snapshot(buffers: Dict[str, Guarded]) -> Dict[str, torch.Tensor]:
    """Each table's flat tensor, copied to the host (the verdict reads elements from it)."""
    return {name: g.flat.cpu().clone() for name, g in buffers.items()}


def launch(record: Contract[Any], kernel: Any, buffers: Dict[str, Guarded], value: Launch[Any], device: str,
           graph: bool) -> None:
    """One launch of ``kernel`` on the views (``value``: the engine's ``Launch``). ``graph`` (CUDA only): warm up
    (compiles), restore every buffer, capture the launch into a ``torch.cuda.CUDAGraph`` and replay it once, as a
    CUDA-graph runner does."""
    views = {name: g.view for name, g in buffers.items()}
    if not graph:
        record.launch(kernel, views, value)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        return
    import torch

    before = {name: g.flat.clone() for name, g in buffers.items()}
    record.launch(kernel, views, value)  # compiles outside the capture
    torch.cuda.synchronize()
    for name, g in buffers.items():
        g.flat.copy_(before[name])
    cuda_graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with collector_paused(), torch.cuda.graph(cuda_graph, stream=stream):
            record.launch(kernel, views, value)
    torch.cuda.current_stream().wait_stream(stream)
    for name, g in buffers.items():  # capture records, it should not run; restore in case a kernel did
        g.flat.copy_(before[name])
    cuda_graph.replay()
    torch.cuda.synchronize()
