"""``kvfence check-contract``'s child: a contract's methods asked about a few drawn cases, in a throwaway process.

A record's methods are its author's code: one that exits, aborts or hangs must end this child, never the command
(``check_contract`` in the parent says so in one line). The child loads the record by its registry entry
(``kvfence.engine.registry.loading``), draws ``examples`` cases of its CPU domain, asks every method about each
(``kvfence.engine.record_check.case_problems``), resolves the reference kernel and each planted bug's kernel, then
checks the reference kernel under the ``safe`` sizing on every drawn case with the engine's checker. What it found
goes to the report file as JSON: ``{"problems": [...], "cases": n, "launches": n}``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from kvfence.contract import Contract, Launch
from kvfence.engine.boundary import ContractFault, unexpected
from kvfence.errors import BadInput

#: Drawn cases every method is asked about (the JSON round trip, the need, the tables, the keys: cheap), however few
#: ``--examples`` the reference kernel is launched on: a ``from_json`` that rejects some drawn cases shows.
METHOD_EXAMPLES = 100


def check_contract(record: Contract[Any], *, examples: int, seed: int,
                   pins: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The child's report for ``record`` on its CPU domain with ``pins`` (config flags: ``{"window": 4}``), the
    child behind the boundary (``kvfence.engine.boundary``: each call into the record timed and named; a
    ``ContractFault`` when the record's code ended it); the user's signal is ``Interrupted``."""
    return check_named(record.name, examples=examples, seed=seed, pins=pins)


def check_named(name: str, *, examples: int, seed: int, pins: Optional[dict[str, Any]] = None,
                launches: bool = True) -> dict[str, Any]:
    """``check_contract`` of the contract registered as ``name``, never imported in this process; without
    ``launches`` only its methods are asked (no kernel is resolved or launched)."""
    from kvfence.engine import boundary, boundary_parent, registry
    from kvfence.engine.interrupt import Interrupted

    with tempfile.TemporaryDirectory(prefix="kvfence-check-contract-") as tmp:
        report, options = Path(tmp) / "report.json", Path(tmp) / "options.json"
        options.write_text(json.dumps({"loading": registry.loading_named(name), "examples": examples, "seed": seed,
                                       "pins": pins or {}, "launches": launches}))
        status = boundary_parent.supervise(
            [sys.executable, "-m", "kvfence.engine.record_probe", str(report), str(options)], [name],
            limit=boundary.call_limit(), env={"TRITON_INTERPRET": "1"}, quiet=True)
        if status.get("signal"):
            raise Interrupted(signal.Signals[status["signal"]].value)
        try:
            answer = json.loads(report.read_text())
        except (OSError, ValueError):
            answer = None
    if not isinstance(answer, dict):
        raise BadInput(f"contract {name!r}: its check ended without a report")
    return answer


def sizing_widths(contract: str, sizing: str, examples: int, seed: int) -> List[int]:
    """The widths the sizing ``sizing`` gives ``examples`` drawn cases of ``contract`` in each mode, computed in this
    process: the pytest plugin asks a sizing plug-in here, behind the boundary (``boundary_parent.call``), before
    its test process calls it (one that exits, hangs or raises is a usage error naming it)."""
    from kvfence.contract import MODES
    from kvfence.engine import registry
    from kvfence.engine.launch import width_of

    record = registry.get(contract)
    return [width_of(record, case, sizing, mode) for case in drawn(record, examples, seed, {}) for mode in MODES]


