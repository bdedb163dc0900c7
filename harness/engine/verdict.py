"""The verdict for any contract's launch: every element of every guarded table compared with the oracle.

``verdict(record, launch, buffers, before, after)`` walks each table's flat tensor once (plain Python, the
specification; docs/contract.md §9, "Verdict"):

* an element of a row that the oracle defines: equal (clean), unchanged (``MISSING_WRITE``: still ``POISON`` in a
  fresh table, or what an earlier launch left in a table kept between launches) or another value
  (``VALUE_MISMATCH``);
* an element of a row the oracle does not define that changed: ``STRAY_WRITE``;
* a guard or tail element that changed: ``GUARD_OVERWRITE`` (a write past a row; the sample's expected value is
  the canary, and when the oracle asks for an entry the row cannot hold there, its program is named);
* any change to an input table: ``STRAY_WRITE`` on that input;
* an output element holding a value derived from an input's guard poison (``INPUT_POISON`` and below, also
  after a division by up to ``POISON_DERIVED``): ``POISON_READ``, the kernel read past an input's rows and
  stored what it read there (decoded: which input, which guard position, where an exact value says).

Consecutive bad elements of one kind and region make one ``Finding``; its ``programs`` are the programs the
contract says own those elements (``Contract.owner``: the expected owners, not observed writers), named in the
contract's own terms where its owner is a named tuple. ``name_guard_writers`` says who wrote into a guard: the
program the CPU address audit saw store there, or an inference from the oracle, said as one.

``clean(...)`` is the fast path the engine runs first: the same rules as whole-tensor comparisons (every table
what it held, with each defined row element the oracle's value), true exactly when the walk finds nothing, so
the walk runs only on a launch that has findings (a production-sized clean table is one comparison, not a
Python loop over a million elements). ``tests/test_contracts.py`` checks the two agree on damaged launches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, cast

from kvfence.contract import Contract, Launch
from kvfence.engine.findings import SEEN_BY_AUDIT, Finding, Kind, programs_text
from kvfence.engine.tables import INPUT_POISON, POISON, Guarded

if TYPE_CHECKING:  # torch is imported where a verdict is made, not at start-up
    import torch

#: ``Contract.expected``'s answer: ``{output table: {(row, column): value}}``.
Expected = Mapping[str, Mapping[Tuple[int, int], object]]
#: ``Audit.guard_stores``: ``(table, region, offset) -> (program, grid dimensions)``.
GuardStores = Mapping[Tuple[str, str, int], Tuple[Tuple[int, ...], Tuple[int, ...]]]

SAMPLES = 3
#: The largest divisor of a read value that still makes a stored value poison-derived (a page id is a slot
#: divided by the page size, up to 128; a block id by a block size): below ``INPUT_POISON // POISON_DERIVED``.
POISON_DERIVED = 4096


def poison_derived(value: int) -> bool:
    """Whether ``value`` can only come from an input's guard (no legitimate input value is that negative)."""
    return value <= INPUT_POISON // POISON_DERIVED


def decode_poison(value: int, buffers: Dict[str, Guarded]) -> str:
    """Where a poison-derived value came from, as far as its value says."""
    inputs = [g for g in buffers.values() if g.table.role == "input"]
    position = INPUT_POISON - value
    exact = [f"{g.table.name} {_region_name(*g.locate(position)[:2])} [{g.locate(position)[2]}] (flat position "
             f"{position})" for g in inputs if 0 <= position < len(g.flat) and g.locate(position)[0] != "row"]
    if exact:
        return f"{value} is the guard poison of {' or '.join(exact)}: a read past an input's rows"
    return f"{value} is derived from an input's guard poison: a read past an input's rows"


def _region_name(region: str, row: Optional[int]) -> str:
    return region if row is None else f"{region} {row}"


def matches(now: int, exp: object) -> bool:
    """An element holds what the oracle asks: its value, or one of the values of a set (two programs write it)."""
    return now in exp if isinstance(exp, frozenset) else now == exp


def sample_value(exp: object) -> int:
    """What a finding's sample records as expected: the value, or the least of a set of them."""
    return int(min(exp)) if isinstance(exp, frozenset) else cast(int, exp)


