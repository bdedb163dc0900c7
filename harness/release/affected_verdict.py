"""kvfence's answer for a deployment, one ``Verdict`` a contract and site, and what every answer shares: the words
of its basis and severity, the exit code of a set of lines, the release that fixes it (``fixed_in``), and the
progress lines of a long run (``progress``, ``step``).

The SGLang command (``kvfence.release.affected``), the sites other contracts list
(``kvfence.release.affected_sites``), the vLLM command (``kvfence.release.affected_vllm``) and each contract's own
release tooling build their lines from here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Tuple

from kvfence.release.deployment import Deployment

#: Exit codes of ``affected``: 0 none affected, 1 a line AFFECTED, 2 bad input (``kvfence.errors``), and
#: ``EXIT_UNKNOWN`` when no line is AFFECTED but one is UNKNOWN (an unknown release, a kernel kvfence cannot run,
#: a width it cannot read): a CI gate must not read "could not tell" as "not affected".
EXIT_UNKNOWN = 3

#: What a deployment suffers, by the class of a line (``kvfence.release.contract_space``'s, and the draft's).
SILENT, READ_PAST, SERVER_DOWN = "silent overwrite", "read past the table", "server down"
#: A verdict's basis (``Verdict.basis``): seen on the release's kernel, or decided by the width arithmetic alone;
#: for a path the deployment does not run, the release's code that decides it; for UNKNOWN, what kvfence lacks.
BASIS_OBSERVED, BASIS_ARITHMETIC = "the release's kernel showed it", "the width arithmetic"
BASIS_NOT_RUN, BASIS_UNREAD = "the release's code does not run this path here", "kvfence cannot tell"
#: ``Verdict.reader`` of a line whose damage happens in code kvfence does not run.
READER_ATTENTION = "the attention kernel given the length (not run by kvfence)"
#: The default line's length kvfence keeps to (a longer case path may pass it; ``--verbose`` has the rest).
SHORT_LINE = 200
SEVERITY_OF = {"writes past its row": SILENT, "width formula short": READ_PAST, "host check fires": SERVER_DOWN}


@dataclass
class Verdict:
    """One contract's answer for a deployment (one backend site or draft class).

    ``seen``: the kinds the release's kernel was seen to do (observed: ``kvfence.engine.findings.observed`` of the
    record); ``arithmetic``: the kinds decided before the launch (stated as arithmetic, never as damage);
    ``severity``: what the deployment suffers, and ``impact`` its words; ``fix``: the release that fixes it or
    the flag values that avoid it; ``evidence``: the wheel's ``file:line`` each fact comes from."""

    contract: str
    status: str              # affected | not affected | unknown | not launched
    condition: str = ""
    seen: List[str] = field(default_factory=list)
    arithmetic: List[str] = field(default_factory=list)
    fixed_in: Optional[str] = None
    fixed_text: str = ""
    avoid: List[str] = field(default_factory=list)
    severity: str = ""
    impact: str = ""
    case_file: str = ""
    site: str = ""
    evidence: List[str] = field(default_factory=list)
    reach: str = ""
    #: What the status rests on, in words: ``BASIS_OBSERVED`` (the release's kernel showed it) or ``BASIS_ARITHMETIC``
    #: (the width arithmetic), with ``reader`` naming the code kvfence does not run that would act on it.
    basis: str = ""
    reader: str = ""

    def line(self, dep: Deployment) -> str:
        parts = [f"{dep.describe()}: {self.contract}{f' ({self.site})' if self.site else ''}: {self.status.upper()}"]
        if self.severity:
            parts.append(f"severity: {self.severity} ({self.impact})" if self.impact else f"severity: {self.severity}")
        if self.reach:
            parts.append(self.reach)
        if self.condition:
            parts.append(self.condition)
        if self.seen:
            parts.append("the release's kernel showed " + ", ".join(self.seen))
        if self.fixed_text:
            parts.append(self.fixed_text)
        if self.avoid:
            parts.append("avoided with " + " or ".join(self.avoid))
        if self.case_file:
            parts.append(f"case: {self.case_file}")
        if self.basis:
            parts.append(f"basis: {self.basis}" + (f" (what reads it: {self.reader})" if self.reader else ""))
        if dep.assumed:
            parts.append("assumed: " + "; ".join(dep.assumed))
        return "; ".join(parts)

    def short(self) -> str:
        """The default line: status, contract, site, severity, basis, the shortest avoidance, the case file."""
        parts = [f"{self.status.upper()} {self.contract}{f' ({self.site})' if self.site else ''}"
                 + (f": {self.severity}" if self.severity else "")]
        if self.basis:
            parts.append(f"basis: {self.basis}")
        way = shortest_avoidance(self)
        if way:
            parts.append(f"avoid: {way}")
        if self.case_file:
            parts.append(f"case: {self.case_file}")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {"contract": self.contract, "site": self.site, "status": self.status, "severity": self.severity,
                "impact": self.impact, "reach": self.reach, "condition": self.condition, "observed": self.seen,
                "arithmetic": self.arithmetic, "fixed_in": self.fixed_in, "fixed": self.fixed_text,
                "avoid": self.avoid, "case_file": self.case_file, "evidence": self.evidence,
                "basis": self.basis, "reader": self.reader}