def drawn(record: Contract[Any], examples: int, seed: int, pins: dict[str, Any]) -> list[Any]:
    """``examples`` cases of the record's CPU domain with ``pins`` (Hypothesis's generate phase, seeded)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from kvfence.contract import Domain

    out: list[Any] = []
    strategy = record.cases(Domain("cpu", pins=pins))

    @hypothesis_seed(seed)
    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: Any) -> None:
        out.append(case)

    collect()
    return [c for drawn_ in out for c in (drawn_ if isinstance(drawn_, list) else [drawn_])]


def problems_of(record: Contract[Any], examples: int, seed: int, pins: dict[str, Any],
                launches: bool = True) -> dict[str, Any]:
    """What the child reports (see the module docstring)."""
    try:
        asked_cases = drawn(record, max(examples, METHOD_EXAMPLES) if launches else examples, seed, pins)
    except ContractFault as exc:
        return {"problems": [exc.problem], "cases": 0, "launches": 0}
    except BadInput as exc:
        return {"problems": [f"cases(domain) refuses the domain{' pinned to ' + str(pins) if pins else ''}: {exc} "
                             "(pin its flags with --pin NAME=VALUE)"], "cases": 0, "launches": 0}
    if not asked_cases:
        return {"problems": ["cases(domain) draws nothing"], "cases": 0, "launches": 0}
    refusals: List[dict[str, Any]] = []
    problems = _case_problems(record, asked_cases, refusals)
    if problems:
        return {"problems": problems, "cases": len(asked_cases), "launches": 0}
    for sizing in record.sizings:
        if all(sizing in r for r in refusals):
            problems.append(f"sizing {sizing!r} refuses every drawn case ({refusals[0][sizing]})")
    if not launches:
        return {"problems": problems, "cases": len(asked_cases), "launches": 0}
    problems += _kernel_problems(record)
    if problems:
        return {"problems": problems, "cases": len(asked_cases), "launches": 0}
    # The cases the reference kernel is launched on (the costly part).
    found = _reference_problems(record, asked_cases[:examples])
    return {"problems": found["problems"], "cases": len(asked_cases), "launches": found["launches"]}


def _case_problems(record: Any, asked_cases: List[Any], refusals: List[dict[str, Any]]) -> List[str]:
    """What the record's methods get wrong about the drawn cases, up to the first case with a problem; each case's
    sizing refusals appended to ``refusals``."""
    from kvfence.engine.record_check import case_problems

    problems: List[str] = []
    for case in asked_cases:
        refused: dict[str, Any] = {}
        found = asked(functools.partial(case_problems, record, case, refused=refused),
                      "asking its methods about a drawn case")
        refusals.append(refused)
        problems += [p for p in found if p not in problems]
        if problems:
            break
    return problems


def _kernel_problems(record: Any) -> List[str]:
    """The record's reference kernels and mutants that do not resolve."""
    from kvfence.engine import kernels

    problems = []
    for spec in [*kernels.references(record)] + [f"mutant:{m.name}" for m in record.mutants if m.patch or m.kernel]:
        try:
            kernels.resolve(record, spec)
        except BadInput as exc:
            problems.append(f"kernel {spec}: {exc}")
    return problems


def _reference_problems(record: Any, cases: List[Any]) -> Dict[str, Any]:
    """The reference kernel launched on ``cases`` through the engine's plain path (tables, oracle, launch) and the
    record's own checker where it has one: ``{"problems", "launches"}``, the problems empty when every launch is
    clean."""
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.plan import RunPlan

    plan = RunPlan(contract=record.name, device="cpu", sizing="safe")
    checkers = [("the engine's check of its tables", TableChecker(record, "cpu"))]
    own = asked(lambda: record.checker(plan), "checker(plan)")
    if isinstance(own, list):
        return {"problems": own, "launches": 0}
    if own is not None:
        checkers.append(("its own checker", own))
    launches = 0
    for case in cases:
        launch = asked(functools.partial(_bind, record, case), "binding a drawn case")
        if isinstance(launch, list):
            return {"problems": launch, "launches": launches}
        for path, checker in checkers:
            findings = asked(functools.partial(checker.check, launch),
                             f"checking the reference kernel ({path})")
            if findings and isinstance(findings[0], str):
                return {"problems": findings, "launches": launches}
            launches += 1
            if findings:
                return {"problems": [_unclean_reference(record, launch, path, findings)], "launches": launches}
    return {"problems": [], "launches": launches}


def _unclean_reference(record: Any, launch: Any, path: str, findings: List[Any]) -> str:
    from kvfence.engine.launch import describe

    kinds = ", ".join(sorted({f.kind.value for f in findings}))
    return (f"its reference kernel is not clean under the 'safe' sizing on its own drawn case ({path}: {kinds}; "
            f"{findings[0].headline()}; case {describe(record, launch)}): the oracle, the tables, the launch or the "
            "kernel disagree")


def _bind(record: Contract[Any], case: Any) -> Launch[Any]:
    from kvfence.engine.launch import bind

    return bind(record, case, "safe")


def asked(call: Callable[[], Any], what: str) -> Any:
    """``call()``, or its failure as a one-item list of problem text (the record's code raised)."""
    try:
        return call()
    except ContractFault as exc:
        return [exc.problem]
    except BadInput as exc:
        return [str(exc)]
    except Exception as exc:  # noqa: BLE001 - the record's own code: its failure is a problem of the record
        if getattr(exc, "kvfence_raised_in", None):  # raised in one of its methods (kvfence.engine.boundary)
            return [unexpected(exc, named=False)]
        return [f"{what} raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"]


def _main(report: Path, options: dict[str, Any]) -> None:
    from kvfence.engine import boundary
    from kvfence.engine.registry import load_in_worker

    boundary.enter_child()
    try:
        record = load_in_worker(options["loading"])
        answer = problems_of(record, options["examples"], options["seed"], options["pins"],
                             options.get("launches", True))
    except ContractFault as exc:
        answer = {"problems": [exc.problem], "cases": 0, "launches": 0}
    except BadInput as exc:
        answer = {"problems": [str(exc)], "cases": 0, "launches": 0}
    except Exception as exc:  # noqa: BLE001 - what the record's code raised or returned, named by its method
        answer = {"problems": [boundary.unexpected(exc, named=False)], "cases": 0, "launches": 0}
    report.write_text(json.dumps(answer))
    boundary.report({"exit": 0})
    os._exit(0)


if __name__ == "__main__":
    _main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
