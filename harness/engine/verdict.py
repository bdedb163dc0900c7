"""The verdict for any contract's launch: every element of every guarded table compared with the oracle.

``verdict(contract, case, width, buffers, after)`` walks each table's flat tensor once (plain Python, the
specification; docs/contract.md §9, "Verdict"):

* an element of a row that the oracle defines: equal (clean), still ``POISON`` (``MISSING_WRITE``) or another
  value (``VALUE_MISMATCH``);
* an element of a row the oracle does not define that changed: ``STRAY_WRITE``;
* a guard or tail element that changed: ``GUARD_OVERWRITE`` (a write past a row; the sample's expected value is
  the canary, and when the oracle asks for an entry the row cannot hold there, its program is named);
* any change to an input table: ``STRAY_WRITE`` on that input.

Consecutive bad elements of one kind and region make one ``Finding``; its ``programs`` are the programs the
contract says own those elements (``Contract.owner``: the expected owners, not observed writers).

``clean(...)`` is the fast path the engine runs first: the same rules as whole-tensor comparisons (every table
what it held, with each defined row element the oracle's value), true exactly when the walk finds nothing, so
the walk runs only on a launch that has findings (a production-sized clean table is one comparison, not a
Python loop over a million elements). ``tests/test_contracts.py`` checks the two agree on damaged launches.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from kvfence.engine.findings import Finding, Kind
from kvfence.engine.tables import POISON, Guarded

SAMPLES = 3


def _region_name(region: str, row) -> str:
    return region if row is None else f"{region} {row}"


def expected_flat(g: Guarded, before, wanted: Dict[Tuple[int, int], int]):
    """The flat tensor a clean launch leaves in output table ``g``: what it held (poisoned rows, canaries),
    with every element the oracle defines inside a row set to its value (one past the row stays the canary:
    the walk calls a change there a guard overwrite whatever the oracle asks)."""
    import numpy as np
    import torch

    want = before.clone()
    if wanted:
        keys = np.fromiter((x for key in wanted for x in key), dtype=np.int64, count=2 * len(wanted)).reshape(-1, 2)
        values = np.fromiter(wanted.values(), dtype=np.int64, count=len(wanted))
        inside = keys[:, 1] < g.table.width
        positions = g.guard + keys[inside, 0] * g.stride + keys[inside, 1]
        want[torch.from_numpy(positions)] = torch.from_numpy(values[inside]).to(want.dtype)
    return want


def clean(buffers: Dict[str, Guarded], before: Dict[str, object], after: Dict[str, object], expected) -> bool:
    """Whether ``verdict`` would find nothing, by whole-tensor comparisons (see the module docstring)."""
    import torch

    for name, g in buffers.items():
        wanted = expected.get(name, {}) if g.table.role == "output" else {}
        if not torch.equal(after[name], expected_flat(g, before[name], wanted) if wanted else before[name]):
            return False
    return True


def verdict(contract, case, width: int, buffers: Dict[str, Guarded], before: Dict[str, object],
            after: Dict[str, object], every_element: bool = False) -> List[Finding]:
    """The findings of one launch; ``before``/``after`` are each table's flat host tensor (``snapshot``).
    ``every_element``: the plain walk over every element, without the ``clean`` fast path (what tests compare
    the engine's path with)."""
    expected = contract.expected(case, width)
    if not every_element and clean(buffers, before, after, expected):
        return []
    findings: List[Finding] = []
    for name, g in buffers.items():
        table = g.table
        wanted = expected.get(name, {}) if table.role == "output" else {}
        open_run = None  # [kind, region, row, start, stop, samples, programs]
        was_all, now_all = before[name], after[name]
        # Only elements that changed or that the oracle defines can be findings (an unchanged element the
        # oracle leaves alone is clean by the rules above), so the walk visits those, in order.
        if every_element:  # the plain walk, which tests compare the restricted one with
            visit = set(range(len(was_all)))
        else:
            visit = set((was_all != now_all).nonzero().flatten().tolist())
            visit.update(g.position(r, c) for (r, c) in wanted if c < width)
        for p in sorted(visit):
            was, now = int(was_all[p]), int(now_all[p])
            region, row, off = g.locate(p)
            kind = exp = owner = None
            if table.role == "input":
                if now != was:
                    kind, exp = Kind.STRAY_WRITE, was
            elif region == "row":
                if (row, off) in wanted:
                    exp = wanted[(row, off)]
                    if now != exp:
                        kind = Kind.MISSING_WRITE if now == POISON else Kind.VALUE_MISMATCH
                elif now != POISON:
                    kind, exp = Kind.STRAY_WRITE, POISON
                owner = contract.owner(case, name, row, off) if kind else None
            elif now != was:
                kind, exp = Kind.GUARD_OVERWRITE, was  # expected: the canary that was there
                if region == "guard after row" and (row, width + off) in wanted:
                    owner = contract.owner(case, name, row, width + off)  # the row's own entry past its width
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


def _finding(buffer: str, run) -> Finding:
    kind, region, row, start, stop, samples, programs, _ = run
    return Finding(kind, buffer, _region_name(region, row), start, stop, samples, programs)
