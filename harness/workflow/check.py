"""``kvfence.check_kernel``: fuzz one kernel from an ordinary test, and fail it with a replayable case.

It is ``python -m kvfence fuzz`` in the caller's process: Hypothesis draws cases of the classic draft
contract (docs/contract.md §2, §3), the session checks each against the oracle, a failure is shrunk,
written as a case file, and raised as ``AssertionError`` whose message lists the findings and ends with
the ``repro:`` command (plug-in kernel and sizing named on it, so it replays as printed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kvfence.errors import require

#: What a test gets unless it asks: a few seconds on the CPU interpreter.
DEFAULT_MAX_EXAMPLES = 50


def check_kernel(kernel: str, *, sizing: str = "safe", max_examples: int = DEFAULT_MAX_EXAMPLES,
                 device: Optional[str] = None, seed: int = 0, shrink_seconds: float = 30.0,
                 out_dir="reports/out", mode: str = "graph") -> None:
    """Fuzz ``kernel`` (``path/to/file.py:attr``, ``package.module:attr`` or a builtin name) with the
    sizing policy ``sizing`` for ``max_examples`` examples; return if no case has a finding.

    ``device`` is ``cpu`` (the Triton interpreter), ``cuda`` or ``auto``; ``None`` keeps the choice the
    pytest plugin (``--kvfence-device``) or an earlier call made, else ``auto``. ``seed`` makes the
    run repeatable. On a finding the shrunk case is written under ``out_dir/cases/`` and
    ``AssertionError`` is raised: the findings, the case file and ``repro: python -m kvfence repro ...``.
    Anything unusable (unknown kernel, bad sizing, device) is ``kvfence.errors.BadInput``.
    """
    __tracebackhide__ = True  # pytest: the failure is the message, not this function's source
    from kvfence.cases.budget import default_budget
    from kvfence.cases.casefile import case_repro_command, format_failure, write_case
    from kvfence.cases.targets import check_kernel_spec, resolve_sizing
    from kvfence.device import interpreting, select
    from kvfence.strategies import cases, configs
    from kvfence.verifying.session import Session
    from kvfence.workflow.fuzz import fuzz

    require(isinstance(max_examples, int) and not isinstance(max_examples, bool) and max_examples >= 1,
            f"max_examples must be a positive integer, got {max_examples!r}")
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an integer, got {seed!r}")
    require(mode in ("graph", "eager"), f"mode must be graph or eager, got {mode!r}")
    if device is None:
        device = "cpu" if interpreting() else "auto"
    device = select(device)
    check_kernel_spec(kernel)
    resolve_sizing(sizing)
    max_bytes = default_budget(device)
    domain = "cpu" if device == "cpu" else "gpu"
    strategy = cases(configs(sizing=sizing, mode=mode, domain=domain, max_bytes=max_bytes), kernel=kernel)
    session = Session(device, kernel, max_bytes=max_bytes)
    result = fuzz(session, strategy, max_examples=max_examples, seed=seed, shrink_seconds=shrink_seconds)
    if not result.findings:
        return
    extras = {"hypothesis": result.hypothesis} if result.hypothesis else {}
    path = write_case(result.case, result.findings, out_dir=Path(out_dir), device=device, source="check_kernel",
                      extras=extras)
    raise AssertionError(f"kvfence.check_kernel({kernel!r}, sizing={sizing!r}): "
                         f"{format_failure(result.case, result.findings)}\n"
                         f"case file: {path}\nrepro: {case_repro_command(path, result.case)}")
