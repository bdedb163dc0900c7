"""``kvfence.check_kernel``: fuzz one kernel from an ordinary test, and fail it with a replayable case.

It is ``python -m kvfence fuzz`` with the caller's test as its front end: Hypothesis draws cases of the
classic draft contract (docs/contract.md §2, §3) in the caller's process, a checking worker process
(``kvfence.workflow.worker``) launches the kernel and checks each case against the oracle, a failure is
shrunk, written as a case file, and raised as ``AssertionError`` whose message lists the findings and
ends with the ``repro:`` command (plug-in kernel and sizing named on it, so it replays as printed).

The kernel never runs in the caller's process (docs/security.md): a plug-in is first imported in a
throwaway process (``kvfence.workflow.probe``), so an import that exits, aborts or raises
``KeyboardInterrupt`` is ``BadInput`` naming it, never a silent end of the test session; a launch that
exits, aborts or crashes is a ``CRASH`` finding and one that outlives ``case_timeout`` a ``HANG`` finding,
each with its case file, so a misbehaving kernel fails the test instead of passing it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from kvfence.errors import require

#: What a test gets unless it asks: a few seconds on the CPU interpreter.
DEFAULT_MAX_EXAMPLES = 50


def check_kernel(kernel: str, *, sizing: str = "safe", max_examples: int = DEFAULT_MAX_EXAMPLES,
                 device: Optional[str] = None, seed: int = 0, shrink_seconds: float = 30.0,
                 out_dir="reports/out", mode: str = "graph", case_timeout: Optional[float] = None) -> None:
    """Fuzz ``kernel`` (``path/to/file.py:attr``, ``package.module:attr`` or a builtin name) with the
    sizing policy ``sizing`` for ``max_examples`` examples; return if no case has a finding.

    ``device`` is ``cpu`` (the Triton interpreter), ``cuda`` or ``auto``; ``None`` keeps the choice the
    pytest plugin (``--kvfence-device``) or an earlier call made, else ``auto``. ``seed`` makes the
    run repeatable. On a finding the shrunk case is written under ``out_dir/cases/`` and
    ``AssertionError`` is raised: the findings, the case file and ``repro: python -m kvfence repro ...``.
    ``case_timeout``: seconds one case may take in the worker before it is a ``HANG`` (default: the
    ``fuzz --case-timeout`` default). Anything unusable (unknown kernel, bad sizing, device, a plug-in
    whose import ends its process) is ``kvfence.errors.BadInput``.
    """
    __tracebackhide__ = True  # pytest: the failure is the message, not this function's source
    from kvfence.cases.budget import default_budget
    from kvfence.cases.casefile import CASES_DIR, case_repro_command, format_failure, write_case
    from kvfence.cases.targets import check_kernel_spec, resolve_sizing
    from kvfence.device import interpreting, select
    from kvfence.strategies import cases, configs
    from kvfence.workflow.fuzz import fuzz
    from kvfence.workflow.outdir import probe_folder
    from kvfence.workflow.probe import check_plugins
    from kvfence.workflow.worker import DEFAULT_CASE_TIMEOUT, RemoteSession

    require(isinstance(max_examples, int) and not isinstance(max_examples, bool) and max_examples >= 1,
            f"max_examples must be a positive integer, got {max_examples!r}")
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an integer, got {seed!r}")
    require(mode in ("graph", "eager"), f"mode must be graph or eager, got {mode!r}")
    require(isinstance(shrink_seconds, (int, float)) and not isinstance(shrink_seconds, bool)
            and math.isfinite(shrink_seconds) and shrink_seconds >= 0,
            f"shrink_seconds must be a number of seconds >= 0, got {shrink_seconds!r}")
    require(isinstance(out_dir, (str, os.PathLike)) and str(out_dir), f"out_dir must be a path, got {out_dir!r}")
    require(isinstance(kernel, str) and kernel, f"kernel must be a spec string, got {kernel!r}")
    require(isinstance(sizing, str) and sizing, f"sizing must be a spec string, got {sizing!r}")
    require(case_timeout is None or (isinstance(case_timeout, (int, float)) and not isinstance(case_timeout, bool)
                                     and math.isfinite(case_timeout) and case_timeout > 0),
            f"case_timeout must be a positive number of seconds, got {case_timeout!r}")
    # The case file goes to out_dir/cases/ after the run: a folder that cannot take it is refused now.
    for folder in (Path(out_dir), Path(out_dir) / CASES_DIR):
        require(not folder.exists() or folder.is_dir(), f"out_dir {out_dir}: {folder} exists and is not a directory")
    probe_folder(Path(out_dir), "out_dir", out_dir)
    timeout = DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout
    if device is None:
        device = "cpu" if interpreting() else "auto"
    device = select(device)
    check_plugins({"kernel": kernel, "sizing": sizing})  # an import that ends its process ends only the probe's
    check_kernel_spec(kernel)
    resolve_sizing(sizing)
    max_bytes = default_budget(device)
    domain = "cpu" if device == "cpu" else "gpu"
    strategy = cases(configs(sizing=sizing, mode=mode, domain=domain, max_bytes=max_bytes), kernel=kernel)
    with RemoteSession(device, kernel, max_bytes=max_bytes, case_timeout=timeout) as session:
        result = fuzz(session, strategy, max_examples=max_examples, seed=seed, shrink_seconds=shrink_seconds)
    if not result.findings:
        return
    extras = {"hypothesis": result.hypothesis} if result.hypothesis else {}
    path = write_case(result.case, result.findings, out_dir=Path(out_dir), device=device, source="check_kernel",
                      extras=extras)
    raise AssertionError(f"kvfence.check_kernel({kernel!r}, sizing={sizing!r}): "
                         f"{format_failure(result.case, result.findings)}\n"
                         f"case file: {path}\nrepro: {case_repro_command(path, result.case)}")
