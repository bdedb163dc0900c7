"""Live progress on stderr: one updating line on a terminal, plain periodic lines otherwise. ``Progress``
follows a fuzz run; ``CountBar`` a run over a known number of items (the matrices' releases and cells)."""

from __future__ import annotations

import sys
import time
from typing import Optional, Protocol, Sized, TextIO

BAR_WIDTH = 24
#: An example budget this large is no budget (a run bounded by ``--max-seconds`` only): not shown.
UNBOUNDED_EXAMPLES = 10**9
#: How often the fuzz loop calls back: often on a terminal (the line redraws), rarely in CI logs.
TTY_EVERY_S = 0.2
PLAIN_EVERY_S = 5.0


class Counts(Protocol):
    """What ``Progress`` reads of a run: a ``kvfence.engine.result.FuzzResult``, or the counts of a run's jobs
    added up (``kvfence.engine.jobs``)."""

    @property
    def elapsed_s(self) -> float: ...
    @property
    def examples(self) -> int: ...
    @property
    def verified_cases(self) -> int: ...
    @property
    def cached_cases(self) -> int: ...
    @property
    def shrink_cases(self) -> int: ...
    @property
    def shrinking(self) -> bool: ...
    @property
    def findings(self) -> Sized: ...
    @property
    def max_utilisation(self) -> float: ...


def _bar(spent: float) -> str:
    filled = int(BAR_WIDTH * spent)
    return "#" * filled + "." * (BAR_WIDTH - filled)


class _Line:
    """One progress line on ``stream``: redrawn in place on a terminal, a line of its own in a log."""

    def __init__(self, stream: Optional[TextIO], tty: Optional[bool]):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self._start = time.perf_counter()
        self._drawn = False

    def _draw(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays (a failure worth reading now), above the redrawn one."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends the redrawn line (terminal), so that what is printed next starts on a line of its own."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class Progress(_Line):
    """``update(result)`` takes a run's ``Counts`` (a ``kvfence.engine.result.FuzzResult``); ``close()`` ends the
    line (TTY)."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, *, tty: Optional[bool] = None,
                 seconds: Optional[float] = None):
        super().__init__(stream, tty)
        self.total = total
        #: A time budget (``--max-seconds``): the bar then shows whichever budget is closer to spent.
        self.seconds = seconds
        self.every_s = TTY_EVERY_S if self.tty else PLAIN_EVERY_S

    def line(self, result: Counts) -> str:
        """One line in the run's vocabulary (kvfence.engine.result.FuzzResult): examples against the budget,
        verified and cached cases, the verified rate, and what the run is doing now."""
        elapsed = result.elapsed_s or (time.perf_counter() - self._start)
        rate = result.verified_cases / elapsed if elapsed > 0 else 0.0
        done = min(result.examples, self.total)
        spent = done / self.total if self.total else 1.0
        if self.seconds:
            spent = max(spent, min(1.0, elapsed / self.seconds))
        budget = f"/{self.total}" if self.total < UNBOUNDED_EXAMPLES else ""
        clock = f"{elapsed:.0f}/{self.seconds:g}s" if self.seconds else f"{elapsed:.0f}s"
        n = len(result.findings)
        if result.shrinking:
            state = f"failure found, shrinking ({result.shrink_cases} shrink cases)"
        else:
            state = f"{n} finding{'s' * (n != 1)}"
        return (f"kvfence [{_bar(spent)}] {done}{budget} examples | {result.verified_cases} verified, "
                f"{result.cached_cases} cached | {rate:.1f} verified cases/s | {state} | {clock} | "
                f"max need/width {result.max_utilisation:.2f}")

    def update(self, result: Counts) -> None:
        self._draw(self.line(result))


class CountBar(_Line):
    """Progress over ``total`` items (``upstream matrix``'s cells, ``--shipped``'s releases): on a terminal one
    line redrawn per item; in a log (CI) a line at most every ``PLAIN_EVERY_S`` and the last one, so a
    740-cell matrix does not print 740 lines. ``note(text)`` prints a line that stays (a failure worth
    reading now) above the bar."""

    def __init__(self, total: int, what: str, stream: Optional[TextIO] = None, *, tty: Optional[bool] = None,
                 every_s: float = PLAIN_EVERY_S):
        if total < 0:
            raise ValueError(f"CountBar: total {total} < 0")
        super().__init__(stream, tty)
        self.total, self.what, self.done = total, what, 0
        self.every_s = every_s
        self._last = self._start

    def line(self, label: str) -> str:
        spent = self.done / self.total if self.total else 1.0
        return (f"kvfence [{_bar(spent)}] {self.done}/{self.total} {self.what} | "
                f"{time.perf_counter() - self._start:.0f}s | {label}")

    def advance(self, label: str, n: int = 1) -> None:
        """``n`` more items are done; ``label`` says what the last one was."""
        self.done = min(self.total, self.done + n)
        now = time.perf_counter()
        if self.tty or self.done == self.total or now - self._last >= self.every_s:
            self._draw(self.line(label))
            self._last = now