def expected_flat(g: Guarded, before: torch.Tensor, after: torch.Tensor,
                  wanted: Mapping[Tuple[int, int], object]) -> torch.Tensor:
    """The flat tensor a clean launch leaves in output table ``g``: what it held (poisoned rows, canaries),
    with every element the oracle defines inside a row set to its value (one past the row stays the canary:
    the walk calls a change there a guard overwrite whatever the oracle asks). An element of a set of values
    takes what ``after`` holds there when that is one of them, else the least of them."""
    import numpy as np
    import torch

    want = before.clone()
    if not wanted:
        return want
    keys = np.fromiter((x for key in wanted for x in key), dtype=np.int64, count=2 * len(wanted)).reshape(-1, 2)
    positions = g.front + keys[:, 0] * g.stride + keys[:, 1]
    inside = keys[:, 1] < g.table.width
    try:  # every value an int (the common case): one pass in numpy
        values = np.fromiter(wanted.values(), dtype=np.int64, count=len(wanted))
    except TypeError:  # a set of values: what the launch left there when it is one of them
        values = np.fromiter((v if not isinstance(v, frozenset) else
                              (int(after[int(pos)]) if ok and int(after[int(pos)]) in v else min(v))
                              for v, pos, ok in zip(wanted.values(), positions, inside)),
                             dtype=np.int64, count=len(wanted))
    want[torch.from_numpy(positions[inside])] = torch.from_numpy(values[inside]).to(want.dtype)
    return want


def with_spills(expected: Expected, buffers: Dict[str, Guarded]) -> Expected:
    """``expected`` with every row element of an output laid out without guards between its rows (the
    ``production`` layout) that a store past another row also lands on accepting either value: the two stores
    race, and which lands last is up to the device. A spill landing where the oracle defines nothing (a guard,
    the tail, an element no program owns) stays damage."""
    out = dict(expected)
    for name, cells in expected.items():
        g = buffers.get(name)
        width = g.table.width if g is not None else 0
        if g is None or g.guard or g.table.role != "output" or not width:
            continue
        merged: Dict[Tuple[int, int], object] = {}
        for (row, column), value in cells.items():
            if column < width:
                continue
            landed = (row + column // width, column % width)
            if landed in cells and landed[0] < g.rows:
                have = merged.get(landed, cells[landed])
                values = set(have) if isinstance(have, frozenset) else {have}
                values.update(value if isinstance(value, frozenset) else (value,))
                if len(values) > 1:
                    merged[landed] = frozenset(values)
        if merged:
            out[name] = {**cells, **merged}
    return out


def clean(buffers: Dict[str, Guarded], before: Dict[str, torch.Tensor], after: Dict[str, torch.Tensor],
          expected: Mapping[str, Mapping[Tuple[int, int], object]]) -> bool:
    """Whether ``verdict`` would find nothing, by whole-tensor comparisons (see the module docstring)."""
    import torch

    for name, g in buffers.items():
        wanted = expected.get(name, {}) if g.table.role == "output" else {}
        if not torch.equal(after[name], expected_flat(g, before[name], after[name], wanted) if wanted
                           else before[name]):
            return False
    return True


def verdict(record: Contract[Any], launch: Launch[Any], buffers: Dict[str, Guarded],
            before: Dict[str, torch.Tensor],
            after: Dict[str, torch.Tensor], every_element: bool = False,
            expected: Optional[Mapping[str, Mapping[Tuple[int, int], object]]] = None) -> List[Finding]:
    """The findings of one launch; ``before``/``after`` are each table's flat host tensor (``snapshot``).
    ``every_element``: the plain walk over every element, without the ``clean`` fast path (what tests compare
    the engine's path with)."""
    expected = record.expected(launch) if expected is None else expected
    if not every_element and clean(buffers, before, after, expected):
        return []
    findings: List[Finding] = []
    for name, g in buffers.items():
        wanted = expected.get(name, {}) if g.table.role == "output" else {}
        findings += _table_findings(record, launch, name, g, before[name], after[name], wanted, every_element)
    for f in findings:
        if f.kind is Kind.POISON_READ and f.samples and f.samples[0][2] is not None:
            f.detail = decode_poison(f.samples[0][2], buffers)
    attribute(record, launch, findings, expected, buffers)
    return findings


def _table_findings(record: Contract[Any], launch: Launch[Any], name: str, g: Guarded, was_all: torch.Tensor,
                    now_all: torch.Tensor, wanted: Mapping[Tuple[int, int], object],
                    every_element: bool) -> List[Finding]:
    """One table's findings: each element it visits classified (``_classify``), neighbouring elements of one
    kind, region and row merged into one finding."""
    findings: List[Finding] = []
    open_run: Optional[List[Any]] = None  # [kind, region, row, start, stop, samples, programs, last position]
    # Only elements that changed or that the oracle defines can be findings (an unchanged element the
    # oracle leaves alone is clean by the rules above), so the walk visits those, in order.
    if every_element:  # the plain walk, which tests compare the restricted one with
        visit = set(range(len(was_all)))
    else:
        width = g.table.width  # this table's own: a launch's tables need not share the row width its sizing gave
        visit = set((was_all != now_all).nonzero().flatten().tolist())
        visit.update(g.position(r, c) for (r, c) in wanted if c < width)
    for p in sorted(visit):
        was, now = int(was_all[p]), int(now_all[p])
        region, row, off = g.locate(p)
        kind, exp, owner = _classify(record, launch, name, g, wanted, region, row, off, was, now)
        if kind is not None and open_run and open_run[0] == kind and open_run[1] == region \
                and open_run[2] == row and open_run[4] == off and open_run[7] == p - 1:
            open_run[4], open_run[7] = off + 1, p
            if len(open_run[5]) < SAMPLES:
                open_run[5].append((off, exp, now))
            if owner is not None and owner not in open_run[6]:
                open_run[6].append(owner)
            continue
        if open_run:
            findings.append(_finding(name, open_run))
            open_run = None
        if kind is not None:
            open_run = [kind, region, row, off, off + 1, [(off, exp, now)], [owner] if owner is not None else [], p]
    if open_run:
        findings.append(_finding(name, open_run))
    return findings


def _classify(record: Contract[Any], launch: Launch[Any], name: str, g: Guarded,
              wanted: Mapping[Tuple[int, int], object], region: str, row: Optional[int], off: int, was: int,
              now: int) -> Tuple[Optional[Kind], Optional[int], Optional[Tuple[int, ...]]]:
    """One element of table ``name`` at ``(region, row, off)``, ``was`` before the launch and ``now`` after it:
    its finding kind (None: clean), the value expected there, and the program that owns it (the record's
    ``owner``), where known."""
    kind: Optional[Kind] = None
    exp: Optional[int] = None
    owner: Optional[Tuple[int, ...]] = None
    if g.table.role == "input":
        if now != was:
            kind, exp = Kind.STRAY_WRITE, was
    elif region == "row":
        assert row is not None  # Guarded.locate gives the row index in its "row" region
        if (row, off) in wanted:
            value = wanted[(row, off)]
            if not matches(now, value):
                exp = sample_value(value)
                kind = (Kind.MISSING_WRITE if now == was else Kind.POISON_READ if poison_derived(now)
                        else Kind.VALUE_MISMATCH)
        elif now != was:
            kind, exp = (Kind.POISON_READ if poison_derived(now) else Kind.STRAY_WRITE), was
        owner = record.owner(launch, name, row, off) if kind else None
    elif now != was:
        kind, exp = Kind.GUARD_OVERWRITE, was  # expected: the canary that was there
        width = g.table.width
        if region == "guard after row" and row is not None and (row, width + off) in wanted:
            owner = record.owner(launch, name, row, width + off)  # the row's own entry past its width
    return kind, exp, owner


def decode_canary(value: int, buffers: Dict[str, Guarded]) -> str:
    """Which output guard a value is the canary of (``CANARY_BASE - position``), or ''."""
    from kvfence.engine.tables import CANARY_BASE

    position = CANARY_BASE - value
    exact = []
    for g in buffers.values():  # a seeded canary (``Guarded.canary_seed``) says nothing of its position
        if g.table.role == "output" and g.canary_seed is None and 0 <= position < len(g.flat):
            region, row, off = g.locate(position)
            if region != "row":
                exact.append(f"{g.table.name} {_region_name(region, row)} [{off}]")
    return f"{value} is the canary of {' or '.join(exact)}: a read of an output's guard" if exact else ""


def _row_of(region: str) -> Optional[int]:
    last = region.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else None


def attribute(record: Contract[Any], launch: Launch[Any], findings: List[Finding],
              expected: Mapping[str, Mapping[Tuple[int, int], object]], buffers: Dict[str, Guarded]) -> None:
    """Each output finding's ``writers`` and decoded values, from its samples' found values: the programs the
    contract says store such a value (``Contract.owner`` of the elements the oracle gives that value, those of the
    finding's own row first, then of the row before it: a spill, then any), and what a guard poison or canary
    found there says (docs/contract.md §9, "Verdict")."""
    index: Dict[str, Dict[int, List[Tuple[int, int]]]] = {}
    for f in findings:
        g = buffers.get(f.buffer)
        if g is None or g.table.role != "output" or not f.samples:
            continue
        notes = []
        for _, _, found in f.samples:
            if found is None or found == POISON:
                continue
            said = decode_poison(found, buffers) if poison_derived(found) else decode_canary(found, buffers)
            if said and said not in notes and said not in f.detail:
                notes.append(said)
        if notes:
            f.detail = "; ".join([f.detail] * bool(f.detail) + notes)
        if f.buffer not in index:
            where: Dict[Any, List[Tuple[int, int]]] = {}

            for key, value in expected.get(f.buffer, {}).items():
                for v in (value if isinstance(value, frozenset) else (value,)):
                    where.setdefault(v, []).append(key)
            index[f.buffer] = where
        row = _row_of(f.region)
        writers = []
        for _, _, found in f.samples:
            places = index[f.buffer].get(found, []) if found is not None else []
            for place in sorted(places, key=lambda rc: (rc[0] != row, rc[0] != (row or 0) - 1, rc)):
                who = record.owner(launch, f.buffer, place[0], place[1])
                if who is not None and tuple(who) not in writers:
                    writers.append(tuple(who))
                    f.owner_names = f.owner_names or tuple(getattr(who, "_fields", ()))
                break  # the likeliest place only: a value the oracle gives several elements names one writer
        f.writers = writers[:8]


def grid_shape(record: Contract[Any], launch: Launch[Any], expected: Expected) -> Tuple[Tuple[str, ...], int]:
    """The names the contract gives its programs' coordinates (``Contract.owner`` returning a ``NamedTuple``; ()
    when it names none) and how many coordinates a program has (the owner's length), read off the owner of an
    element the oracle defines (a few per table at most); ``((), 0)`` when no element has an owner."""
    for table, cells in expected.items():
        for row, column in list(cells)[:8]:
            who = record.owner(launch, table, row, column)
            if who is not None:
                return tuple(getattr(who, "_fields", ())), len(tuple(who))
    return (), 0


def as_program(grid: Iterable[int], axes: int, dims: Tuple[int, ...] = ()) -> Tuple[int, ...]:
    """An interpreter program id ``(x, y, z)`` in its contract's shape: the ``axes`` coordinates its owner has
    when the others are 0; else without the trailing axes the launch's grid does not have (``dims``: extent 1
    there)."""
    program = tuple(int(x) for x in grid)
    if axes and axes <= len(program) and not any(program[axes:]):
        return program[:axes]
    keep = len(program) if len(dims) == len(program) else 0
    while keep > 1 and dims[keep - 1] == 1 and program[keep - 1] == 0:
        keep -= 1
    return program[:keep] if keep else program


def name_guard_writers(record: Contract[Any], launch: Launch[Any], findings: List[Finding], expected: Expected,
                       buffers: Dict[str, Guarded], stores: Optional[GuardStores] = None,
                       names: Tuple[str, ...] = (), axes: int = 0) -> None:
    """Who wrote into an output's guard, on each ``GUARD_OVERWRITE``, said as known or as inferred: the programs
    the CPU address audit saw store there (``stores``: ``Audit.guard_stores``; seen, so they are its ``writers``),
    else the program the oracle gives the row's own entry past its width or, failing that, the owner of the last
    element of the row the oracle defines (inferred: a write running past its segment; never stated as seen)."""
    for f in findings:
        g = buffers.get(f.buffer)
        if f.kind is not Kind.GUARD_OVERWRITE or g is None or g.table.role != "output":
            continue
        f.owner_names = f.owner_names or names
        seen: List[Tuple[int, ...]] = []
        for off in range(f.start, f.stop):
            hit = (stores or {}).get((f.buffer, f.region, off))
            if hit is not None and as_program(hit[0], axes, hit[1]) not in seen:
                seen.append(as_program(hit[0], axes, hit[1]))
        if seen:
            f.writers, f.extra["writers"] = seen[:8], SEEN_BY_AUDIT
            more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
            said = (f"written by {programs_text(seen[:4], f.owner_names)}{more}: seen (the CPU address audit "
                    "recorded the store)")
        else:
            why = "no address audit on this device" if stores is None else "the address audit saw no store there"
            said = f"who wrote it was not observed ({why}); " + _inferred_writer(record, launch, f, expected, g)
        f.detail = "; ".join([f.detail] * bool(f.detail) + [said])


def _inferred_writer(record: Contract[Any], launch: Launch[Any], f: Finding, expected: Expected, g: Guarded) -> str:
    if f.programs:
        return (f"inferred: the oracle puts {programs_text(f.programs[:4], f.owner_names)}'s entry there, past the "
                "row's width")
    row = _row_of(f.region)
    if f.region == "tail":
        row = g.rows - 1
    if row is None:
        return "it lies before the first row, which no write running past a segment reaches"
    cells = [c for (r, c) in expected.get(f.buffer, {}) if r == row and c < g.table.width]
    who = record.owner(launch, f.buffer, row, max(cells)) if cells else None
    if who is None:
        return "the contract names no owner of the elements before it (Contract.owner)"
    shown = programs_text([tuple(who)], f.owner_names or tuple(getattr(who, "_fields", ())))
    return (f"inferred, not seen: {shown} owns [{row}, {max(cells)}], the last element of the row the oracle defines, "
            f"so a write running past its segment most likely came from {shown}")


def _finding(buffer: str, run: List[Any]) -> Finding:
    kind, region, row, start, stop, samples, programs, _ = run
    return Finding(kind, buffer, _region_name(region, row), start, stop, samples, programs)
