"""What the harness reports: ``Finding`` and its kinds, defined once and imported everywhere."""

from __future__ import annotations

import difflib
import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Tuple


class Kind(str, enum.Enum):
    """Finding kinds. The value is what JSON, tables and case files carry."""

    #: An element the contract defines holds another (non-poison) value.
    VALUE_MISMATCH = "VALUE_MISMATCH"
    #: An element the contract defines still holds what was there before the launch (poison).
    MISSING_WRITE = "MISSING_WRITE"
    #: An element inside a buffer's rows but outside the write set changed (row overflow, slack writes,
    #: kv_indptr column 0, or an input the kernel must only read).
    STRAY_WRITE = "STRAY_WRITE"
    #: A canary in a front/row/tail guard changed: the kernel wrote outside the buffer's rows.
    GUARD_OVERWRITE = "GUARD_OVERWRITE"
    #: ``need > width`` for this launch: known before the kernel runs.
    SIZING_VIOLATION = "SIZING_VIOLATION"
    #: A shipped sizing's host check (read from the release's wheel) rejects a launch that would overflow: a loud
    #: failure in production (the assertion fires before the launch), not a silent one.
    HOST_CHECK_FIRED = "HOST_CHECK_FIRED"
    #: The host check admits a launch the kernel overflows: the check's formula is wrong (too lax).
    HOST_CHECK_ADMITS_OVERFLOW = "HOST_CHECK_ADMITS_OVERFLOW"
    #: The host check rejects a launch that fits its buffer: the check's formula is wrong (too strict).
    HOST_CHECK_REJECTS_FIT = "HOST_CHECK_REJECTS_FIT"
    #: The launch itself raised (compile error, interpreter error, CUDA error).
    LAUNCH_ERROR = "LAUNCH_ERROR"
    #: The process launching the case died before the verdict (journal: a dead fuzzing process;
    #: kvfence.engine.worker: a dead worker, or a CUDA context the launch left unusable).
    CRASH = "CRASH"
    #: The launch ran past its time limit (kvfence.engine.worker, ``--case-timeout``); its worker was killed.
    HANG = "HANG"
    #: Interpreter address audit: a load or store outside every registered allocation.
    OOB_READ = "OOB_READ"
    OOB_WRITE = "OOB_WRITE"
    #: An output element holds a value derived from an input table's guard poison: the kernel read past an
    #: input's rows and stored what it read (kvfence.engine.verdict).
    POISON_READ = "POISON_READ"
    #: compute-sanitizer's verdicts (kvfence.sanitizer.tool), one kind per tool.
    SANITIZER_MEMCHECK = "SANITIZER_MEMCHECK"
    SANITIZER_INITCHECK = "SANITIZER_INITCHECK"
    SANITIZER_RACECHECK = "SANITIZER_RACECHECK"
    SANITIZER_SYNCCHECK = "SANITIZER_SYNCCHECK"
    #: A compute-sanitizer run whose own signals cannot be trusted or disagree: a timeout, an exit code that
    #: does not match its report, an ``ERROR SUMMARY`` with no parsed record, an unreadable XML report, or
    #: a child that died or rejected its input. ``extra["log"]`` is the run's log file.
    SANITIZER_TOOL_ERROR = "SANITIZER_TOOL_ERROR"


class ContractKind(str):
    """A finding kind a contract declares (``kvfence.contract.FindingKind`` in ``Contract.kinds``). Behaves like
    ``Kind`` where findings are written (``.value``), so ``Finding`` carries it unchanged."""

    @property
    def value(self) -> str:
        return str(self)


#: kvfence's own kinds decided from a case's arithmetic before any launch (need against width, a host check's
#: formula); every other kind of ``Kind`` is seen in what a launch did.
ARITHMETIC_KINDS = frozenset({"SIZING_VIOLATION", "HOST_CHECK_FIRED", "HOST_CHECK_ADMITS_OVERFLOW",
                              "HOST_CHECK_REJECTS_FIT"})


def observed(record: object, kind: str) -> bool:
    """Whether ``kind`` is seen in what a kernel did (not decided by arithmetic before the launch): kvfence's own
    kinds but ``ARITHMETIC_KINDS``, and a contract's own kinds it declares observed."""
    declared = next((k for k in getattr(record, "kinds", ()) if k.name == kind), None)
    return declared.observed if declared is not None else kind not in ARITHMETIC_KINDS


def closest_kind(name: str, kinds: Iterable[str]) -> Optional[str]:
    """The kind a misspelt or guessed kind name most likely means (``WRONG_VALUE``: ``VALUE_MISMATCH``): a close
    spelling first, else the kind sharing most of its words; None when nothing is near."""
    names = sorted(kinds)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return close[0]
    words = set(name.upper().split("_"))
    shared: List[Tuple[int, Optional[str]]] = [(len(words & set(k.split("_"))), k) for k in names]
    best = max(shared, key=lambda pair: pair[0], default=(0, None))
    return best[1] if best[0] else None


def kind_of(value: str, declared: Iterable[str] = ()) -> "Kind | ContractKind":
    """The kind ``value`` names: a common ``Kind``, or one of ``declared`` (a contract's own kinds);
    ``ValueError`` for any other."""
    if value in declared:
        return ContractKind(value)
    return Kind(value)


