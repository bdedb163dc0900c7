"""``python -m kvfence repro FILE``: re-run one case file, of any contract, and print a readable diff.

The case file names its contract (``kvfence.engine.casefile``); the engine rebuilds its launch, applies the
overrides of kernel, sizing, mode and layout ("does my fix work on this case?"), describes it and writes out its
need/width arithmetic (``kvfence.engine.launch``). The case runs in a checking worker (``kvfence.engine.supervisor``)
through the contract's checker, so a case that crashes or hangs is reported as ``CRASH`` / ``HANG`` instead of
killing repro. With ``--verbose`` a case that survived runs again in this process on the plain path (the
contract's tables, oracle and launch: ``kvfence.engine.checking``), keeping its buffers, so every element of each
finding is listed with what the oracle expected there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from kvfence.contract import Contract, Launch
from kvfence.engine import launch as launches
from kvfence.engine import registry
from kvfence.engine.casefile import CaseFile, load_case
from kvfence.engine.findings import SEEN_BY_AUDIT, Finding, Kind, programs_text
from kvfence.engine.kernels import is_plugin, sizing_is_plugin
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, BadInput, require

if TYPE_CHECKING:  # annotations only: tables import torch
    from kvfence.engine.tables import Guarded

#: Programs a finding lists (its expected owners, the programs whose values were found there); more with
#: ``--verbose``.
PROGRAMS, VERBOSE_PROGRAMS = 6, 32
#: Elements ``--verbose`` lists per finding.
VERBOSE_ELEMENTS = 64


def require_trusted(loaded: CaseFile, *, kernel: Optional[str], sizing: Optional[str], trust: bool) -> None:
    """A case file's plug-ins are data: ``BadInput`` unless the user named them again or trusts the file.

    Re-running a case file must not run code it names (a file from a bug report could name any module), so a
    plug-in kernel or sizing runs only when ``--kernel`` / ``--sizing`` replace it or ``--trust-case`` is given.
    Builtin names, a contract's own (``mutant:NAME``) and releases (``sglang==V``) are always fine.
    """
    if trust:
        return
    record = registry.get(loaded.case.contract)
    for what, named, override, flag, plugin in (
            ("kernel", loaded.case.kernel, kernel, "--kernel", is_plugin(loaded.case.kernel)),
            ("sizing", loaded.case.sizing, sizing, "--sizing", sizing_is_plugin(record, loaded.case.sizing))):
        other = " (or --kernel reference, the contract's own, to see the case pass)" if what == "kernel" else ""
        require(override is not None or not plugin,
                f"case file {loaded.path} names {what} plug-in {named!r}, which kvfence does not import from a "
                f"case file: re-run with {flag} {named} (or --trust-case) if you trust that code{other}")


def _program_text(programs: Sequence[Sequence[int]], limit: int, names: Sequence[str] = ()) -> str:
    shown = programs_text(programs[:limit], names)
    return shown + (f" and {len(programs) - limit} more" if len(programs) > limit else "")


def finding_lines(i: int, f: Finding, *, elements: Optional[List[str]] = None, verbose: bool = False) -> List[str]:
    """One finding, as repro prints it: kind and where, its detail, its elements (``elements``: every one the
    plain path's re-run shows, up to a limit; else the samples it recorded), its expected owners and the
    programs whose values were found there."""
    where = f"{f.buffer} {f.region}"
    if f.count:
        where += f", elements [{f.start}, {f.stop}) ({f.count})"
    out = [f"[{i}] {f.kind.value}  {where}"]
    if f.detail:
        out.append(f"    {f.detail}")
    if elements:
        out += elements
    elif f.samples:
        out.append(f"      {'offset':>8} {'expected':>12} {'found':>12}")
        out += [f"      {off:>8} {str(e):>12} {str(g):>12}" for off, e, g in f.samples]
    limit = VERBOSE_PROGRAMS if verbose else PROGRAMS
    if f.programs:
        out.append(f"    expected owners (programs): {_program_text(f.programs, limit, f.owner_names)}")
    if f.writers:
        how = ("the programs the CPU address audit saw store there" if f.extra.get("writers") == SEEN_BY_AUDIT
               else "the programs whose values were found there")
        out.append(f"    written by: {_program_text(f.writers, limit, f.owner_names)} ({how})")
    return out


def _position(g: Guarded, region: str, offset: int) -> Optional[int]:
    """A finding's region and offset as a flat position of a guarded table (``kvfence.engine.tables``)."""
    name, _, row = region.rpartition(" ")
    if region == "front guard":
        return offset
    if region == "tail":
        return g.front + g.rows * g.stride + offset
    if not row.isdigit():
        return None
    index = int(row)
    if name in ("row", "slack of row"):
        return g.position(index, offset)
    if name == "guard after row":
        return g.position(index, g.table.width + offset)
    return None


def element_rows(kept: dict[str, Any], f: Finding, limit: int = VERBOSE_ELEMENTS) -> List[str]:
    """Every element of ``f`` in the plain path's buffers (``kept``: ``check_launch(keep=...)``), with what the
    oracle expected there and what the launch left."""
    from kvfence.engine.verdict import sample_value

    g = kept["buffers"].get(f.buffer)
    if g is None or not f.count:
        return []
    lo = _position(g, f.region.split(" .. ")[0], f.start)
    if lo is None:
        return []
    region, row, _ = g.locate(lo)
    wanted: Dict[Any, Any] = kept["expected"].get(f.buffer, {})
    before, after = kept["before"][f.buffer], kept["after"][f.buffer]
    rows = [f"      {'offset':>8} {'expected':>12} {'found':>12}"]
    hi = min(lo + f.count, lo + limit, len(after))
    for flat in range(lo, hi):
        reg, r, col = g.locate(flat)
        exp = wanted.get((r, col)) if reg == "row" else None
        e = sample_value(exp) if exp is not None else int(before[flat])
        found = int(after[flat])
        rows.append(f"      {f.start + flat - lo:>8} {e:>12} {found:>12}{'' if e == found else '   <-'}")
    if f.count > hi - lo:
        rows.append(f"      ... {f.count - (hi - lo)} more elements")
    return rows


def _plain(record: Contract[Any], case: Launch[Any], device: str, absorb: bool, max_bytes: Optional[int]
           ) -> Tuple[Optional[dict[str, Any]], str]:
    """The plain path's re-run of ``case`` in this process with its buffers kept, or ``(None, why not)``."""
    from kvfence.engine import kernels
    from kvfence.engine.checking import check_launch

    try:
        kernel = kernels.resolve(record, case.kernel)
    except BadInput as exc:
        return None, f"the plain path cannot run this kernel: {exc}"
    keep: dict[str, Any] = {}
    check_launch(record, kernel, case, device, audit=False, absorb=absorb, max_bytes=max_bytes, keep=keep)
    return (keep, "") if "buffers" in keep else (None, "the plain path's launch failed")


def run_repro(path: Union[str, Path], *, device: str = "auto", kernel: Optional[str] = None,
              sizing: Optional[str] = None,
              mode: Optional[str] = None, layout: Optional[str] = None, absorb: bool = True,
              verbose: bool = False, out: TextIO, announce: Optional[Callable[[str], None]] = None,
              trust_case: bool = False,
              in_process: bool = False, case_timeout: Optional[float] = None) -> int:
    """Load, re-run and describe one case file; returns the exit code (1 reproduces, 0 passes).

    ``absorb=False`` (``--no-absorb``) lets an overflow leave the buffer's allocation, as in production: for runs
    under compute-sanitizer (``kvfence.sanitizer.tool``). ``in_process`` skips the worker (debugging, and the
    sanitizer, which must watch the launch in the process it traces)."""
    from kvfence.device import select
    from kvfence.engine.budget import default_budget
    from kvfence.engine.checking import checker_for
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.supervisor import DEFAULT_CASE_TIMEOUT, RemoteSession

    loaded = load_case(path)
    record = registry.get(loaded.case.contract)
    require_trusted(loaded, kernel=kernel, sizing=sizing, trust=trust_case)
    case = launches.replace(record, loaded.case, kernel=kernel, sizing=sizing, mode=mode, layout=layout)
    device = select(device, announce=announce)
    # The budget a fuzz run on this device has by default (kvfence.engine.budget): a case it found replays here.
    plan = RunPlan(contract=record.name, kernel=case.kernel, sizing=case.sizing, device=device, mode=case.mode,
                   layout=case.layout, absorb=absorb, isolate=not in_process, max_bytes=default_budget(device),
                   case_timeout=DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout)
    if in_process:
        findings = checker_for(record, plan).check(case)
    else:
        with RemoteSession(plan) as worker:  # resolves the kernel in the worker: BadInput before anything runs
            findings = worker.check(case)
    def p(line: str = "") -> None:
        print(line, file=out)


    p(f"kvfence repro {path}")
    p(f"case    {launches.describe(record, case, full=True)}")
    original = loaded.case
    changed = [f"{name} {new} (file: {old})" for name, new, old in
               (("kernel", case.kernel, original.kernel), ("sizing", case.sizing, original.sizing),
                ("mode", case.mode, original.mode), ("layout", case.layout, original.layout)) if new != old]
    p(f"target  kernel {case.kernel}, sizing {case.sizing}, device {device}"
      + (f" (found on {loaded.device})" if loaded.device and loaded.device != device else ""))
    if changed:
        p(f"override {'; '.join(changed)}")
    for line in launches.explain(record, case):
        p(f"sizing  {line}")
    recorded = ", ".join(sorted({f.kind.value for f in loaded.findings})) or "none"
    p()
    if not findings:
        p(f"PASS: no findings (the file recorded {len(loaded.findings)}: {recorded})")
        return EXIT_CLEAN
    p(f"FAIL: {len(findings)} finding(s) (the file recorded {len(loaded.findings)}: {recorded})")
    kept, why = (None, "")
    if verbose and not any(f.kind in (Kind.CRASH, Kind.HANG) for f in findings):
        kept, why = _plain(record, case, device, absorb, plan.max_bytes)
    for i, f in enumerate(findings, 1):
        p()
        for line in finding_lines(i, f, elements=element_rows(kept, f) if kept else None, verbose=verbose):
            p(line)
    p()
    if verbose and why:
        p(f"(no element listing: {why})")
    elif not verbose:
        p(f"(--verbose lists every element of each finding, up to {VERBOSE_ELEMENTS}, from a re-run of the launch "
          "in this process)")
    return EXIT_FINDINGS
