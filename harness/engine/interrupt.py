"""SIGINT and SIGTERM end a fuzz run cleanly instead of killing it.

``signals_interrupt()`` turns both into ``Interrupted`` (a ``KeyboardInterrupt``), which ``kvfence.engine.loop``
catches: the run keeps what it checked and the smallest failure so far, the journal slot is closed as
on any clean exit (so the next run does not report the interrupted case as a ``CRASH``), the CLI writes
the summary, the report and the case file, and exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).

A signal is never lost, whenever it comes: ``defer()`` (the first thing ``fuzz`` does) makes a signal
outside ``signals_interrupt`` be remembered rather than raised, so a Ctrl-C while the run starts (imports,
the worker starting) or while it writes its outputs lets that finish; the run then ends as interrupted:
``raise_pending()`` (each example's start) raises it, and ``pending()`` names it for the summary and the
exit code.
"""

from __future__ import annotations

import contextlib
import signal
from types import FrameType
from typing import Callable, Iterator, List, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Signals this process got (``defer`` and ``signals_interrupt`` remember them), oldest first.
_RECEIVED: List[int] = []


class Interrupted(KeyboardInterrupt):
    """A signal ended the run; ``exit_code`` is the shell's ``128 + signal number``."""

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal_name)


def exit_code_for(signal_name: str) -> int:
    return 128 + signal.Signals[signal_name].value


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM raise ``Interrupted``; the old handlers come back after."""

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        _RECEIVED.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _remember(signum: int, frame: Optional[FrameType]) -> None:
    _RECEIVED.append(signum)


def defer() -> None:
    """From now on SIGINT and SIGTERM outside ``signals_interrupt`` are remembered, not raised."""
    for sig in SIGNALS:
        signal.signal(sig, _remember)


def pending() -> Optional[str]:
    """The name of the first signal this process got, or ``None``."""
    return signal.Signals(_RECEIVED[0]).name if _RECEIVED else None


#: Signals received when the run's outputs were last written (``outputs_written``).
_AT_OUTPUTS: List[int] = []


def outputs_written() -> None:
    """The run's outputs are written, with what ``pending()`` said then: a signal after this changes none of them."""
    _AT_OUTPUTS[:] = [len(_RECEIVED)]


def only_after_outputs() -> bool:
    """Every signal this process got came after its outputs were last written (they say it was not interrupted)."""
    return bool(_RECEIVED) and _AT_OUTPUTS == [0]


def raise_pending() -> None:
    """Raise ``Interrupted`` for a signal that came while it was deferred (a safe point of the run)."""
    if _RECEIVED:
        raise Interrupted(_RECEIVED[0])


def child_dies_with_parent(signum: int) -> Optional[Callable[[], None]]:

    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``signum`` when this process dies, however
    it dies (Linux ``PR_SET_PDEATHSIG``, kept across exec), and exits at once if this process died before
    the child could ask; ``None`` where the platform has no such call (no orphan guard there)."""
    import ctypes
    import os

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: nothing to load after the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signum)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec
