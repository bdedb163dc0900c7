"""Guarded buffers for any contract's tables (``kvfence.contract.Table``), and one launch on them.

Every table lives inside one flat tensor laid out as

    front guard (G) | row 0 (width) | guard after row 0 (G) | row 1 | ... | guard after the last row (G) | tail (G)

and the kernel gets the strided view of the rows (``stride(0) = width + G``), so a write past a row lands in
kvfence's guard, not in the next row, and a read past an input row returns a guard value. Output rows start
as ``POISON`` (no page id or slot is negative) and output guards hold position-dependent canaries below
``CANARY_BASE``; input guards hold ``INPUT_POISON - position``, which no legitimate read returns, so an
over-read shows as a poison-derived value in the output (docs/contract.md §9, "Buffers").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from kvfence.contract import Table
from kvfence.engine.capture import collector_paused

POISON = -1
CANARY_BASE = -1000
INPUT_POISON = -(1 << 24)
GUARD = 64


@dataclass
class Guarded:
    table: Table
    flat: object  # torch tensor
    view: object  # what the kernel gets
    guard: int

    @property
    def stride(self) -> int:
        return self.table.width + self.guard

    def locate(self, position: int):
        """``(region, row, offset)`` of a flat position: region is ``front guard``, ``row``, ``guard after row``
        or ``tail``."""
        g, w, t = self.guard, self.table.width, self.table
        rows = 1 if t.rows is None else t.rows
        if position < g:
            return "front guard", None, position
        rel = position - g
        if rel >= rows * self.stride:
            return "tail", None, rel - rows * self.stride
        row, col = divmod(rel, self.stride)
        return ("row", row, col) if col < w else ("guard after row", row, col - w)

    def position(self, row: int, column: int) -> int:
        return self.guard + row * self.stride + column


def allocate(table: Table, device: str, guard: int = GUARD) -> Guarded:
    import torch

    rows = 1 if table.rows is None else table.rows
    stride = table.width + guard
    total = guard + rows * stride + guard
    dtype = getattr(torch, table.dtype)
    base = CANARY_BASE if table.role == "output" else INPUT_POISON
    flat = (base - torch.arange(total, dtype=torch.int64)).to(dtype)
    body = flat[guard:guard + rows * stride].view(rows, stride)[:, :table.width]
    if table.role == "output":
        body.fill_(POISON)
    else:
        contents = torch.as_tensor(table.contents, dtype=dtype)
        body.copy_(contents.reshape(rows, table.width))
    flat = flat.to(device)
    body = flat[guard:guard + rows * stride].view(rows, stride)[:, :table.width]
    return Guarded(table, flat, body[0] if table.rows is None else body, guard)


def allocate_all(tables: List[Table], device: str) -> Dict[str, Guarded]:
    return {t.name: allocate(t, device) for t in tables}


def snapshot(buffers: Dict[str, Guarded]) -> Dict[str, object]:
    """Each table's flat tensor, copied to the host (the verdict reads elements from it)."""
    return {name: g.flat.cpu().clone() for name, g in buffers.items()}


def launch(contract, kernel, buffers: Dict[str, Guarded], case, width: int, device: str, graph: bool) -> None:
    """One launch of ``kernel`` on the views. ``graph`` (CUDA only): warm up (compiles), restore every buffer,
    capture the launch into a ``torch.cuda.CUDAGraph`` and replay it once, as a CUDA-graph runner does."""
    views = {name: g.view for name, g in buffers.items()}
    if not graph:
        contract.launch(kernel, views, case, width)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        return
    import torch

    before = {name: g.flat.clone() for name, g in buffers.items()}
    contract.launch(kernel, views, case, width)  # compiles outside the capture
    torch.cuda.synchronize()
    for name, g in buffers.items():
        g.flat.copy_(before[name])
    cuda_graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with collector_paused(), torch.cuda.graph(cuda_graph, stream=stream):
            contract.launch(kernel, views, case, width)
    torch.cuda.current_stream().wait_stream(stream)
    for name, g in buffers.items():  # capture records, it should not run; restore in case a kernel did
        g.flat.copy_(before[name])
    cuda_graph.replay()
    torch.cuda.synchronize()
