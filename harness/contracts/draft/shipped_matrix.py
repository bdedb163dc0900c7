"""``python -m kvfence upstream matrix --shipped``: is a release affected, as shipped, per backend and mode?

One row per release, one cell per backend x mode (``graph``, ``eager``), each under the release's own
shipped sizing (``--sizing sglang==VERSION:BACKEND``, kvfence.contracts.draft.shipped_wheel) and its own kernel.
A cell is:

* ``silent overflow``: a launch the runner can make needs more than the row width and no host check stops
  it; the minimal such case (smallest topk, then requests, then length) is run through the kernel, which
  must be seen writing past its row (``OVERFLOW_DAMAGE``; else the cell is ``error``), and its case file
  written (``repro`` replays it alone). ``at the context limit`` when it needs requests within
  ``num_steps`` of ``ctx``, ``at ordinary lengths`` otherwise.
* ``host check fires``: every overflowing launch of the domain is rejected by the release's host check
  (a loud failure, ``HOST_CHECK_FIRED``); the minimal one is run and written as well.
* ``clean``: no launch of the domain overflows.
* ``topk > 1 refused``, ``unreadable`` (the expression and file:line), ``no buffer`` (the backend does not
  launch the kernel in this mode), ``not launched at replay`` (graph mode: the backend's replay path
  reaches no launch, only its capture does, on the capture batch), ``not cached``.

The domain is every batch of ``raw_bs <= max_bs`` requests with lengths ``1 <= L <= ctx`` and
``topk <= max_topk``, graph-padded as the runner pads (docs/contract.md §4), searched by total length
(``search``). The search is kvfence's own arithmetic (``Config.row_width``, ``launch_need``); the kernel runs
for the witness.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from kvfence.contracts.draft import release_kernels, shipped_sizing, shipped_wheel
from kvfence.contracts.draft.case import Batch, Case, Config, launch_batch, launch_need
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, BadInput
from kvfence.release import upstream

SILENT = "silent overflow"
FIRES = "host check fires"
CHECK_WRONG = "host check rejects a fitting case"
CLEAN = "clean"
REFUSED = "topk > 1 refused"
UNREADABLE = "unreadable"
NO_BUFFER = "no buffer"
NOT_REPLAYED = "not launched at replay"
NOT_CACHED = "not cached"
ERROR = "error"
#: Cell statuses and what each means (the report's legend).
STATUSES = {
    SILENT: "a launch overflows its row and nothing stops it (minimal case shown, case file written)",
    FIRES: "every overflowing launch is rejected by the release's host check (a loud assertion)",
    CHECK_WRONG: "the host check rejects a launch that fits (its formula is too strict)",
    CLEAN: "no launch of the domain overflows",
    REFUSED: "the backend's constructor raises for topk > 1, and topk = 1 never overflows",
    UNREADABLE: "the width's expression is outside what the restricted evaluator reads (shown with file:line)",
    NO_BUFFER: "the backend does not allocate the kernel's buffer in this mode (it delegates the launch)",
    NOT_REPLAYED: "graph mode: the backend launches the kernel while capturing only, so no real batch reaches it",
    NOT_CACHED: "the release is not in the cache (fetch it where PyPI is reachable)",
    ERROR: "the witness did not reproduce as the arithmetic predicts, or the release could not be read",
}
MODES = shipped_wheel.MODES
FORMAT = 1
#: What a ``silent overflow`` cell's witness must show the kernel did: a canary past its row or buffer
#: changed, an element outside the write set changed (the next row), a store outside every allocation
#: (the interpreter's audit), or a dead launch.
OVERFLOW_DAMAGE = {"GUARD_OVERWRITE", "STRAY_WRITE", "OOB_WRITE", "CRASH"}


@dataclass
class WitnessSpace:
    """The launches a release's witness search covers (not a run's domain, ``kvfence.contract.Domain``): uniform
    batches up to ``max_bs`` requests, ``topk <= max_topk``, lengths up to ``ctx`` (``ordinary_only``: up to ``ctx -
    num_steps``, for a deployment whose requests stay that far from the context length; then only an overflow at
    ordinary lengths is a silent overflow)."""

    ctx: int = 64
    num_steps: int = 3
    max_bs: int = 4
    max_topk: int = 4
    ordinary_only: bool = False
    #: The longest request length searched, when lower than ``ctx`` (``affected``: what the scheduler admits).
    max_len: Optional[int] = None

    def __post_init__(self):
        from kvfence.errors import require

        require(self.ctx > self.num_steps, f"--shipped-ctx {self.ctx} must exceed --shipped-steps {self.num_steps}")
        require(self.max_topk <= 64, f"--shipped-max-topk {self.max_topk}: topk is at most 64")


@dataclass
class Cell:
    version: str
    backend: str
    mode: str
    status: str = ERROR
    detail: str = ""
    formula: str = ""
    case: Optional[dict] = None  # topk, requests, seq_lens, at_context_limit
    kinds: List[str] = field(default_factory=list)
    case_file: str = ""
    refuses_topk: bool = False  # the constructor raises for topk > 1 (only topk = 1 was searched)


def _config(spec: str, mode: str, topk: int, d: WitnessSpace) -> Config:
    return Config(topk=topk, num_steps=d.num_steps, ctx=d.ctx, max_bs=d.max_bs, sizing=spec, mode=mode)


def _first(lo: int, hi: int, holds: Callable[[int], bool]) -> Optional[int]:
    """The smallest ``L`` in ``[lo, hi]`` where the monotone ``holds`` is true (None if nowhere)."""
    if lo > hi or not holds(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo


def _even(total: int, raw_bs: int) -> Tuple[int, ...]:
    """``raw_bs`` lengths adding up to ``total``, as even as can be (the longest first)."""
    return tuple(total // raw_bs + (i < total % raw_bs) for i in range(raw_bs))


def search(spec: str, mode: str, d: WitnessSpace, topks: Optional[range] = None
           ) -> Tuple[Optional[Case], Optional[Case], Optional[Case]]:
    """``(first silent overflow, first overflow the check rejects, first fitting case it rejects)`` of the
    domain, each the minimal one (ordinary lengths before the context limit, then topk, requests, total length).
    ``topks``: the topk values searched (default ``1 .. d.max_topk``; one deployment's topk for ``affected``).

    A launch's need, width and host check depend on its lengths only through their sum (docs/contract.md §2,
    §8) and the request count, so for ``raw_bs`` requests every total ``S`` is tried as its most even batch
    (whose longest request is the shortest possible). Need and the check's used length grow with ``S`` and
    the width does not depend on it, so each is a threshold in ``S`` (found by bisection): below
    ``S1 = first S with need > W`` nothing overflows; at ``S1`` the launch overflows silently unless the check
    fires there; a check that fires only from ``S2 > S1`` admits the overflows ``S1 .. S2-1`` (the first is
    the witness), and one firing below ``S1`` rejects a fitting launch."""
    policy = shipped_sizing.policy(spec)
    refused = (policy.record.get("refuses") or {}).get("refuses") == "topk > 1"
    kernel = f"{upstream.SPEC_PREFIX}{policy.version}"
    top = d.ctx - d.num_steps if d.ordinary_only else d.ctx
    top = min(top, d.max_len) if d.max_len is not None else top
    found: Dict[str, List[tuple]] = {"silent": [], "caught": [], "wrong": []}
    topks = topks if topks is not None else range(1, d.max_topk + 1)
    for topk in ([1] if 1 in topks else []) if refused else topks:
        config = _config(spec, mode, topk, d)
        for raw_bs in range(1, d.max_bs + 1):
            @functools.lru_cache(maxsize=None)
            def launch(total, raw_bs=raw_bs, config=config, topk=topk):
                batch = Batch(_even(total, raw_bs), tuple(range(raw_bs)))
                lb = launch_batch(config, batch)
                need = launch_need(config, lb.seq_lens, lb.positions)
                width = config.row_width(lb.num_seqs)
                host = shipped_sizing.check_verdict(spec, topk, d.num_steps, lb.num_seqs, sum(lb.seq_lens), width, need)
                return batch, need, width, host[0] if host else None

            def record(key: str, total: int, launch=launch, config=config, topk=topk, raw_bs=raw_bs) -> None:
                batch = launch(total)[0]
                found[key].append((max(batch.seq_lens) > d.ctx - d.num_steps, topk, raw_bs, total,
                                   Case(config, batch, kernel)))

            lo, hi = raw_bs, raw_bs * top
            overflow = _first(lo, hi, lambda S: launch(S)[1] > launch(S)[2])
            fires = _first(lo, hi, lambda S: launch(S)[3] in ("HOST_CHECK_FIRED", "HOST_CHECK_REJECTS_FIT"))
            if overflow is not None:
                record("silent" if fires is None or fires > overflow else "caught", overflow)
            if fires is not None and (overflow is None or fires < overflow):
                record("wrong", fires)
    first = lambda xs: min(xs, key=lambda x: x[:4])[4] if xs else None  # noqa: E731
    return first(found["silent"]), first(found["caught"]), first(found["wrong"])


def _describe(case: Case, d: WitnessSpace) -> dict:
    lengths = list(case.batch.seq_lens)
    return {"topk": case.config.topk, "requests": case.batch.raw_bs, "seq_lens": lengths, "ctx": d.ctx,
            "num_steps": d.num_steps, "max_bs": d.max_bs, "at_context_limit": max(lengths) > d.ctx - d.num_steps}


def case_text(c: dict) -> str:
    where = "at the context limit" if c["at_context_limit"] else "at ordinary lengths"
    return (f"topk={c['topk']}, {c['requests']} request(s) of lengths {','.join(map(str, c['seq_lens']))} "
            f"(ctx={c['ctx']}, num_steps={c['num_steps']}, max_bs={c['max_bs']}): {where}")


class Runs:
    """The witness launches, in process. Releases whose extracted kernels are the same text (the module less
    its header, which names the release) share one ``Session``, and a launch already run for the same kernel
    text, inputs and width is not run again: its findings are a function of those."""

    def __init__(self, device: str):
        self.device = device
        self.sessions: Dict[str, Any] = {}  # Session, imported where one starts
        self.results: Dict[str, list] = {}
        self.bodies: Dict[str, str] = {}

    def body(self, version: str) -> str:
        if version not in self.bodies:
            entry = release_kernels.load_entry(version)
            assert entry is not None  # in the cache: shipped_sizing.load_record fetched it before any cell
            text = entry.module_path.read_text(encoding="utf-8")
            head, sep, rest = text.partition('"""\n\n')  # the header docstring names version and wheel
            self.bodies[version] = hashlib.sha256((rest if sep else text).encode()).hexdigest()
        return self.bodies[version]

    def findings(self, case: Case):
        from kvfence.contracts.draft.session import Session, host_verdict

        body = self.body(case.kernel[len(upstream.SPEC_PREFIX):])
        lb = case.launch()
        key = json.dumps([body, case.config.to_dict() | {"sizing": None}, case.batch.to_dict(),
                          case.config.row_width(lb.num_seqs),
                          (shipped_sizing.policy(case.config.sizing).record.get("host_check") or {}).get("tree")])
        if key not in self.results:
            if body not in self.sessions:
                self.sessions[body] = Session(self.device, case.kernel)
            self.results[key] = host_verdict(self.sessions[body].observe(case))
        return self.results[key]


