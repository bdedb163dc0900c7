"""``kvfence.check_kernel``: fuzz one kernel from an ordinary test, and fail it with a replayable case.

It is ``kvfence fuzz`` with the caller's test as its front end: it builds the run's plan
(``kvfence.engine.plan.RunPlan``) and takes the pipeline from ``kvfence.engine.run``, as the command line does:
Hypothesis draws the contract's cases in the caller's process, a checking worker process
(``kvfence.engine.worker``) launches the kernel and checks each case against the oracle, a failure is
shrunk, written as a case file, and raised as ``AssertionError`` whose message lists the findings and
ends with the ``repro:`` command (plug-in kernel and sizing named on it, so it replays as printed).

The kernel never runs in the caller's process (docs/security.md): a plug-in is first imported in a
throwaway process (``kvfence.engine.probe``), so an import that exits, aborts or raises
``KeyboardInterrupt`` is ``BadInput`` naming it, never a silent end of the test session; a launch that
exits, aborts or crashes is a ``CRASH`` finding and one that outlives ``case_timeout`` a ``HANG`` finding,
each with its case file, so a misbehaving kernel fails the test instead of passing it. ``max_seconds``
bounds the search as ``fuzz --max-seconds`` does (and ``shrink_seconds`` the shrinking).
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Optional, Union

from kvfence.errors import require

#: What a test gets unless it asks: a few seconds on the CPU interpreter.
DEFAULT_MAX_EXAMPLES = 50


def _seconds(value: object, positive: bool) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > 0 if positive else value >= 0))


def check_kernel(kernel: str, *, sizing: Optional[str] = None, max_examples: int = DEFAULT_MAX_EXAMPLES,
                 device: Optional[str] = None, seed: int = 0, shrink_seconds: float = 30.0,
                 out_dir: Union[str, Path] = "reports/out", mode: str = "graph", case_timeout: Optional[float] = None,
                 contract: Optional[str] = None, max_seconds: Optional[float] = None) -> None:
    """Fuzz ``kernel`` (``path/to/file.py:attr``, ``package.module:attr`` or a builtin name) of ``contract``
    (``kvfence.contract``: ``draft`` unless named) with the sizing policy ``sizing`` (default: the
    contract's safe one) for ``max_examples`` examples, or until ``max_seconds``; return if no case has a
    finding.

    ``device`` is ``cpu`` (the Triton interpreter), ``cuda`` or ``auto``; ``None`` keeps the choice the
    pytest plugin (``--kvfence-device``) or an earlier call made, else ``auto``. ``seed`` makes the
    run repeatable. On a finding the shrunk case is written under ``out_dir/cases/`` and
    ``AssertionError`` is raised: the findings, the case file and ``repro: python -m kvfence repro ...``.
    ``case_timeout``: seconds one case may take in the worker before it is a ``HANG`` (default: the
    ``fuzz --case-timeout`` default). Anything unusable (unknown kernel, contract, bad sizing, device, a plug-in
    whose import ends its process) is ``kvfence.errors.BadInput``.
    """
    __tracebackhide__ = True  # pytest: the failure is the message, not this function's source
    from kvfence.device import interpreting, select
    from kvfence.engine import registry
    from kvfence.engine import run as pipeline
    from kvfence.engine.boundary import in_child
    from kvfence.engine.boundary_parent import call, foreign
    from kvfence.engine.budget import default_budget
    from kvfence.engine.casefile import CASES_DIR, case_repro_command, format_failure, write_case
    from kvfence.engine.kernels import is_plugin
    from kvfence.engine.loop import fuzz
    from kvfence.engine.outdir import probe_folder
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.supervisor import DEFAULT_CASE_TIMEOUT

    require(isinstance(max_examples, int) and not isinstance(max_examples, bool) and max_examples >= 1,
            f"max_examples must be a positive integer, got {max_examples!r}")
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an integer, got {seed!r}")
    require(mode in ("graph", "eager"), f"mode must be graph or eager, got {mode!r}")
    require(_seconds(shrink_seconds, positive=False),
            f"shrink_seconds must be a number of seconds >= 0, got {shrink_seconds!r}")
    require(max_seconds is None or _seconds(max_seconds, positive=True),
            f"max_seconds must be a positive number of seconds, got {max_seconds!r}")
    require(isinstance(out_dir, (str, os.PathLike)) and str(out_dir), f"out_dir must be a path, got {out_dir!r}")
    require(isinstance(kernel, str) and kernel, f"kernel must be a spec string, got {kernel!r}")
    require(sizing is None or (isinstance(sizing, str) and sizing), f"sizing must be a spec string, got {sizing!r}")
    require(case_timeout is None or _seconds(case_timeout, positive=True),
            f"case_timeout must be a positive number of seconds, got {case_timeout!r}")
    contract = contract or registry.default_name()
    if device is None:
        device = "cpu" if interpreting() else "auto"
    # A plug-in contract's code, and a sizing plug-in's (called for every config drawn), run behind the boundary.
    if (foreign([contract]) or is_plugin(sizing)) and not in_child():
        call("kvfence.engine.api:check_kernel", dict(
            kernel=kernel, sizing=sizing, max_examples=max_examples, device=device, seed=seed,
            shrink_seconds=shrink_seconds, out_dir=os.fspath(out_dir), mode=mode, case_timeout=case_timeout,
            contract=contract, max_seconds=max_seconds), [contract], max_seconds)
        return
    record = registry.get(contract)
    # The case file goes to out_dir/cases/ after the run: a folder that cannot take it is refused now.
    for folder in (Path(out_dir), Path(out_dir) / CASES_DIR):
        require(not folder.exists() or folder.is_dir(), f"out_dir {out_dir}: {folder} exists and is not a directory")
    probe_folder(Path(out_dir), "out_dir", out_dir)
    device = select(device)
    plan = RunPlan(contract=contract, kernel=kernel, sizing=sizing or "safe", device=device, mode=mode,
                   domain="cpu" if device == "cpu" else "gpu", seed=seed, max_examples=max_examples,
                   max_seconds=max_seconds, shrink_seconds=shrink_seconds, max_bytes=default_budget(device),
                   case_timeout=DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout)
    pipeline.probe_plugins(plan)  # an import that ends its process ends only the probe's
    pipeline.record(plan)
    strategy, _ = pipeline.draws(plan)
    import threading

    from kvfence.engine.interrupt import signals_interrupt

    # A signal during the search is the user's (``Interrupted``, raised again below); from the main thread only.
    signals = signals_interrupt() if threading.current_thread() is threading.main_thread() else nullcontext()
    with pipeline.checker(plan) as session, signals:
        result = fuzz(session, strategy, plan, contract=record)
    if result.interrupted:  # the user's Ctrl-C (or a signal): it interrupts the caller too, never a pass
        import signal

        from kvfence.engine.interrupt import Interrupted

        raise Interrupted(signal.Signals[result.interrupted].value)
    if not result.findings:
        return
    extras = {"hypothesis": result.hypothesis} if result.hypothesis else {}
    path = write_case(result.case, result.findings, out_dir=Path(out_dir), device=device, source="check_kernel",
                      extras=extras)
    raise AssertionError(f"kvfence.check_kernel({kernel!r}, contract={contract!r}, sizing={plan.sizing!r}): "
                         f"{format_failure(result.case, result.findings)}\n"
                         f"case file: {path}\nrepro: {case_repro_command(path, result.case)}")
