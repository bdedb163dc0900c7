"""SIGINT and SIGTERM end a fuzz run cleanly instead of killing it.

``signals_interrupt()`` turns both into ``Interrupted`` (a ``KeyboardInterrupt``), which ``kvfence.workflow.fuzz``
catches: the run keeps what it checked and the smallest failure so far, the journal slot is closed as
on any clean exit (so the next run does not report the interrupted case as a ``CRASH``), the CLI writes
the summary, the report and the case file, and exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal ended the run; ``exit_code`` is the shell's ``128 + signal number``."""

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal_name)


def exit_code_for(signal_name: str) -> int:
    return 128 + signal.Signals[signal_name].value


@contextlib.contextmanager
def signals_interrupt():
    """Inside the block, SIGINT and SIGTERM raise ``Interrupted``; the old handlers come back after."""

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