def settle_cell(version: str, backend: str, mode: str, record: dict, d: WitnessSpace, runs: Runs, out: Path) -> Cell:
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.casefile import write_case

    cell = Cell(version, backend, mode)
    site = record[mode]
    state, text = shipped_sizing.site_state(site)
    if state == "absent":
        cell.status, cell.detail = NO_BUFFER, text
        return cell
    if state == "unreadable":
        cell.status, cell.detail = UNREADABLE, text
        return cell
    cell.formula = site["formula"]
    if site.get("replay"):  # the arithmetic would judge launches that never happen (shipped_wheel)
        cell.status, cell.detail = NOT_REPLAYED, site["replay"]
        return cell
    spec = f"{upstream.SPEC_PREFIX}{version}:{backend}"
    check = record.get("host_check")
    if check is not None and shipped_sizing.site_state(check)[0] == "unreadable":
        cell.status, cell.detail = UNREADABLE, "host check: " + shipped_sizing.site_state(check)[1]
        return cell
    silent, caught, wrong = search(spec, mode, d)
    refused = cell.refuses_topk = (record.get("refuses") or {}).get("refuses") == "topk > 1"
    witness = silent or wrong or caught
    if witness is None:
        cell.status = REFUSED if refused else CLEAN
        return cell
    cell.status = SILENT if silent else CHECK_WRONG if wrong else FIRES
    cell.case = _describe(witness, d)
    findings = runs.findings(witness)
    cell.kinds = sorted({f.kind.value for f in findings})
    expected = {SILENT: "SIZING_VIOLATION", CHECK_WRONG: "HOST_CHECK_REJECTS_FIT",
                FIRES: "HOST_CHECK_FIRED"}[cell.status]
    cell.case_file = str(write_case(launch_of(witness), findings, out_dir=out / version / f"{backend}-{mode}",
                                    device=runs.device, source="upstream matrix --shipped"))
    if expected not in cell.kinds:
        cell.detail = f"the arithmetic predicts {expected}, the run found {', '.join(cell.kinds) or 'nothing'}"
        cell.status = ERROR
    elif cell.status == SILENT and not set(cell.kinds) & OVERFLOW_DAMAGE:
        # SIZING_VIOLATION is arithmetic (need > width, known before the launch): an overflow is claimed
        # only where the release's kernel, run on the witness, was seen writing past its row.
        cell.detail = (f"the arithmetic predicts an overflow, but the release's kernel wrote nothing past its row "
                       f"(found: {', '.join(cell.kinds)})")
        cell.status = ERROR
    return cell


