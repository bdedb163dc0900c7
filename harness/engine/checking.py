"""The engine's checker: one launch of any contract, from its tables, its oracle and its launcher.

``check_launch`` is the whole pipeline for one ``Launch``:

1. the findings the case's arithmetic decides before any launch: ``SIZING_VIOLATION`` (``need > width``) and the
   contract's own arithmetic kinds (``Contract.findings_before_launch``);
2. the launch's memory (``kvfence.engine.budget.launch_bytes``: its tables and its checker's own buffers, from
   their shapes alone) against the run's budget (nothing is built past it);
3. the tables in guarded buffers (``kvfence.engine.tables``), the launch (captured in a CUDA graph in graph mode
   on CUDA; under the interpreter's address audit on the CPU, so a load or store outside every table's rows is
   ``OOB_READ`` / ``OOB_WRITE``), a launch that raises a ``LAUNCH_ERROR``;
4. every element against the oracle (``kvfence.engine.verdict``), after the oracle's keys are checked against
   the tables (a record mistake is ``RecordError``, one line, never a finding against the kernel).

``TableChecker`` runs it for one kernel on one device, resolving each kernel spec once
(``kvfence.engine.kernels``); it is what a contract gets unless it brings a checker of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from kvfence.contract import Checker, Contract, Launch
from kvfence.engine import kernels
from kvfence.engine.budget import launch_bytes, size_text
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.launch import spill
from kvfence.engine.record_check import fail, require_well_formed
from kvfence.errors import BadInput

if TYPE_CHECKING:  # annotations only: the plan's module is the front end's
    from kvfence.engine.audit import Audit
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.tables import Guarded
    from kvfence.engine.verdict import Expected

#: Bytes one launch may take when the run sets no budget (``--max-gpu-mem``): a case file holding a 2**30-token
#: context is refused in one line instead of allocating gigabytes.
DEFAULT_MAX_BYTES = 1 << 30


def arithmetic_findings(record: Contract[Any], launch: Launch[Any]) -> List[Finding]:
    """What the case and width decide before any launch: ``SIZING_VIOLATION`` and the contract's own."""
    out: List[Finding] = []
    need = record.need(launch)
    if need > launch.width:
        out.append(Finding(Kind.SIZING_VIOLATION, "launch", "row width", launch.width, need,
                           detail=f"need {need} > width {launch.width}: the width formula leaves the launch no room"))
    return out + list(record.findings_before_launch(launch))


def require_fits(record: Contract[Any], launch: Launch[Any], max_bytes: Optional[int]) -> None:
    """``BadInput`` (one line) when the launch would take more than ``max_bytes`` (``launch_bytes``: the number its
    draws were fitted to), before anything is built."""
    limit = max_bytes or DEFAULT_MAX_BYTES
    size = launch_bytes(record, launch)
    if size > limit:
        raise BadInput(f"contract {record.name}: this launch takes {size_text(size)}, over the {size_text(limit)} "
                       "one case may take (--max-gpu-mem); nothing was allocated")


def check_launch(record: Contract[Any], kernel: Any, launch: Launch[Any], device: str, *, audit: bool = False,
                 absorb: bool = True,
                 max_bytes: Optional[int] = None, keep: Optional[dict[str, Any]] = None) -> List[Finding]:
    """The findings of one launch (see the module docstring). ``keep``: filled with the buffers and their
    before/after snapshots, for ``repro --verbose``."""
    from kvfence.engine import tables as guarded
    from kvfence.engine.verdict import verdict, with_spills

    findings = arithmetic_findings(record, launch)
    require_fits(record, launch, max_bytes)
    tables = record.tables(launch)
    expected = record.expected(launch)
    require_well_formed(record, expected, tables)
    try:
        buffers = guarded.allocate_all(tables, device, layout=launch.layout, absorb=absorb,
                                       spill=spill(record, launch))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise fail(record.name, f"tables(case, width) cannot be laid out: {type(exc).__name__}: {exc}") from None
    # A production layout's store past a row lands on another row's element: which lands last is the device's
    # choice, so either value is accepted there, as on the draft's runner (one verdict for every path).
    expected = with_spills(expected, buffers)
    before = guarded.snapshot(buffers)
    graph = launch.mode == "graph" and device == "cuda"
    audit_findings: List[Finding] = []
    try:
        if audit:
            from kvfence.engine.audit import Audit

            watch = Audit()
            for g in buffers.values():
                watch.register_table(g)
            with watch:
                guarded.launch(record, kernel, buffers, launch, device, graph)
            audit_findings = watch.findings()
        else:
            guarded.launch(record, kernel, buffers, launch, device, graph)
    except BadInput:
        raise
    except Exception as exc:  # a kernel's compile or launch error is a finding, not kvfence's crash
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return findings + [Finding(Kind.LAUNCH_ERROR, "launch", "launch", detail=text)]
    after = guarded.snapshot(buffers)
    if keep is not None:
        keep.update(buffers=buffers, before=before, after=after, expected=expected)
    found = verdict(record, launch, buffers, before, after, expected=expected)
    name_programs(record, launch, audit_findings, found, expected, buffers, watch if audit else None)
    return findings + audit_findings + found


