"""Interpreter address audit: a CPU memcheck for kernels run under ``TRITON_INTERPRET=1``.

While an ``Audit`` is active it wraps the memory operations of Triton's interpreter (the singleton
``triton.runtime.interpreter.interpreter_builder``: ``create_masked_load``, ``create_masked_store``,
``create_atomic_rmw``, ``create_atomic_cas``; plain, atomic and block-pointer loads and stores all
funnel into these) and checks the address of every active lane against the allocations the harness
registered. Tensors a kernel is launched with that nobody registered (a launcher plug-in's scratch
buffers) are registered automatically, under their parameter name, when the interpreter copies the
launch arguments (``GridExecutor._init_args_hst``).

What is reported (as ``Finding``s of ``kvfence.engine.findings``), per registered allocation:

* ``OOB_WRITE``: a store or atomic lane outside every registered allocation. The lane is **dropped**
  (masked off, or for ``atomic_cas`` redirected to a scratch word) so host memory is never corrupted.
  A store into our own allocation is performed and not reported here: a store into a guard of a guarded table
  (``kvfence.engine.tables.Guarded``) is the canary check's ``GUARD_OVERWRITE``, a store into an input is the
  verdict's ``STRAY_WRITE`` (changed input).
* ``OOB_READ``: a load lane outside the *extent the kernel was handed*: outside every registered
  tensor view (a guard of kv_indices/kv_indptr counts as outside: reading it is reading past a row; so
  does the part of a static graph-runner input past the bucket's slice), and, for an input whose contract
  declares who owns its rows (``Table.row_owners``: ``(grid axis, rows)``, as the draft's ``req_to_token``),
  a read by the program of index ``b`` on that axis outside row ``rows[b]`` (a column past a request's row
  that lands in another request's row, or a row taken from the wrong index). Lanes outside
  every allocation are masked off (they read ``other``/0) so a wild read cannot fault either.

A bad lane is attributed to the allocation its pointer was derived from (pointer arithmetic carries
it: ``kv_indices + 10**7`` is kv_indices' store wherever it lands), else to the allocation an in-bounds
lane of the same access is in, else to the nearest. Each finding names the argument, the region (``front guard``,
``row S``, ``guard after row S``, ``tail``, ``past the allocation``, ``before the allocation``, ``past the view``),
element offsets inside that region, samples ``(offset, None, value stored or None)`` and the program ids (interpreter
grid indices) that touched it. Works with Triton 3.6 through 3.9 (the wrapped methods take the extra
cache/eviction arguments of either version as ``*rest``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from kvfence.engine.findings import Finding, Kind
from kvfence.errors import BadInput

if TYPE_CHECKING:  # annotations only
    from kvfence.engine.tables import Guarded

#: Runs kept per (kind, argument, region); the last one says how many were left out.
MAX_RUNS = 16
#: Lanes kept per (kind, argument, region); further bad lanes are counted, not stored.
MAX_LANES = 1 << 14
#: Samples kept per finding.
MAX_SAMPLES = 3
#: Programs listed per finding.
MAX_PROGRAMS = 32
#: Bytes past address 0 that count as an access through a zero-element table's null pointer.
NULL_SPAN = 1 << 24

_EMPTY = np.zeros(0, dtype=np.uint64)
#: Interpreter ops that derive a pointer from another (``_derive`` carries the allocation it came from).
_DERIVING = ("create_addptr", "create_splat", "create_broadcast", "create_expand_dims", "create_reshape",
             "create_trans", "create_permute", "create_select", "create_cat", "create_join", "create_bitcast",
             "create_unsplat")


@dataclass
class Allocation:
    """One registered allocation: its storage's byte range and the byte ranges the kernel may read."""

    name: str
    base: int
    nbytes: int
    elsize: int
    readable: List[Tuple[int, int]]
    region: Callable[[int], Tuple[str, int]]  # element index from ``base`` -> (region, offset in region)
    coords: Callable[[int], str] = lambda flat: ""
    # 2-D contiguous inputs only: which row program ``grid_idx`` may read (None: any row of the view).
    row_of_program: Optional[Callable[[Tuple[int, int, int]], int]] = None
    row_bytes: int = 0
    #: An output table's (``register_table``): a store into it outside its rows (a guard) is recorded with the
    #: program that made it (``Audit.guard_stores``), for the guard overwrite the canary check reports there.
    watch_guards: bool = False

    @property
    def end(self) -> int:
        return self.base + self.nbytes

    def row_span(self, row: int) -> Optional[Tuple[int, int]]:
        """Byte range of row ``row`` (``row_of_program``'s answer), None where there is no such row: a contiguous
        tensor's rows are ``row_bytes`` apart from its view's start, a table's are its readable spans."""
        if self.row_bytes:
            start = self.readable[0][0] + row * self.row_bytes
            return start, start + self.row_bytes
        return self.readable[row] if 0 <= row < len(self.readable) else None

    def row_containing(self, addr: int) -> bool:
        """Whether ``addr`` is inside a row that some program may read (the view's rows, or a table's)."""
        return any(lo <= addr < hi for lo, hi in self.readable)