def run(versions: List[str], *, domain: WitnessSpace, device: str, offline: bool, out: Path,
        progress: Optional[TextIO] = None) -> dict:
    """Every release's cells; ``progress``: the stream of a bar over the releases (``None``: quiet)."""
    from kvfence.engine.progress import CountBar

    t0 = time.monotonic()
    runs = Runs(device)
    bar = CountBar(len(versions), "releases", progress) if progress is not None else None
    rows = []
    for version in versions:
        row: Dict[str, Any] = {"version": version, "cells": [], "note": ""}
        rows.append(row)
        try:
            if offline and release_kernels.load_entry(version) is None and not os.environ.get("KVFENCE_WHEEL_DIR"):
                row["note"] = NOT_CACHED
                continue
            record = shipped_sizing.load_record(version)
        except BadInput as exc:
            row["note"] = str(exc)
            continue
        finally:
            if bar is not None and row["note"]:
                bar.advance(f"sglang=={version}: {row['note']}"[:80])
        for backend in sorted(record["backends"]):
            for mode in MODES:
                cell = settle_cell(version, backend, mode, record["backends"][backend], domain, runs, out)
                row["cells"].append(asdict(cell))
        if bar is not None:
            silent = sum(c["status"] == SILENT for c in row["cells"])
            bar.advance(f"sglang=={version}: {len(row['cells'])} cells, {silent} silent overflow(s)")
    if bar is not None:
        bar.close()
    cells = [c for r in rows for c in r["cells"]]
    doc = {"kvfence_shipped_matrix": FORMAT, "versions": versions, "domain": asdict(domain), "device": device,
           "statuses": STATUSES, "rows": rows, "elapsed_s": round(time.monotonic() - t0, 2),
           "exit_code": EXIT_FINDINGS if any(c["status"] in (SILENT, ERROR) for c in cells) else EXIT_CLEAN}
    return doc