def name_programs(record: Contract[Any], launch: Launch[Any], audit_findings: List[Finding], found: List[Finding],
                  expected: Expected, buffers: Dict[str, Guarded], watch: Optional[Audit] = None) -> None:
    """The programs of a launch's findings in its contract's own shape: the audit's program ids ``(x, y, z)`` cut
    to the axes the contract's owner has (or the launch's grid has), and each guard overwrite's writer, seen by
    the audit or inferred from the oracle (``kvfence.engine.verdict.name_guard_writers``)."""
    from kvfence.engine.verdict import as_program, grid_shape, name_guard_writers

    if not audit_findings and not any(f.kind is Kind.GUARD_OVERWRITE for f in found):
        return
    names, axes = grid_shape(record, launch, expected)
    dims = tuple(next(iter(watch.grid_dims))) if watch is not None and len(watch.grid_dims) == 1 else ()
    for f in audit_findings:
        f.programs = list(dict.fromkeys(as_program(p, axes, dims) for p in f.programs))
        f.owner_names = f.owner_names or names
    name_guard_writers(record, launch, found, expected, buffers, watch.guard_stores if watch is not None else None,
                       names, axes)


class TableChecker:
    """The engine's checker of one contract on one device (``Contract.checker`` returning None gets it):
    each launch through ``check_launch`` with the kernel its spec names, resolved once per spec."""

    def __init__(self, record: Contract[Any], device: str, *, audit: Optional[bool] = None, absorb: bool = True,
                 max_bytes: Optional[int] = None) -> None:
        from kvfence.engine.audit import resolve_audit

        self.record, self.device = record, device
        self.audit = resolve_audit(audit, device)
        self.absorb, self.max_bytes = absorb, max_bytes
        if not absorb and device != "cuda" and not self.audit:
            raise BadInput("--no-absorb on the CPU needs the address audit: a wild store would write host memory")
        self.stats = {"launches": 0, "compiles": 0}
        self._compiled: set[Any] = set()

    def check(self, launch: Launch[Any], keep: Optional[dict[str, Any]] = None) -> List[Finding]:
        kernel = kernels.resolve(self.record, launch.kernel)
        self.stats["launches"] += 1
        key = (launch.kernel, launch.mode, self.record.keys(launch).compile)
        if key not in self._compiled:
            self._compiled.add(key)
            self.stats["compiles"] += 1
        return check_launch(self.record, kernel, launch, self.device, audit=self.audit, absorb=self.absorb,
                            max_bytes=self.max_bytes, keep=keep)


def checker_for(record: Contract[Any], plan: RunPlan) -> Checker:

    """The checker a run of ``plan`` uses for ``record``: the contract's own, else the engine's."""
    own = record.checker(plan)
    if own is not None:
        return own
    if plan.layout == "production" and not plan.absorb and plan.device != "cuda":
        raise BadInput("--no-absorb on the CPU needs the address audit")
    checker = TableChecker(record, plan.device, audit=plan.audit, absorb=plan.absorb, max_bytes=plan.max_bytes)
    # The plan's kernel resolved now, where the checker is made (a worker: before it says ready, under its start
    # allowance), not in the first launch's time limit: a release's kernel is read from its wheel (downloaded on
    # first use), a plug-in imported. A spec that cannot be resolved is BadInput before any case.
    kernels.resolve(record, plan.kernel)
    return checker
