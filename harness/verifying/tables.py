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
"""

from __future__ import annotations

from typing import Dict, List

from kvfence.cases.findings import Finding, Kind
from kvfence.running.tables import POISON, Guarded

SAMPLES = 3


def _region_name(region: str, row) -> str:
    return region if row is None else f"{region} {row}"


def verdict(contract, case, width: int, buffers: Dict[str, Guarded], before: Dict[str, object],
            after: Dict[str, object], every_element: bool = False) -> List[Finding]:
    """The findings of one launch; ``before``/``after`` are each table's flat host tensor (``snapshot``)."""
    expected = contract.expected(case, width)
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
