"""The detection matrix: which detector sees which class of memory bug, in eager and in graph mode.

For every bug class of ``kernels/draft/bugclasses.py`` (row-to-row overflow, short tail overflow, far tail
overflow, stray write into an input) one fixed case is run, per mode, under four detectors:

* ``canary``: kvfence's own verdict in its default layout (redzone guards after every row), via
  ``repro`` in a child process (a far store can corrupt the process that makes it);
* ``memcheck``: compute-sanitizer memcheck as it runs by default: caching allocator on, no padding;
* ``memcheck --padding``: the same with ``--padding`` (bytes memcheck adds after each allocation);
* ``memcheck nocache``: the same with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own cudaMalloc).

memcheck children run the production layout with no tail guard (``repro --layout production
--no-absorb``), so each store lands where it would in production. A cell says whether the detector saw
the bug, and carries every ``SANITIZER_TOOL_ERROR`` of its run: a cell whose run failed is reported as
such, never as "missed". The numbers exist only from a GPU run (``bash benchmarks/gpu.sh nightly``).
"""

from __future__ import annotations

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from kvfence.sanitizer import tool as sanitizer

MODES = ("eager", "graph")
CANARY = "canary"
DETECTORS = (
    sanitizer.Variant("memcheck", caching=True, name="memcheck"),
    sanitizer.Variant("memcheck", padding=sanitizer.PADDING_BYTES, caching=True, name="memcheck --padding"),
    sanitizer.Variant("memcheck", caching=False, name="memcheck nocache"),
)
DETECTOR_NAMES = (CANARY,) + tuple(v.label for v in DETECTORS)
#: The classes and the one case every class runs on (``matrix.json`` beside this module: data naming its
#: contract, its case as that contract's JSON, and the launchers' table: two requests, topk 2, three steps).
SPEC = json.loads((Path(__file__).resolve().parent / "matrix.json").read_text())
_FINDING_LINE = re.compile(r"^\[\d+\] (\w+)\s+(.+)$")


@dataclass(frozen=True)
class BugClass:
    name: str
    kernel: str  # a launcher plug-in spec
    description: str


def bug_classes() -> List[BugClass]:
    from kvfence.engine.kernels import load_attr

    classes = load_attr(SPEC["classes"], "matrix classes")
    return [BugClass(name, f"{SPEC['kernel_module']}:{attr}", text) for name, (attr, text) in classes.items()]


def class_case(bug: BugClass, mode: str):
    """The matrix's case, launched by ``bug``'s launcher in ``mode``."""
    from kvfence.engine import registry
    from kvfence.engine.launch import bind

    record = registry.get(SPEC["contract"])
    return bind(record, record.from_json(SPEC["case"]), SPEC["sizing"], bug.kernel, mode)


def canary_cell(case_path: Path, kernel: str, mode: str, work: Path, *, timeout: float,
                device: str = "cuda") -> dict:
    """kvfence's verdict on the case (default layout) in a child: seen = it reproduces (exit 1).
    (``device="cpu"`` runs it under the interpreter: the tests exercise the matrix that way.)"""
    stem = f"{case_path.stem}.{mode}.canary"
    status_path, log_path = work / f"{stem}.status.json", work / f"{stem}.log"
    status_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "kvfence.sanitizer_child", str(status_path), "repro", str(case_path),
           "--device", device, "--mode", mode, "--kernel", kernel]
    code, timed_out, seconds, log = sanitizer.run_process(cmd, sanitizer.case_env(sanitizer.default_caching(mode)),
                                                          timeout)
    log_path.write_text(log)
    child = sanitizer.read_status(status_path)
    kinds = sorted({m.group(1) for line in log.splitlines() if (m := _FINDING_LINE.match(line))})
    errors = []
    if timed_out:
        errors.append(f"timed out after {timeout:g} s")
    elif child is None:
        errors.append(f"the child left no status (exit {code})")
    elif child["exit"] not in sanitizer.CHILD_VERDICTS:
        errors.append(f"the child exited {child['exit']}: {child.get('error', '')}".strip())
    seen = bool(child and child["exit"] == 1)
    return {"seen": seen, "what": kinds, "tool_errors": errors, "seconds": round(seconds, 3), "log": str(log_path)}


def memcheck_cell(exe: str, variant: sanitizer.Variant, case_path: Path, kernel: str, mode: str, work: Path, *,
                  timeout: float) -> dict:
    """memcheck's verdict: seen = at least one record (an error memcheck attributes to this run)."""
    v = sanitizer.run_tool(exe, variant, case_path, mode, work, timeout=timeout, kernel_filter=None, kernel=kernel)
    what = sorted({f.extra.get("message", "") for f in v.findings})
    return {"seen": bool(v.findings), "what": what, "tool_errors": [f.extra["problem"] for f in v.tool_errors],
            "seconds": round(v.seconds, 3), "log": v.log, "exit_code": v.exit_code, "child_exit": v.child_exit}


def run_matrix(exe: str, out_dir: Path, work: Path, *, timeout: float, jobs: int = 1, device: str = "cuda",
               announce: Callable[[str], None] = lambda s: None) -> dict:
    """Every (class, mode, detector) cell; returns the ``detection_matrix`` document."""
    from kvfence.engine.casefile import write_case

    jobs_list = []
    rows: List[dict] = []
    for bug in bug_classes():
        row: Dict[str, Any] = {"class": bug.name, "kernel": bug.kernel, "description": bug.description, "cases": {},
                               "cells": {}}
        for mode in MODES:
            # Under matrix/, apart from the sweep's own cases/ (which --cases may re-run later).
            path = write_case(class_case(bug, mode), [], out_dir=out_dir / "matrix", device=device, source="matrix")
            row["cases"][mode] = str(path)
            row["cells"][mode] = {}
            jobs_list.append((row, mode, CANARY, partial(canary_cell, path, bug.kernel, mode, work, timeout=timeout,
                                                         device=device)))
            for variant in DETECTORS:
                jobs_list.append((row, mode, variant.label, partial(memcheck_cell, exe, variant, path, bug.kernel,
                                                                    mode, work, timeout=timeout)))
        rows.append(row)

    def one(job):
        row, mode, name, fn = job
        cell = fn()
        announce(f"kvfence matrix: {row['class']}, {mode}, {name}: "
                 f"{'seen' if cell['seen'] else 'missed'}{' (tool error)' if cell['tool_errors'] else ''}")
        return row, mode, name, cell

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for row, mode, name, cell in pool.map(one, jobs_list):
            row["cells"][mode][name] = cell
    return {"detectors": list(DETECTOR_NAMES), "modes": list(MODES), "classes": rows,
            "tool_errors": sum(len(c["tool_errors"]) for r in rows for m in r["cells"].values() for c in m.values())}


def summary(matrix: dict) -> Dict[str, Dict[str, Optional[str]]]:
    """``{class: {"mode detector": "seen" | "missed" | "error"}}``: the table's cells, for reports."""
    out: Dict[str, Dict[str, Optional[str]]] = {}
    for row in matrix["classes"]:
        cells = out.setdefault(row["class"], {})
        for mode in matrix["modes"]:
            for name in matrix["detectors"]:
                cell = row["cells"].get(mode, {}).get(name)
                if cell is None:
                    cells[f"{mode} {name}"] = None
                elif cell["tool_errors"] and not cell["seen"]:
                    cells[f"{mode} {name}"] = "error"
                else:
                    cells[f"{mode} {name}"] = "seen" if cell["seen"] else "missed"
    return out
