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

A checker that lays out its own tables (the draft's CUDA-graph runner: buffers sized once at ``max_bs``, kept
between replays, its geometry its memory budget's) allocates them with ``allocate_laid_out``: the same ``Guarded``,
with optional fields the engine's own tables leave at their defaults: seeded canaries (``canary_seed``: a
per-case seed, so a canary copied from another case or position is wrong), a canary kept in column 0 of every
row (``column0_canary``: a column the kernel never writes), and a never-read spacer after the allocation
(``spacer``). ``reset`` puts canaries and poison back between launches (an input's: its guards' poison, its rows
left to the caller); the verdict compares what a launch left with what the table held before it, so stale rows
between replays are judged as any other.
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
#: Seeded canaries are ``-(2 + h)`` for a hash ``h`` of this many bits: below ``POISON``, never a slot id.
SEEDED_CANARY_BITS = 30
#: Elements whose seeded canaries ``Guarded.reset`` computes at once (bounds its int64 temporaries).
RESET_CHUNK = 1 << 22


def guard_values(role: str, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The unseeded guard value of each flat position of a table of ``role``: ``CANARY_BASE - position`` in an
    output's guards, ``INPUT_POISON - position`` in an input's."""
    return ((CANARY_BASE if role == "output" else INPUT_POISON) - positions).to(dtype)


def seeded_canaries(seed: int, positions: torch.Tensor) -> torch.Tensor:
    """The seeded canary of each flat position: ``-(2 + ((i*0x2545F491 + seed*0x9E37) mod 2**30))`` (int32);
    the device verifier's kernels compute the same (``kernels/draft/verify``)."""
    import torch

    h = (positions.to(torch.int64) * 0x2545F491 + seed * 0x9E37) & ((1 << SEEDED_CANARY_BITS) - 1)
    return (-(h + 2)).to(torch.int32)


@dataclass
class Guarded:
    table: Table
    flat: torch.Tensor
    view: torch.Tensor  # what the kernel gets
    guard: int  # elements between two rows
    front: int = GUARD
    tail: int = GUARD
    #: None: positional canaries (``CANARY_BASE - position`` in an output's guards); a seed: ``seeded_canaries``.
    canary_seed: Optional[int] = None
    #: Column 0 of every row holds its canary, not poison (a column the kernel never writes, so a write of any
    #: value there, 0 included, is seen).
    column0_canary: bool = False
    #: A never-read allocation of the table's size made right after it (``allocate_laid_out``).
    spacer: Optional[torch.Tensor] = None

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

    def canaries(self, start: int, length: int) -> torch.Tensor:
        """The guard value of flat positions ``start .. start + length - 1`` of an output, on its device."""
        import torch

        return self._canaries_at(torch.arange(start, start + length, dtype=torch.int64, device=self.flat.device))

    def _canaries_at(self, positions: torch.Tensor) -> torch.Tensor:
        if self.canary_seed is not None:
            return seeded_canaries(self.canary_seed, positions)
        return guard_values("output", positions, self.flat.dtype)

    def reset(self) -> None:
        """An output as before its first launch: canaries outside the rows (and in column 0 with
        ``column0_canary``), poison in the rows. An input: its guards' poison back, its rows as they are."""
        if self.table.role != "output":
            self._poison_input_guards()
            return
        for lo in range(0, len(self.flat), RESET_CHUNK):
            hi = min(lo + RESET_CHUNK, len(self.flat))
            self.flat[lo:hi].copy_(self.canaries(lo, hi - lo))
        self.view.fill_(POISON)
        if self.column0_canary and self.rows and self.table.width:
            import torch

            column0 = torch.arange(self.front, self.front + self.rows * self.stride, self.stride, dtype=torch.int64,
                                   device=self.flat.device)
            self.flat[column0] = self._canaries_at(column0)

    def _poison_input_guards(self) -> None:
        import torch

        def poison(positions: torch.Tensor) -> torch.Tensor:
            return guard_values("input", positions, self.flat.dtype)

        device = self.flat.device
        body = self.front + self.rows * self.stride
        self.flat[:self.front].copy_(poison(torch.arange(self.front, dtype=torch.int64, device=device)))
        self.flat[body:].copy_(poison(torch.arange(body, len(self.flat), dtype=torch.int64, device=device)))
        if self.guard and self.rows:
            start = self.front + self.table.width
            between = self.flat.as_strided((self.rows, self.guard), (self.stride, 1), start)
            rows = torch.arange(self.rows, dtype=torch.int64, device=device)[:, None] * self.stride
            between.copy_(poison(start + rows + torch.arange(self.guard, dtype=torch.int64, device=device)))


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
    flat = guard_values(table.role, torch.arange(total, dtype=torch.int64), dtype)
    body = flat[GUARD:GUARD + rows * stride].view(rows, stride)[:, :table.width]
    if table.role == "output":
        body.fill_(POISON)
    elif rows * table.width:
        contents = torch.as_tensor(contents_of(table), dtype=dtype)
        body.copy_(contents.reshape(rows, table.width))
    flat = flat.to(device)
    body = flat[GUARD:GUARD + rows * stride].view(rows, stride)[:, :table.width]
    return Guarded(table, flat, body[0] if table.rows is None else body, guard, GUARD, tail)


def allocate_laid_out(table: Table, device: str, *, guard: int, front: int, tail: int,
                      canary_seed: Optional[int] = None, column0_canary: bool = False, spacer: bool = False
                      ) -> Guarded:
    """``table`` in a guarded buffer of the caller's geometry (``guard`` between rows, ``front``, ``tail``). An
    output is reset (canaries, poisoned rows); an input's guards hold ``INPUT_POISON - position`` and its rows
    zeros, for the caller to fill (a read past its rows returns poison, as from ``allocate``'s inputs).
    ``spacer``: a never-read allocation of the same size right after it, so a store running past the end most
    likely lands where nothing is read (the CPU address audit drops a store outside every registered tensor and
    names the table, instead of performing it in a neighbour)."""
    import torch

    rows = 1 if table.rows is None else table.rows
    stride = table.width + guard
    total = front + rows * stride + tail
    dtype = getattr(torch, table.dtype)
    flat = torch.zeros(total, dtype=dtype, device=device)
    view = flat.as_strided((rows, table.width), (stride, 1), front)
    g = Guarded(table, flat, view[0] if table.rows is None else view, guard, front, tail, canary_seed,
                column0_canary, torch.empty(total, dtype=dtype, device=device) if spacer else None)
    g.reset()
    return g


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
