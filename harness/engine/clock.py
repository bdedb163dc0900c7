"""The command's clock: per-phase timestamps (``startup_s``, ``first_launch_s``, ``first_failure_s``) are
seconds since the command the user typed started, not since some later point inside one process.

The top-level command records its start in ``KVFENCE_COMMAND_START`` (epoch seconds) before it starts
any child, so ``--jobs`` children and checking workers measure from the same instant. The start of the
top-level process is read from ``/proc`` (Linux), so the interpreter's own start-up and imports are
counted too; elsewhere it is the time this module was first imported.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

#: Environment variable that carries the command's start (epoch seconds) to its child processes.
START_ENV = "KVFENCE_COMMAND_START"
_IMPORTED_AT = time.time()
#: Top-level commands this process has run (``command_clock``).
_COMMANDS = 0


def _process_start() -> Optional[float]:
    """Epoch seconds at which this process started (Linux ``/proc``), or None where unavailable."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (starttime, clock ticks since boot) follows the command name, which may hold spaces.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        # starttime counts from boot on CLOCK_BOOTTIME: its age, read off that clock, dated by the wall clock.
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def command_start() -> float:
    """Epoch seconds at which the user's command started (inherited by children through ``START_ENV``)."""
    inherited = os.environ.get(START_ENV)
    if inherited:
        try:
            return float(inherited)
        except ValueError:
            pass
    started = _process_start()
    # starttime has clock-tick resolution (10 ms): a start "after" the import is that rounding.
    return min(started, _IMPORTED_AT) if started is not None else _IMPORTED_AT


@contextlib.contextmanager
def command_clock() -> Iterator[float]:
    """For the duration of one top-level command: its start, recorded in ``START_ENV`` for every child it
    starts. The variable is restored afterwards, so a process that runs commands in-process (a test calling
    ``cli.main``) leaks no stale start into processes it starts later; a second command in one process
    starts now, not when the process did."""
    global _COMMANDS
    previous = os.environ.get(START_ENV)
    start = command_start() if (_COMMANDS == 0 or previous) else time.time()
    _COMMANDS += 1
    os.environ[START_ENV] = repr(start)
    try:
        yield start
    finally:
        if previous is None:
            os.environ.pop(START_ENV, None)
        else:
            os.environ[START_ENV] = previous


def budget_left(seconds: Optional[float]) -> Optional[float]:
    """What is left of a budget of ``seconds`` counted from the command's start (never below 0; None stays None):
    a command's ``--max-seconds`` bounds its wall time, its start-up, compiles and captures included."""
    return None if seconds is None else max(0.0, seconds - (time.time() - command_start()))


def since_start(at: Optional[float]) -> Optional[float]:
    """Seconds from the command's start to epoch time ``at`` (None stays None), rounded to milliseconds."""
    return None if at is None else round(at - command_start(), 3)