def _view_extent(t: torch.Tensor) -> Tuple[int, int]:
    """Byte range ``[lo, hi)`` a strided view spans (empty views span nothing)."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return lo, lo + span * t.element_size()


def _storage_range(t: torch.Tensor) -> Tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def owner_of_rows(row_owners: Optional[Tuple[int, Tuple[int, ...]]]
                  ) -> Optional[Callable[[Tuple[int, int, int]], int]]:
    """A table's ``row_owners`` (``kvfence.contract.Table``) as ``Allocation.row_of_program``: program ``grid``'s
    row, -1 (no row) for a program past the declared ones; None when any program may read any row."""
    if row_owners is None:
        return None
    axis, rows = row_owners

    def row_of(grid: Tuple[int, int, int]) -> int:
        index = grid[axis]
        return rows[index] if index < len(rows) else -1

    return row_of


class Audit:
    """Register allocations, then ``with audit:`` around interpreted launches; ``findings()`` after."""

    def __init__(self) -> None:
        self.allocations: List[Allocation] = []
        #: Zero-element tables, launched as null pointers (``register_table``): an access near address 0 is theirs.
        self.null_views: List[Allocation] = []
        self._events: Dict[Tuple[Kind, str, str], dict[str, Any]] = {}
        self._tables_dirty = True
        self._read_tables: Dict[tuple[Any, ...], Tuple[np.ndarray, np.ndarray]] = {}
        self._saved: Optional[Tuple[Dict[str, Any], Any, Any]] = None
        self._scratch = np.zeros(64, dtype=np.uint64)  # atomic_cas lanes that would have gone wild
        #: ``(table, region, offset) -> (program, grid)``: the first program seen storing into each guard element
        #: of an output table (``register_table``), with the launch's grid dimensions. The store is performed
        #: (the canary check reports it as ``GUARD_OVERWRITE``); this says who made it.
        #: The grid dimensions of the launches seen making a bad access or a guard store.
        self.grid_dims: set[Tuple[int, ...]] = set()
        self.guard_stores: Dict[Tuple[str, str, int], Tuple[Tuple[int, ...], Tuple[int, ...]]] = {}

    # -- registration ------------------------------------------------------------------------------
    def _covered(self, base: int) -> bool:
        return any(a.base <= base < a.end for a in self.allocations)

    def register_table(self, g: Guarded) -> None:
        """A table of ``kvfence.engine.tables`` (``Guarded``): the flat tensor is ours; only its rows are
        readable (a load from a guard, or past the last row, is a read past the table). A table of no elements
        (width 0) reaches the kernel as a null pointer, as a zero-element tensor does in any launch: every access
        through it is past its (empty) rows, and is named after it (``NULL_SPAN``)."""
        if g.view.numel() == 0:
            es = g.flat.element_size()
            self.null_views.append(Allocation(
                g.table.name, 0, NULL_SPAN, es, [],
                lambda flat: ("past a zero-width row (the kernel was given a null pointer)", flat)))
        base, nbytes = _storage_range(g.flat)
        es = g.flat.element_size()
        start = g.flat.data_ptr() + g.front * es
        readable = [(start + r * g.stride * es, start + (r * g.stride + g.table.width) * es) for r in range(g.rows)]

        def region(flat: int) -> Tuple[str, int]:
            if flat < 0:
                return "before the allocation", flat
            if flat >= len(g.flat):
                return "past the allocation", flat - len(g.flat)
            name, row, offset = g.locate(flat)
            return (f"{name} {row}" if row is not None else name), offset

        def coords(flat: int) -> str:
            if not 0 <= flat < len(g.flat):  # past the allocation: where the view's row arithmetic put it
                if not g.stride:
                    return ""
                past_row, column = divmod(flat - g.front, g.stride)
                return (f"= {g.table.name}[{past_row}, {column}] of the ({g.rows}, {g.table.width}) view, row stride "
                        f"{g.stride}")
            name, row, offset = g.locate(flat)
            return f"= {g.table.name}[{row}, {offset}]" if name == "row" else ""

        self._add(Allocation(g.table.name, base, nbytes, es, readable, region, coords,
                             owner_of_rows(g.table.row_owners), watch_guards=g.table.role == "output"))

    def register_tensor(self, name: str, t: torch.Tensor,
                        row_of_program: Optional[Callable[[Tuple[int, int, int]], int]] = None) -> None:
        """An input (or any tensor): readable over the view it is passed as, ours over its storage.

        ``row_of_program`` (2-D contiguous tensors): program ``grid_idx`` may read only that row.
        """
        base, nbytes = _storage_range(t)
        es = t.element_size()
        lo, hi = _view_extent(t)
        row_bytes = 0
        if row_of_program is not None:
            if t.dim() != 2 or not t.is_contiguous():
                raise ValueError(f"row_of_program needs a contiguous 2-D tensor, {name} is not")
            row_bytes = t.shape[1] * es
        width = t.shape[1] if t.dim() == 2 else 0

        def region(flat: int) -> Tuple[str, int]:
            if flat < 0:
                return "before the allocation", flat
            if flat * es >= nbytes:
                return "past the allocation", flat - nbytes // es
            v0, v1 = (lo - base) // es, (hi - base) // es
            if flat >= v1:
                return "past the view", flat - v1
            if flat < v0:
                return "before the view", flat - v0
            return "view", flat - v0

        def coords(flat: int) -> str:
            if width:
                row, col = divmod(flat - (lo - base) // es, width)
                return f"= {name}[{row}, {col}] of the {tuple(t.shape)} view"
            return ""

        self._add(Allocation(name, base, nbytes, es, [(lo, hi)], region, coords, row_of_program, row_bytes))

    def _add(self, alloc: Allocation) -> None:
        for other in self.allocations:
            if alloc.base < other.end and other.base < alloc.end:
                raise ValueError(f"allocations {other.name} and {alloc.name} overlap; register each storage once")
        self.allocations.append(alloc)
        self._tables_dirty = True

    def _register_launch_args(self, arg_names: Sequence[str], args_hst: Sequence[Any],
                              kwargs_hst: Dict[str, Any]) -> None:
        named = list(zip(arg_names, args_hst)) + list(kwargs_hst.items())
        for name, arg in named:
            # triton's TensorWrapper (a reinterpreted dtype) keeps the tensor in .base
            t = arg if isinstance(arg, torch.Tensor) else getattr(arg, "base", None)
            if (isinstance(t, torch.Tensor) and t.device.type == "cpu"
                    and not self._covered(t.untyped_storage().data_ptr())):
                self.register_tensor(f"{name} (unregistered launch argument)", t)

    # -- interval tables ---------------------------------------------------------------------------
    def _rebuild(self) -> None:
        allocs = sorted(self.allocations, key=lambda a: a.base)
        self._store_starts = np.array([a.base for a in allocs], dtype=np.uint64)
        self._store_ends = np.array([a.end for a in allocs], dtype=np.uint64)
        self._constrained = [a.row_of_program for a in self.allocations if a.row_of_program is not None]
        watched = [a for a in allocs if a.watch_guards]
        self._watched_starts = np.array([a.base for a in watched], dtype=np.uint64)
        self._watched_ends = np.array([a.end for a in watched], dtype=np.uint64)
        rows = sorted(span for a in watched for span in a.readable if span[1] > span[0])
        self._row_starts = np.array([r[0] for r in rows], dtype=np.uint64)
        self._row_ends = np.array([r[1] for r in rows], dtype=np.uint64)
        self._read_tables = {}
        self._tables_dirty = False

    def _read_table(self, grid: Tuple[int, int, int]) -> Tuple[np.ndarray, np.ndarray]:
        key = tuple(row_of_program(grid) for row_of_program in self._constrained)
        table = self._read_tables.get(key)
        if table is None:
            spans = []
            for a in self.allocations:
                if a.row_of_program is not None:
                    span = a.row_span(a.row_of_program(grid))
                    spans.extend([span] if span is not None else [])
                else:
                    spans.extend(s for s in a.readable if s[1] > s[0])
            spans.sort()
            table = (np.array([s[0] for s in spans], dtype=np.uint64), np.array([s[1] for s in spans], dtype=np.uint64))
            self._read_tables[key] = table
        return table

    @staticmethod
    def _outside(addr: np.ndarray, size: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Lanes whose ``[addr, addr+size)`` is not inside one of the sorted intervals."""
        if starts.size == 0:
            return np.ones(addr.shape, dtype=bool)
        i = np.searchsorted(starts, addr, side="right").astype(np.int64) - 1
        return (i < 0) | (addr + np.uint64(size) > ends[i])

    # -- the wrapped interpreter operations ---------------------------------------------------------
    def _grid(self) -> Tuple[int, int, int]:
        x, y, z = self._builder.grid_idx  # the interpreter's 3 axes (unpacked: this runs on every load)
        return int(x), int(y), int(z)

    def _grid_dims(self) -> Tuple[int, ...]:
        """The launch's grid, noted in ``grid_dims`` (only where a lane is recorded: asking on every access costs
        the hot path, and only a recorded program is ever cut to the grid's shape)."""
        dims = tuple(int(x) for x in getattr(self._builder, "grid_dim", ()))
        self.grid_dims.add(dims)
        return dims

    @staticmethod
    def _elsize(ptrs: Any) -> int:
        return max(1, int(ptrs.get_element_ty().primitive_bitwidth) // 8)

    def _check(self, kind: Kind, ptrs: Any, mask: Optional[np.ndarray], values: Optional[np.ndarray]
               ) -> Optional[np.ndarray]:
        """Record bad lanes; return the lanes to keep (full shape) or None when every lane is fine."""
        if self._tables_dirty:
            self._rebuild()
        p = ptrs.data
        if mask is None:
            active = None
            addr = p.ravel()
        else:
            active = np.broadcast_to(mask, p.shape)
            addr = p[active]
        if addr.size == 0:
            return None
        size = self._elsize(ptrs)
        if kind is Kind.OOB_READ:
            grid = self._grid()
            starts, ends = self._read_table(grid)
        else:
            self._note_guard_stores(addr, size)
            starts, ends = self._store_starts, self._store_ends
        bad = self._outside(addr, size, starts, ends)
        if not bad.any():
            return None
        grid = self._grid()
        self._grid_dims()
        bad_addr = addr[bad]
        wild = self._outside(bad_addr, size, self._store_starts, self._store_ends)
        vals = None
        if values is not None:
            v = np.broadcast_to(values, p.shape)
            vals = (v[active] if active is not None else v.ravel())[bad]
        # Provenance hint: a lane of the same access that is inside an allocation names the tensor the
        # kernel was indexing (a row copy that runs past the end is partly inside, partly outside).
        hint = getattr(ptrs, "_kvfence_origin", None)  # the allocation the pointer was derived from
        if hint is None and wild.any():
            inside = addr[~self._outside(addr, size, self._store_starts, self._store_ends)]
            if inside.size:
                hint = self._containing(int(inside[0]))
        self._record(kind, bad_addr, vals, grid, hint)
        if not wild.any():
            return None  # inside our own allocations: performed (guard / input checks see stores)
        keep = np.ones(p.shape, dtype=bool) if active is None else active.copy()
        lanes = np.flatnonzero(keep.ravel())[np.flatnonzero(bad)[wild]]
        keep.ravel()[lanes] = False
        return keep

    def _note_guard_stores(self, addr: np.ndarray, size: int) -> None:
        """Record the program of each store lane into an output table's guard (``guard_stores``)."""
        if not self._watched_starts.size or len(self.guard_stores) >= MAX_LANES:
            return
        if self._row_starts.size:  # rows first: nearly every store lands in a row, and then one search decides
            addr = addr[self._outside(addr, size, self._row_starts, self._row_ends)]
            if not addr.size:
                return
        lanes = addr[~self._outside(addr, size, self._watched_starts, self._watched_ends)]
        if not lanes.size:
            return
        program = self._grid()
        dims = self._grid_dims()
        for a in lanes[:MAX_LANES].tolist():
            alloc = self._containing(a)
            assert alloc is not None  # a lane inside a watched allocation's range is inside that allocation
            region, offset = alloc.region((a - alloc.base) // alloc.elsize)
            self.guard_stores.setdefault((alloc.name, region, offset), (program, dims))

    def _derive(self, name: str, orig: Callable[..., Any], *args: Any) -> Any:
        """A pointer-deriving op: its result carries the allocation its pointer operand came from, so a
        wild access is named after the pointer it went through, wherever it lands."""
        out = orig(*args)
        origin = next((a._kvfence_origin for a in args if hasattr(a, "_kvfence_origin")), None)
        if origin is None and name == "create_addptr" and getattr(args[0], "data", None) is not None \
                and args[0].data.size:
            base = int(args[0].data.flat[0])  # a kernel argument's base pointer
            origin = self._containing(base) or self._null_view(base)
        if origin is not None and hasattr(out, "data"):
            out._kvfence_origin = origin
        return out

    def _load(self, orig: Callable[..., Any], ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        keep = self._check(Kind.OOB_READ, ptrs, mask.data, None)
        if keep is not None:
            mask = type(mask)(np.ascontiguousarray(keep), mask.dtype)
        return orig(ptrs, mask, other, *rest)

    def _store(self, orig: Callable[..., Any], ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        keep = self._check(Kind.OOB_WRITE, ptrs, mask.data, value.data)
        if keep is not None:
            mask = type(mask)(np.ascontiguousarray(keep), mask.dtype)
        return orig(ptrs, value, mask, *rest)

    def _rmw(self, orig: Callable[..., Any], op: Any, ptr: Any, val: Any, mask: Any, *rest: Any) -> Any:
        keep = self._check(Kind.OOB_WRITE, ptr, mask.data, val.data)
        if keep is not None:
            mask = type(mask)(np.ascontiguousarray(keep), mask.dtype)
        return orig(op, ptr, val, mask, *rest)

    def _cas(self, orig: Callable[..., Any], ptr: Any, cmp: Any, val: Any, *rest: Any) -> Any:
        keep = self._check(Kind.OOB_WRITE, ptr, None, val.data)
        if keep is not None:  # no mask operand: point the dropped lanes at a scratch word instead
            data = np.array(np.broadcast_to(ptr.data, keep.shape), dtype=np.uint64)
            data[~keep] = np.uint64(self._scratch.ctypes.data)
            ptr = type(ptr)(data, ptr.dtype)
        return orig(ptr, cmp, val, *rest)

    # -- activation --------------------------------------------------------------------------------
    def __enter__(self) -> "Audit":
        from triton.runtime import interpreter

        if self._saved is not None:
            raise RuntimeError("this Audit is already active")
        builder = interpreter.interpreter_builder
        self._builder = builder
        saved = {}
        for name, wrapper in (("create_masked_load", self._load), ("create_masked_store", self._store),
                              ("create_atomic_rmw", self._rmw), ("create_atomic_cas", self._cas)):
            saved[name] = builder.__dict__.get(name)
            setattr(builder, name, functools.partial(wrapper, getattr(builder, name)))
        for name in _DERIVING:
            if hasattr(builder, name):
                saved[name] = builder.__dict__.get(name)
                setattr(builder, name, functools.partial(self._derive, name, getattr(builder, name)))
        executor = interpreter.GridExecutor
        original_init = executor.__dict__["_init_args_hst"]
        audit = self

        def init_args_hst(self_: Any, args_dev: Any, kwargs: Any) -> Tuple[Any, Any]:
            args_hst, kwargs_hst = original_init(self_, args_dev, kwargs)
            audit._register_launch_args(self_.arg_names, args_hst, kwargs_hst)
            return args_hst, kwargs_hst

        executor._init_args_hst = init_args_hst
        self._saved = (saved, executor, original_init)
        return self

    def wrap(self, launch: Callable[[], None]) -> Callable[[], None]:
        """``launch`` run with this audit active."""

        def audited() -> None:
            with self:
                launch()

        return audited

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None  # set by __enter__
        saved, executor, original_init = self._saved
        for name, previous in saved.items():
            if previous is None:
                delattr(self._builder, name)
            else:
                setattr(self._builder, name, previous)
        executor._init_args_hst = original_init
        self._saved = None

    # -- recording and reporting -------------------------------------------------------------------
    def _containing(self, addr: int) -> Optional[Allocation]:
        return next((a for a in self.allocations if a.base <= addr < a.end), None)

    def _null_view(self, addr: int) -> Optional[Allocation]:
        """The zero-element table an address near 0 went through (the first, where several were null)."""
        return self.null_views[0] if self.null_views and 0 <= addr < NULL_SPAN else None

    def _attribute(self, addr: int, hint: Optional[Allocation]) -> Allocation:
        """The allocation an address belongs to or, outside all, the one the kernel most likely overran.

        Inside one: that one. Else ``hint`` (the allocation the pointer was derived from, or that an
        in-bounds lane of the same access is in); else the allocation it
        is past the end of by at most that allocation's size (overflows run forward); else one it is
        before by at most its size; else the nearest.
        """
        inside = self._containing(addr)
        if inside is not None:
            return inside
        if hint is not None:
            return hint
        null = self._null_view(addr)
        if null is not None:
            return null
        before = [a for a in self.allocations if a.end <= addr and addr - a.end < a.nbytes]
        if before:
            return max(before, key=lambda a: a.end)
        after = [a for a in self.allocations if addr < a.base and a.base - addr <= a.nbytes]
        if after:
            return min(after, key=lambda a: a.base)
        return min(self.allocations, key=lambda a: a.base - addr if addr < a.base else addr - a.end + 1)

    def _locate(self, addr: int, grid: Tuple[int, int, int],
                hint: Optional[Allocation] = None) -> Tuple[Allocation, str, int]:
        """The allocation an address is attributed to, and its region and element offset there."""
        alloc = self._attribute(addr, hint)
        flat = (addr - alloc.base) // alloc.elsize
        if alloc.row_of_program is not None and alloc.base <= addr < alloc.end and alloc.row_containing(addr):
            row = alloc.row_of_program(grid)
            span = alloc.row_span(row)
            col = (addr - span[0]) // alloc.elsize if span is not None else flat
            return alloc, f"outside own row {row}", col
        name, offset = alloc.region(flat)
        return alloc, name, offset

    def _record(self, kind: Kind, addrs: np.ndarray, values: Optional[np.ndarray], grid: Tuple[int, int, int],
                hint: Optional[Allocation] = None) -> None:
        for i, a in enumerate(addrs.tolist()):
            alloc, region, offset = self._locate(a, grid, hint)
            ev = self._events.setdefault((kind, alloc.name, region), {"lanes": [], "dropped": 0, "alloc": alloc})
            if len(ev["lanes"]) >= MAX_LANES:
                ev["dropped"] += 1
                continue
            ev["lanes"].append((offset, grid, None if values is None else int(values[i]), a))

    def findings(self) -> List[Finding]:
        """Bad lanes grouped into contiguous runs per (kind, argument, region)."""
        out: List[Finding] = []
        for (kind, _name, region), ev in self._events.items():
            lanes = sorted(ev["lanes"], key=lambda x: x[0])
            offsets = [x[0] for x in lanes]
            runs, start = [], 0
            for i in range(1, len(offsets) + 1):
                if i == len(offsets) or offsets[i] > offsets[i - 1] + 1:
                    runs.append((start, i))
                    start = i
            alloc = ev["alloc"]
            what = "store dropped" if kind is Kind.OOB_WRITE else "read"
            for n, (i0, i1) in enumerate(runs):
                chunk = lanes[i0:i1]
                programs = sorted({lane[1] for lane in chunk})
                samples: List[Tuple[int, Optional[int], Optional[int]]] = []
                seen = set()
                for off, _, v, _ in chunk:
                    # Reads have no value to show; stores show what the kernel tried to write.
                    if v is not None and off not in seen and len(samples) < MAX_SAMPLES:
                        seen.add(off)
                        samples.append((off, None, v))
                where = alloc.coords((chunk[0][3] - alloc.base) // alloc.elsize)
                detail = f"{what} outside the registered extent of {alloc.name}"
                if where:
                    detail += f"; first lane {where}"
                if len(programs) > MAX_PROGRAMS:
                    detail += f"; {len(programs)} programs"
                out.append(Finding(kind, alloc.name, region, chunk[0][0], chunk[-1][0] + 1, samples,
                                   programs[:MAX_PROGRAMS], detail))
                if n + 1 == MAX_RUNS and n + 1 < len(runs):
                    out[-1].detail += f"; {len(runs) - MAX_RUNS} more runs not listed"
                    break
            if ev["dropped"]:
                out[-1].detail += f"; {ev['dropped']} more bad lanes not recorded"
        return out


def for_launch(kernel_kwargs: Dict[str, Any], guarded: Sequence[Guarded], *,
               row_owners: Optional[Mapping[str, Tuple[int, Tuple[int, ...]]]] = None) -> Audit:
    """The audit of one harness launch: guarded outputs by region, tensor inputs by the views passed.

    ``row_owners``: per tensor input's name, who may read which of its rows (``kvfence.contract.Table``'s
    ``row_owners``: ``(grid axis, rows)``), the caller's contract's declaration; reads of another row are
    ``OOB_READ``.
    """
    audit = Audit()
    for buf in guarded:
        audit.register_table(buf)
    views = [buf.view for buf in guarded]  # by identity: the window rail's buffers have their own names
    owners = row_owners or {}
    for name, value in kernel_kwargs.items():
        if not isinstance(value, torch.Tensor) or any(value is v for v in views):
            continue
        audit.register_tensor(name, value, owner_of_rows(owners.get(name)))
    return audit


def resolve_audit(audit: Optional[bool], device_type: str) -> bool:
    """``None`` means on for the CPU interpreter, off on CUDA; asking for it on CUDA is ``BadInput``."""
    if audit is None:
        return device_type == "cpu"
    if audit and device_type != "cpu":
        raise BadInput("the address audit needs the Triton interpreter (device cpu); compiled CUDA kernels "
                       "are checked by the guards (and compute-sanitizer)")
    return bool(audit)
