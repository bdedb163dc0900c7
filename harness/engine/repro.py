"""``python -m kvfence repro FILE``: re-run one case file, of any contract, and print a readable diff.

The case file names its contract (``kvfence.engine.casefile``); the contract's record rebuilds the case, applies
the overrides of kernel, sizing, mode and layout ("does my fix work on this case?"), describes it and writes
out its need/width arithmetic. The case runs in a checking worker (``kvfence.engine.worker``), so a case that
crashes or hangs is reported as ``CRASH`` / ``HANG`` instead of killing repro. A contract that can show more
(the draft kernel: every element of each finding, each program's segment, with ``--verbose``) re-runs a case
that survived in this process for that (``Contract.replay_detail``).
"""

from __future__ import annotations

from typing import List, Optional, TextIO

from kvfence import contract as contracts
from kvfence.contract import VERBOSE_PROGRAMS
from kvfence.engine.casefile import CaseFile, load_case
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require
from kvfence.engine.findings import Finding, Kind



def require_trusted(loaded: CaseFile, *, kernel: Optional[str], sizing: Optional[str], trust: bool) -> None:
    """A case file's plug-ins are data: ``BadInput`` unless the user named them again or trusts the file.

    Re-running a case file must not run code it names (a file from a bug report could name any module),
    so a plug-in kernel or sizing runs only when ``--kernel`` / ``--sizing`` replace it or
    ``--trust-case`` is given. Builtin names (and a contract's own: ``mutant:NAME``, ``sglang==V``) are always
    fine.
    """
    if trust:
        return
    record = contracts.of(loaded.case)
    for what, named, override, flag in (("kernel", loaded.case.kernel, kernel, "--kernel"),
                                        ("sizing", record.case_sizing(loaded.case), sizing, "--sizing")):
        require(override is not None or not record.names_plugin(named),
                f"case file {loaded.path} names {what} plug-in {named!r}, which kvfence does not import from a "
                f"case file: re-run with {flag} {named} (or --trust-case) if you trust that code")


def _program_text(programs, limit: int) -> str:
    shown = ", ".join("(" + ",".join(str(x) for x in p) + ")" for p in programs[:limit])
    return shown + (f" and {len(programs) - limit} more" if len(programs) > limit else "")


def finding_lines(i: int, f: Finding, *, axes: str = "s,b,k", elements: Optional[List[str]] = None,
                  segments: Optional[List[str]] = None, verbose: bool = False) -> List[str]:
    """One finding, as repro prints it: kind and where, its detail, its elements (``elements``: every one the
    contract's replay shows, up to a limit; else the samples it recorded), its expected owners (with each
    one's segment, ``segments``, when given) and the programs whose values were found there. ``axes`` names a
    program's grid coordinates (the contract's ``program_axes``)."""
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
    limit = VERBOSE_PROGRAMS if verbose else 6
    if f.programs:
        out.append(f"    expected owners ({axes}): {_program_text(f.programs, limit)}")
        out += segments or []
    if f.writers:
        out.append(f"    written by ({axes}): {_program_text(f.writers, limit)} (the programs whose values were "
                   "found there)")
    return out


def run_repro(path, *, device: str = "auto", kernel: Optional[str] = None, sizing: Optional[str] = None,
              mode: Optional[str] = None, layout: Optional[str] = None, absorb: bool = True,
              verbose: bool = False, out: TextIO, announce=None, trust_case: bool = False,
              in_process: bool = False, case_timeout: Optional[float] = None) -> int:
    """Load, re-run and describe one case file; returns the exit code (1 reproduces, 0 passes).

    ``absorb=False`` (``--no-absorb``) lets an overflow leave the buffer's allocation, as in
    production: for runs under compute-sanitizer (``kvfence.sanitizer.tool``). The case runs first in a
    worker process (``kvfence.engine.worker``), so a case that crashes or hangs is reported as ``CRASH`` /
    ``HANG`` instead of killing repro; a case that survives is re-run here for the full diff when its contract
    shows one (``Contract.replay_detail``). ``in_process`` skips the worker (debugging).
    """
    from kvfence.engine.plan import RunPlan
    from kvfence.device import select

    loaded = load_case(path)
    record = contracts.of(loaded.case)
    require_trusted(loaded, kernel=kernel, sizing=sizing, trust=trust_case)
    case = record.override(loaded.case, kernel=kernel, sizing=sizing, mode=mode, layout=layout)
    device = select(device, announce=announce)
    from kvfence.engine.worker import DEFAULT_CASE_TIMEOUT, RemoteSession

    plan = RunPlan(contract=record.name, kernel=case.kernel, sizing=record.case_sizing(case), device=device,
                   case_timeout=DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout, isolate=not in_process)
    findings = None
    if not in_process:
        # Resolves the kernel in the worker: BadInput before anything runs.
        with RemoteSession(device, case.kernel, contract=record, plan=plan, case_timeout=plan.case_timeout,
                           absorb=absorb) as worker:
            findings = worker.check(case)
    fatal = [f for f in findings or [] if f.kind in (Kind.CRASH, Kind.HANG)]
    detail = None if fatal else record.replay_detail(case, device, absorb=absorb)
    if detail is not None:
        findings, show = detail
    elif findings is None:
        findings = record.session(plan).check(case)
    p = lambda line="": print(line, file=out)  # noqa: E731
    p(f"kvfence repro {path}")
    for line in record.repro_header(case):
        p(line)
    original = loaded.case
    changed = [f"{name} {new} (file: {old})" for name, new, old in
               (("kernel", case.kernel, original.kernel),
                ("sizing", record.case_sizing(case), record.case_sizing(original)))
               if new != old]
    changed += [f"{name} {new} (file: {old})" for name, new, old in record.setting_changes(original, case)]
    p(f"target  kernel {case.kernel}, sizing {record.case_sizing(case)}, device {device}"
      + (f" (found on {loaded.device})" if loaded.device and loaded.device != device else ""))
    if changed:
        p(f"override {'; '.join(changed)}")
    for line in record.explain(case):
        p(f"sizing  {line}")
    recorded = ", ".join(sorted({f.kind.value for f in loaded.findings})) or "none"
    p()
    if not findings:
        p(f"PASS: no findings (the file recorded {len(loaded.findings)}: {recorded})")
        return EXIT_CLEAN
    p(f"FAIL: {len(findings)} finding(s) (the file recorded {len(loaded.findings)}: {recorded})")
    for i, f in enumerate(findings, 1):
        p()
        extra = show(f, verbose) if detail is not None else {}
        for line in finding_lines(i, f, axes=record.program_axes, verbose=verbose, **extra):
            p(line)
    if detail is not None and not verbose:
        p()
        p("(--verbose shows every element of each finding, up to 64, and each program's segment)")
    return EXIT_FINDINGS
