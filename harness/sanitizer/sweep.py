"""``python -m kvfence sweep``: the nightly job. Canaries first, then compute-sanitizer on the cases.

1. **Canary phase** (unless ``--cases DIR``): Hypothesis's nightly settings over the contract's draws (the run
   plan's: the draft kernel unless ``--contract`` names another), every example checked by the contract's
   session and ``target()``-ed on need/width so the search presses against the buffer limit. Nothing stops
   at the first failure: every verdict is recorded.
2. **Sanitizer phase**: every failing case (up to ``max_failing``) and a sample of passing ones are
   written as case files and re-run, one process per case and tool (``kvfence.sanitizer.tool``), plus one
   plain run of the same case for the slowdown's denominator.
3. **Report**: ``sweep.json`` and ``sweep.html`` (``reports/sweep.py``): per case, the canary verdict beside
   each tool's verdict, its own signals (``SANITIZER_TOOL_ERROR``) and slowdown against the same child
   run without a tool; with ``--matrix``, the detection matrix (``kvfence.sanitizer.matrix``).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require


def utilisation(case) -> float:
    """need / width of a launch (``kvfence.engine.launch.utilisation``)."""
    from kvfence.engine import launch as launches
    from kvfence.engine import registry

    return launches.utilisation(registry.get(case.contract), case)


def canary_phase(session, strategy, *, max_examples: int, seed: Optional[int], progress=None):
    """All (case, findings) Hypothesis explored, with need/width targeted. No shrinking, no stopping."""
    from hypothesis import HealthCheck, Phase, given, settings, target
    from hypothesis import seed as hyp_seed

    seen = {}

    def body(case):
        if case in seen:
            return
        findings = session.check(case)
        seen[case] = findings
        target(utilisation(case), label="need/width")
        if progress is not None and len(seen) % 200 == 0:
            progress(len(seen), sum(1 for f in seen.values() if f))

    test = settings(max_examples=max_examples, deadline=None, database=None, phases=[Phase.generate, Phase.target],
                    suppress_health_check=list(HealthCheck))(given(strategy)(body))
    if seed is not None:
        test = hyp_seed(seed)(test)
    test()
    return list(seen.items())


def select_cases(explored, *, max_failing: int, sample: int, seed: int = 0):
    """Every failing case (up to ``max_failing``, highest need/width first) and ``sample`` passing ones."""
    failing = sorted(((c, f) for c, f in explored if f), key=lambda cf: -utilisation(cf[0]))[:max_failing]
    passing = [(c, f) for c, f in explored if not f]
    rng = random.Random(seed)
    return failing + rng.sample(passing, min(sample, len(passing)))


def load_cases(cases_dir: str, kernel_override: Optional[str]):
    """``(case, findings, path)`` of every case file in ``cases_dir``; ``BadInput`` on anything wrong.

    A case file is data: it never makes kvfence import the code it names. A plug-in kernel runs only when
    the command line names it (``--kernel``, which then replaces every file's kernel).
    """
    from kvfence.engine.casefile import load_case
    from kvfence.engine.kernels import is_plugin

    folder = Path(cases_dir)
    require(folder.is_dir(), f"--cases {cases_dir}: no such directory")
    files = sorted(folder.glob("*.json"))
    require(files, f"--cases {cases_dir}: no case files (*.json)")
    chosen = []
    for path in files:
        loaded = load_case(path)
        require(kernel_override is not None or not is_plugin(loaded.case.kernel),
                f"--cases: {path.name} names the plug-in kernel {loaded.case.kernel!r}; pass --kernel to run a plug-in")
        chosen.append((loaded.case, loaded.findings, path))
    return chosen


def run_sweep(*, tools: Sequence[str], cases_dir: Optional[str], max_examples: int, jobs: int, plan_for,
              out_dir: Path, seed: Optional[int], max_failing: int, sample: int, timeout: float,
              announce: Callable[[str], None], kernel_override: Optional[str] = None, matrix: bool = False) -> int:
    """The whole sweep; returns the exit code: 1 when the canaries, any tool, or any tool's own signals
    (``SANITIZER_TOOL_ERROR``, baseline runs included) reported something, else 0.

    ``plan_for(device)`` is the canary phase's run plan (``kvfence.engine.plan.RunPlan``: its contract's
    draws, checked in this process by the contract's session); ``kernel_override`` (``--kernel`` with
    ``--cases``) replaces the kernel the case files name. ``matrix`` adds the detection matrix
    (``kvfence.sanitizer.matrix``).
    """
    from kvfence.device import select
    from kvfence.engine import run as pipeline
    from kvfence.engine.casefile import write_case
    from kvfence.engine.checking import checker_for
    from kvfence.reports.sweep import write_sweep_reports
    from kvfence.sanitizer import tool as sanitizer

    chosen = load_cases(cases_dir, kernel_override) if cases_dir is not None else None  # bad input first
    exe = sanitizer.locate()  # then exit 2 when the tool is missing
    device = select("cuda")  # or when there is no GPU
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "sanitizer"
    work.mkdir(exist_ok=True)

    t0 = time.perf_counter()
    if chosen is not None:
        explored_n, failing_n = len(chosen), sum(1 for _, f, _ in chosen if f)
    else:
        plan = plan_for(device)
        strategy, _ = pipeline.draws(plan)
        explored = canary_phase(checker_for(pipeline.record(plan), plan), strategy, max_examples=max_examples,
                                seed=seed, progress=lambda n, bad: announce(f"kvfence sweep: {n} cases, {bad} failing"))
        explored_n, failing_n = len(explored), sum(1 for _, f in explored if f)
        chosen = [(c, f, write_case(c, f, out_dir=out_dir, device=device, source="sweep"))
                  for c, f in select_cases(explored, max_failing=max_failing, sample=sample, seed=seed or 0)]
    canary_s = time.perf_counter() - t0
    announce(f"kvfence sweep: {explored_n} cases explored ({failing_n} failing) in {canary_s:.0f}s; "
             f"{len(chosen)} go to {', '.join(tools)}")

    def sanitize(item):
        case, findings, path = item
        return sanitize_case(exe, case, findings, path, tools, work, timeout=timeout, kernel_override=kernel_override,
                             announce=announce)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(sanitize, chosen))
    per_tool = {}
    for tool in tools:
        slow = [r["tools"][tool]["slowdown"] for r in rows if r["tools"][tool]["slowdown"] is not None]
        per_tool[tool] = {"cases_with_findings": sum(1 for r in rows if r["tools"][tool]["findings"]),
                          "cases_with_tool_errors": sum(1 for r in rows if r["tools"][tool]["tool_errors"]),
                          "median_slowdown": round(statistics.median(slow), 2) if slow else None}
    doc = {"tools": list(tools), "kernel": kernel_override or plan_for("cuda").kernel, "explored": explored_n,
           "failing": failing_n,
           "canary_seconds": round(canary_s, 1), "cases": rows, "per_tool": per_tool,
           "canary_cases_with_findings": sum(1 for r in rows if r["canary"]["kinds"]),
           # The children's own verdict (production layout, no tail guard): a finding the canary phase's
           # layout did not show still counts.
           "child_cases_with_findings": sum(1 for r in rows if r["baseline_exit"] == 1
                                            or any(t["child_exit"] == 1 for t in r["tools"].values())),
           "baseline_errors": sum(len(r["baseline_errors"]) for r in rows)}
    if matrix:
        from kvfence.sanitizer.matrix import run_matrix

        doc["detection_matrix"] = run_matrix(exe, out_dir, work, timeout=timeout, jobs=jobs, device=device,
                                             announce=announce)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    (out_dir / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
    html_path = write_sweep_reports(doc, out_dir)
    announce(f"kvfence sweep: wrote {out_dir / 'sweep.json'} and {html_path}")
    return sweep_exit(doc)


def sanitize_case(exe: str, case, findings, path: Path, tools: Sequence[str], work: Path, *, timeout: float,
                  kernel_override: Optional[str] = None, announce: Callable[[str], None] = lambda s: None,
                  python: str = sys.executable) -> dict:
    """One case under every tool, plus the same child without a tool (slowdown denominator and verdict
    check): the case's row of ``sweep.json``."""
    from kvfence.engine import launch as launches
    from kvfence.engine import registry
    from kvfence.sanitizer import tool as sanitizer

    record = registry.get(case.contract)
    mode = case.mode
    run_kernel = kernel_override or case.kernel
    kernel_filter = sanitizer.kernel_filter_for(run_kernel, record.name)
    # The denominator runs the same child, layout, flags and allocator as the tools.
    # The kernel always goes on the child's command line: the child never takes code from the case file.
    base, base_exit, base_errors = sanitizer.baseline(path, mode, work, timeout=timeout, kernel=run_kernel,
                                                      python=python)
    verdicts = [sanitizer.run_tool(exe, tool, path, mode, work, timeout=timeout, kernel_filter=kernel_filter,
                                   kernel=run_kernel, python=python) for tool in tools]
    for v in verdicts:
        # The child's own verdict must not depend on the tool watching it (same child, same flags).
        if v.child_exit in sanitizer.CHILD_VERDICTS and base_exit in sanitizer.CHILD_VERDICTS \
                and v.child_exit != base_exit:
            v.tool_errors.append(sanitizer.tool_error(
                v.tool, f"the child's verdict under {v.tool} (exit {v.child_exit}) differs from the same "
                        f"child without a tool (exit {base_exit})", v.log))
    summary = launches.summary(record, case)
    announce(f"kvfence sweep: {path.name}: canary {sorted({f.kind.value for f in findings}) or 'clean'}; "
             + ", ".join(f"{v.tool} {len(v.findings)} finding(s)"
                         + (f" + {len(v.tool_errors)} tool error(s)" if v.tool_errors else "") for v in verdicts))
    return {
        "case": str(path), "mode": mode, "kernel": run_kernel, "need": summary["need"], "width": summary["width"],
        "canary": {"kinds": sorted({f.kind.value for f in findings}),
                   "regions": sorted({f"{f.buffer} {f.region}" for f in findings})},
        "baseline_s": round(base, 3), "baseline_exit": base_exit,
        "baseline_errors": [f.to_dict() for f in base_errors],
        "tools": {v.tool: dict(v.to_dict(), slowdown=round(v.seconds / base, 2) if base > 0 else None)
                  for v in verdicts},
    }


def sweep_exit(doc: dict) -> int:
    """1 when anything was reported: canary findings, findings of the children's own verdicts, tool
    findings, tool errors, failed baselines.
    The detection matrix is evidence about the detectors, not a verdict on the kernel: it does not count."""
    dirty = (doc["canary_cases_with_findings"] or doc.get("baseline_errors") or doc.get("child_cases_with_findings")
             or any(v["cases_with_findings"] or v.get("cases_with_tool_errors") for v in doc["per_tool"].values()))
    return EXIT_FINDINGS if dirty else EXIT_CLEAN