#: ``Finding.extra["writers"]`` of a finding whose writers the CPU address audit saw store there (observed), not
#: the programs the oracle gives the values found there (inferred).
SEEN_BY_AUDIT = "address audit"


def program_text(program: Sequence[int], names: Sequence[str] = ()) -> str:
    """One program as a finding shows it: in its contract's own terms where ``names`` name its coordinates
    (``request 2``, ``(request 2, block 5)``), else its bare grid coordinates (``(0,1,2)``)."""
    if names and len(names) == len(program):
        text = ", ".join(f"{n} {x}" for n, x in zip(names, program))
        return text if len(program) == 1 else f"({text})"
    return "(" + ",".join(str(x) for x in program) + ")"


def programs_text(programs: Iterable[Sequence[int]], names: Sequence[str] = ()) -> str:
    return ", ".join(program_text(p, names) for p in programs)


@dataclass
class Finding:
    """One contiguous run of bad elements (or one launch-level problem).

    ``region`` is ``front guard``, ``row S``, ``slack of row S``, ``guard after row S`` or ``tail``;
    ``start``/``stop`` are element offsets inside that region (row-relative for rows and slack).
    ``samples`` holds a few ``(region offset, expected, found)`` triples; ``programs`` the programs (their grid
    coordinates, as ``Contract.owner`` gives them: ``(s, b, k)`` for the draft kernel) whose predicted segments
    (or kv_indptr columns) cover the run: its expected owners. ``writers`` the programs that wrote what was found
    there: the programs the oracle expects to store each found value (token tables hold distinct values, so a
    value names where it was copied from), those of the run's own row first, then of the row before it (a spill);
    for a guard overwrite on the CPU, the programs the address audit saw store there; empty when none is known.
    ``owner_names``: the names of a program's coordinates in its contract's own terms (``Contract.owner`` returning
    a ``typing.NamedTuple``, or a finding built with such programs: ``("request", "block")``), so a program shows
    as ``request 2, block 5``; empty: bare coordinates ``(0,1,2)``.
    """

    kind: Kind | ContractKind
    buffer: str
    region: str
    start: int = 0
    stop: int = 0
    samples: List[Tuple[int, Optional[int], Optional[int]]] = field(default_factory=list)
    programs: List[Tuple[int, ...]] = field(default_factory=list)  # grid coordinates: (s, b, k) for the draft
    detail: str = ""
    writers: List[Tuple[int, ...]] = field(default_factory=list)
    #: Structured facts of findings from outside tools (compute-sanitizer: access, address, thread, ...).
    extra: dict[str, Any] = field(default_factory=dict)
    owner_names: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Programs given as a contract's named tuples: their names kept, the programs plain tuples (a finding
        # crosses processes as data, never as a contract module's type).
        named = next((p for p in [*self.programs, *self.writers] if hasattr(p, "_fields")), None)
        if named is not None and not self.owner_names:
            self.owner_names = tuple(named._fields)
        self.owner_names = tuple(self.owner_names)
        self.programs = [tuple(p) if hasattr(p, "_fields") else p for p in self.programs]
        self.writers = [tuple(p) if hasattr(p, "_fields") else p for p in self.writers]

    @property
    def count(self) -> int:
        return self.stop - self.start

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        d["count"] = self.count
        d["samples"] = [list(x) for x in self.samples]
        d["programs"] = [list(p) for p in self.programs]
        d["writers"] = [list(p) for p in self.writers]
        if self.owner_names:
            d["owner_names"] = list(self.owner_names)
        else:
            del d["owner_names"]  # the draft's findings, and any of bare coordinates, as they always were
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], kinds: Iterable[str] = ()) -> "Finding":
        """The finding ``to_dict`` wrote; ``kinds``: the contract's own kinds it may carry."""
        return cls(
            kind=kind_of(d["kind"], kinds),
            buffer=d["buffer"],
            region=d["region"],
            start=d.get("start", 0),
            stop=d.get("stop", 0),
            samples=[tuple(x) for x in d.get("samples", [])],
            programs=[tuple(p) for p in d.get("programs", [])],
            detail=d.get("detail", ""),
            extra=dict(d.get("extra", {})),
            writers=[tuple(p) for p in d.get("writers", [])],
            owner_names=tuple(d.get("owner_names", ())),
        )

    def headline(self) -> str:
        """One line: kind, where, how many elements, the first sample, who wrote it."""
        where = f"{self.buffer} {self.region}"
        if self.count:
            where += f" [{self.start}:{self.stop}] ({self.count} elements)"
        parts = [f"{self.kind.value:<16} {where}"]
        if self.samples:
            off, exp, got = self.samples[0]
            parts.append(f"first @{off}: expected {exp}, found {got}")
        if self.programs:
            more = f" +{len(self.programs) - 4}" if len(self.programs) > 4 else ""
            parts.append(f"expected owners {programs_text(self.programs[:4], self.owner_names)}{more}")
        if self.writers:
            more = f" +{len(self.writers) - 4}" if len(self.writers) > 4 else ""
            parts.append(f"written by {programs_text(self.writers[:4], self.owner_names)}{more}")
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)