def shortest_avoidance(v: Verdict) -> str:
    """What avoids an AFFECTED line in a few words: its first flag (the cheapest change, as ``avoid`` orders
    them), and the fixing release; "" for other lines."""
    if v.status != "affected":
        return ""
    flag = v.avoid[0].split(" (", 1)[0] if v.avoid else ""
    release = f"sglang {v.fixed_in}+" if v.fixed_in else ""
    return " or ".join(x for x in (flag, release) if x) or "none known (no later release fixes it)"


def exit_code(verdicts: List[Verdict]) -> int:
    """1 when a line is AFFECTED, else ``EXIT_UNKNOWN`` when one is UNKNOWN, else 0."""
    if any(v.status == "affected" for v in verdicts):
        return 1
    return EXIT_UNKNOWN if any(v.status == "unknown" for v in verdicts) else 0


class Progress:
    """Progress of one ``affected`` run on stderr: each step once the run is past ``QUIET_S`` seconds, and a
    line every ``EVERY_S`` seconds while one step runs on (a witness search may take a minute)."""

    QUIET_S, EVERY_S = 2.0, 10.0

    def __init__(self, announce: Callable[[str], None]):
        import threading
        import time

        self.announce, self.time = announce, time
        self.start = time.monotonic()
        self.step_text, self.step_at = "starting", self.start
        self.shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _elapsed(self) -> float:
        return self.time.monotonic() - self.start

    def step(self, text: str) -> None:
        self.step_text, self.step_at = text, self.time.monotonic()
        if self._elapsed() >= self.QUIET_S:
            self.announce(f"kvfence affected: {text} ({self._elapsed():.0f} s)")
            self.shown = True

    def _tick(self) -> None:
        while not self._stop.wait(self.EVERY_S):
            self.announce(f"kvfence affected: still {self.step_text} ({self._elapsed():.0f} s)")
            self.shown = True

    def close(self) -> None:
        self._stop.set()
        if self.shown:
            self.announce(f"kvfence affected: done in {self._elapsed():.1f} s")


_CURRENT: List[Progress] = []


def step(text: str) -> None:
    """Report a step of the ``affected`` run in progress (a no-op outside one)."""
    if _CURRENT:
        _CURRENT[-1].step(text)


@contextlib.contextmanager
def progress(announce: Callable[[str], None]) -> Iterator[Progress]:
    """One ``affected`` run's ``Progress`` for the block: the run ``step`` reports to, closed when the block ends."""
    shown = Progress(announce)
    _CURRENT.append(shown)
    try:
        yield shown
    finally:
        _CURRENT.remove(shown)
        shown.close()


def later_releases(version: str, releases: List[str]) -> List[str]:
    from kvfence.release.release_matrix import version_key

    return [v for v in releases if version_key(v) > version_key(version)]


def fixed_in(version: str, releases: List[str],
             overflows: Callable[[str], Optional[bool]]) -> Tuple[Optional[str], str]:
    """The first release after ``version`` from which no later one overflows (``overflows(v)``: True,
    False, or None when unknown there)."""
    later = later_releases(version, releases)
    if not later:
        return None, f"not fixed: {version} is the newest release kvfence knows"
    states = [(v, overflows(v)) for v in later]
    fixed = None
    for v, state in states:
        if state is False and fixed is None:
            fixed = v
        elif state is not False:
            fixed = None
    if fixed is not None:
        return fixed, f"fixed in {fixed} (clean in every release after it up to {later[-1]})"
    last = states[-1]
    return None, (f"not fixed up to {last[0]}" if last[1] else f"unknown in {last[0]} (its sizing is not readable)")
