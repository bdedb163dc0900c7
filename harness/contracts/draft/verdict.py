"""The verdict: compare what a launch left in its buffers with what the oracle says, as ``Finding``s.

Every element of every guarded buffer is checked. An element in the expected write set must hold its
expected value; every other element must hold exactly what it held before the launch (canaries in
guards, poison or stale data in rows). Differences are classified, grouped into contiguous runs and
attributed to the programs ``(s, b, k)`` whose predicted segments cover them.

The expected write set comes as flat index/value tensors (``ExpectedWrites``), built either from the
plain-Python oracle (``expected_from_oracle``) or by a faster builder that is tested equal to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kvfence.contracts.draft import shipped_sizing
from kvfence.contracts.draft.guarded import GuardedBuffer
from kvfence.engine.findings import Finding, Kind

#: Findings kept per buffer; the last one says how many runs were left out.
MAX_RUNS = 32
#: Expected-vs-found samples kept per finding.
MAX_SAMPLES = 3


@dataclass
class ExpectedWrites:
    """A launch's write set inside the buffers, as flat storage positions and values.

    ``indices_*`` cover only elements inside their row (``e < width``); elements the contract defines
    past the row width are the sizing bug and show up as guard or stray damage instead.
    ``segments`` are the program segments ``(s, b, k, start, stop)`` in row coordinates.
    """

    indices_pos: torch.Tensor
    indices_val: torch.Tensor
    indptr_pos: torch.Tensor
    indptr_val: torch.Tensor
    segments: List[Tuple[int, int, int, int, int]]
    used: List[int]  # U(s), written length of each step row
    need: int
    bs: int
    #: Flat kv_indices positions in ``indices_pos`` that several programs store different values to, with
    #: every such value: two programs of one row (``oracle.WriteSet.either``), or a row overflow whose spill
    #: lands on another row's write set (production layout). Which store lands last is up to the device,
    #: so any of the values is accepted (``contended``).
    either: Optional[Dict[int, Tuple[int, ...]]] = None


def contended(in_row: Dict[int, int], stores) -> Dict[int, Tuple[int, ...]]:
    """The ``ExpectedWrites.either`` of a write set: positions of ``in_row`` (flat position -> the value the
    contract puts there) that some of ``stores`` (more ``(flat position, value)`` pairs the launch makes:
    other programs' writes to the element, a spill from another row) hit with another value, each
    with every value stored there. A spill landing outside ``in_row`` (slack, a guard) has one writer and
    stays damage (``STRAY_WRITE`` / ``GUARD_OVERWRITE``)."""
    values: Dict[int, set] = {}
    for flat, v in stores:
        if flat in in_row and v != in_row[flat]:
            values.setdefault(flat, {in_row[flat]}).add(v)
    return {flat: tuple(sorted(vs)) for flat, vs in values.items()}


def expected_from_oracle(obs, ws=None) -> ExpectedWrites:
    """Build ``ExpectedWrites`` from the plain oracle (``Case.expected``, or its write set ``ws`` when the
    caller has it already): the reference path."""
    ws = obs.case.expected() if ws is None else ws
    kvi, kvp = obs.kv_indices, obs.kv_indptr
    pos, val, spills = [], [], []
    for (s, e), v in ws.kv_indices.items():
        if e < kvi.width:
            pos.append(kvi.flat_index(s, e))
            val.append(v)
        else:  # past the row: where the store lands in storage (the next row, in the production layout)
            spills.append((kvi.flat_index(s, e), v))
    shared = [(kvi.flat_index(s, e), v) for (s, e), vs in ws.either.items() for v in vs]
    either = contended(dict(zip(pos, val)), spills + shared) if spills or shared else {}
    ppos = [kvp.flat_index(s, z) for (s, z) in ws.kv_indptr]
    pval = list(ws.kv_indptr.values())
    lb = obs.launch
    device = kvi.storage.device
    used = obs.case.used()  # §2's U(s), or §6's under a window or for the rail
    return ExpectedWrites(
        torch.tensor(pos, dtype=torch.int64, device=device), torch.tensor(val, dtype=torch.int32, device=device),
        torch.tensor(ppos, dtype=torch.int64, device=device), torch.tensor(pval, dtype=torch.int32, device=device),
        [(g.s, g.b, g.k, g.start, g.stop) for g in ws.segments],
        used,
        used[-1],
        lb.num_seqs * obs.case.config.topk,
        either or None,
    )


def _programs_for_indices(buf: GuardedBuffer, segments, lo: int, hi: int) -> List[Tuple[int, int, int]]:
    """Programs whose segment, placed at its physical position, intersects flat ``[lo, hi)``."""
    out = []
    for s, b, k, start, stop in segments:
        a, z = buf.flat_index(s, start), buf.flat_index(s, stop)
        if a < hi and lo < z:
            out.append((s, b, k))
    return out


def _programs_for_indptr(buf: GuardedBuffer, topk: int, bs: int, lo: int, hi: int) -> List[Tuple[int, int, int]]:
    out = []
    for flat in range(lo, hi):
        region = buf.region_of(flat)
        if region.row is None or region.is_guard:
            continue
        z = region.offset
        if z == bs:
            out.append((region.row, 0, 0))
        elif 1 <= z < bs:
            out.append((region.row, z // topk, z % topk))
    return out


#: Distinct found values of one run looked up for their writers (a run of more shows the first ones').
MAX_WRITER_VALUES = 256


def _writers_for_indices(buf: GuardedBuffer, write_set, after: torch.Tensor):
    """``writers(lo, hi)``: the programs the oracle expects to store the values found in flat ``[lo, hi)``
    (a token value names the request and position it was copied from): of those, the ones whose segment
    (placed physically, a spill included) covers the run, else those of its row, else of the row before
    it (a spill), else all. The index is built on the first call, from the plain oracle (a dirty case only)."""
    index: Dict[int, List[Tuple[int, int, int, int, int]]] = {}

    def build():
        ws = write_set()
        for g in ws.segments:
            a, z = buf.flat_index(g.s, g.start), buf.flat_index(g.s, g.stop)
            for e in range(g.start, g.stop):
                v = ws.kv_indices.get((g.s, e))
                if v is not None:
                    index.setdefault(v, []).append((g.s, g.b, g.k, a, z))
        index.setdefault(None, [])  # built, even for an empty write set

    def writers(lo: int, hi: int) -> List[Tuple[int, int, int]]:
        if not index:
            build()
        found = set(after[lo:hi].unique()[:MAX_WRITER_VALUES].tolist())
        candidates = {c for v in found for c in index.get(v, ())}
        row = buf.region_of(lo).row  # a guard after row S counts as row S (its spill); None in front or tail
        for keep in (lambda c: c[3] < hi and lo < c[4], lambda c: c[0] == row, lambda c: c[0] == row - 1
                     if row is not None else False, lambda c: True):
            chosen = sorted({c[:3] for c in candidates if keep(c)})
            if chosen:
                return chosen
        return []

    return writers


def classify(buf: GuardedBuffer, before: torch.Tensor, after: torch.Tensor, pos: torch.Tensor, val: torch.Tensor,
             *, used: Optional[Sequence[int]], in_set_kind: Optional[Kind], attribute, writers=None,
             either: Optional[Dict[int, Tuple[int, ...]]] = None) -> List[Finding]:
    """Findings for one buffer: every element whose value after the launch is not the expected one
    (``either``: positions where any of several values is right). ``writers(lo, hi)``, when given, names
    who wrote a run's found values (not for a missing write: nothing was written there)."""
    expected = before.clone()
    expected[pos] = val
    if either:
        # Any of the stored values is right (the device's last writer); padded with repeats to one width.
        flats = torch.tensor(list(either), dtype=torch.int64, device=before.device)
        most = max(map(len, either.values()))
        allowed = torch.tensor([list(v) + [v[0]] * (most - len(v)) for v in either.values()], dtype=after.dtype,
                               device=before.device)
        landed = flats[(after[flats].unsqueeze(1) == allowed).any(1)]
        expected[landed] = after[landed]
    in_set = torch.zeros_like(before, dtype=torch.bool)
    in_set[pos] = True
    bad = torch.nonzero(after != expected).flatten()
    if bad.numel() == 0:
        return []
    # Kind per bad element, vectorised: guard -> GUARD_OVERWRITE; in set -> MISSING/VALUE (or indptr);
    # otherwise a stray write inside the rows.
    flat_bad = bad
    live = buf.is_live(flat_bad)
    member = in_set[flat_bad]
    unchanged = after[flat_bad] == before[flat_bad]
    code = torch.full_like(flat_bad, 0)  # 0 guard, 1 stray, 2 missing, 3 value
    code[live & ~member] = 1
    code[live & member & unchanged] = 2
    code[live & member & ~unchanged] = 3
    # Row index of each element (guards in front/tail get -1/-2) so runs never span regions.
    rel = flat_bad - buf.front
    row = torch.div(rel, buf.stride, rounding_mode="floor")
    row = torch.where(rel < 0, torch.full_like(row, -1), row)
    row = torch.where(row >= buf.rows, torch.full_like(row, -2), row)
    breaks = torch.ones_like(flat_bad, dtype=torch.bool)
    if flat_bad.numel() > 1:
        breaks[1:] = (flat_bad[1:] != flat_bad[:-1] + 1) | (code[1:] != code[:-1]) | (row[1:] != row[:-1])
    starts = torch.nonzero(breaks).flatten().tolist()
    ends = starts[1:] + [flat_bad.numel()]
    flat_list = flat_bad.tolist()
    codes = code.tolist()
    kinds = {0: Kind.GUARD_OVERWRITE, 1: Kind.STRAY_WRITE, 2: in_set_kind or Kind.MISSING_WRITE,
             3: in_set_kind or Kind.VALUE_MISMATCH}
    findings: List[Finding] = []
    for i0, i1 in zip(starts, ends):
        lo, hi = flat_list[i0], flat_list[i1 - 1] + 1
        first = buf.region_of(lo, used)
        # Slack and live part of a row are one run for the kernel but two regions for the reader.
        last = buf.region_of(hi - 1, used)
        region = first.name if first.name == last.name else f"{first.name} .. {last.name}"
        sample_idx = flat_list[i0: min(i1, i0 + MAX_SAMPLES)]
        samples: List[Tuple[int, Optional[int], Optional[int]]] = [
            (buf.region_of(f, used).offset, int(expected[f]), int(after[f])) for f in sample_idx]
        findings.append(Finding(kinds[codes[i0]], buf.name, region, first.offset, first.offset + (hi - lo),
                                samples, attribute(lo, hi),
                                writers=writers(lo, hi) if writers is not None and codes[i0] != 2 else []))
        if len(findings) == MAX_RUNS and i1 < len(flat_list):
            findings[-1].detail = f"{len(starts) - MAX_RUNS} more runs not listed"
            break
    return findings


def check(obs, expected: Optional[ExpectedWrites] = None) -> List[Finding]:
    """All findings of one ``Observation``; ``expected`` defaults to the plain oracle's write set."""
    findings: List[Finding] = []
    config = obs.case.config
    oracle_ws = obs.case.expected() if expected is None else None
    if expected is None:  # the oracle's write set, computed once: the expected writes, and a dirty case's writers
        expected = expected_from_oracle(obs, oracle_ws)

    def write_set():
        return oracle_ws if oracle_ws is not None else obs.case.expected()

    width = obs.kv_indices.width
    host = shipped_sizing.check_verdict(config.sizing, config.topk, config.num_steps, obs.launch.num_seqs,
                                 sum(obs.launch.seq_lens), width, expected.need)
    if host is not None:
        findings.append(Finding(Kind(host[0]), obs.kv_indices.name, "host check", detail=host[1]))
        if host[0] != Kind.HOST_CHECK_ADMITS_OVERFLOW.value:
            return findings  # the check fires: production stops before the launch, so nothing is written
    if expected.need > width:
        over: List[Tuple[int, ...]] = [(s, b, k) for s, b, k, _, stop in expected.segments if stop > width]
        family = "".join(f", {k}={v}" for k, v in config.family_dict().items())
        findings.append(Finding(
            Kind.SIZING_VIOLATION, obs.kv_indices.name, f"row {config.num_steps - 1}", width, expected.need, [], over,
            f"need {expected.need} > width {width} (topk={config.topk}, num_seqs={obs.launch.num_seqs}, "
            f"sum(L)={sum(obs.launch.seq_lens)}, num_steps={config.num_steps}, sizing={config.sizing}{family})"))
    # The interpreter address audit's OOB_READ / OOB_WRITE (empty when it did not run).
    findings += obs.audit_findings
    if obs.error is not None:
        findings.append(Finding(Kind.LAUNCH_ERROR, "kernel", "launch", detail=obs.error))
        return findings
    kvi, kvp = obs.kv_indices, obs.kv_indptr
    used = [min(u, width) for u in expected.used]
    findings += classify(kvi, obs.before["kv_indices"], obs.after["kv_indices"], expected.indices_pos,
                         expected.indices_val, used=used, in_set_kind=None,
                         attribute=lambda lo, hi: _programs_for_indices(kvi, expected.segments, lo, hi),
                         writers=_writers_for_indices(kvi, write_set, obs.after["kv_indices"]),
                         either=expected.either)
    findings += classify(kvp, obs.before["kv_indptr"], obs.after["kv_indptr"], expected.indptr_pos,
                         expected.indptr_val, used=[expected.bs + 1] * kvp.rows, in_set_kind=Kind.INDPTR_MISMATCH,
                         attribute=lambda lo, hi: _programs_for_indptr(kvp, config.topk, expected.bs, lo, hi))
    for name in obs.changed_inputs:
        findings.append(Finding(Kind.STRAY_WRITE, name, "input",
                                detail=f"input {name} changed; the kernel must only read it"))
    return findings
