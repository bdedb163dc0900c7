"""What ``kvfence mutants --verifiers both`` compares and reports (``kvfence.contracts.draft.compare``): the targets,
one drawn case's verdicts on both paths, a row per target, the whole comparison and its table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from kvfence.contracts.draft.case import Case
from kvfence.contracts.draft.device_verify import COUNTERS
from kvfence.engine.findings import Finding, Kind

REFERENCE = "reference"
#: The address audit's kinds: not a verifier's (see the module docstring).
AUDIT_KINDS = frozenset({Kind.OOB_READ, Kind.OOB_WRITE})
INPUTS = ("req_to_token", "seq_lens", "req_pool_indices", "positions")
INPUTS_COUNTER = COUNTERS.index("inputs")
#: Racy cases per target kept whole in the JSON (``racy_cases``), each launch's verdict with it.
RACY_KEPT = 8


def counter_of(f: Finding) -> Optional[int]:
    """The device counter (index into ``COUNTERS``) that must be non-zero when the oracle reports ``f``;
    None for findings no counter stands for (``SIZING_VIOLATION``, launch errors, the audit's)."""
    if f.buffer == "kv_indices" and f.kind in (Kind.VALUE_MISMATCH, Kind.MISSING_WRITE):
        return COUNTERS.index("kv_indices")
    if f.buffer == "kv_indptr" and f.kind in (Kind.VALUE_MISMATCH, Kind.MISSING_WRITE):
        return COUNTERS.index("kv_indptr")
    if f.buffer in ("kv_indices", "kv_indptr") and f.kind in (Kind.STRAY_WRITE, Kind.GUARD_OVERWRITE):
        return COUNTERS.index("outside")
    if f.buffer in INPUTS and f.kind == Kind.STRAY_WRITE:
        return INPUTS_COUNTER
    return None


def must_be_deterministic(target: "Target") -> bool:
    """The reference kernel (any sizing) and the planted writes: a race there is kvfence's bug (the
    module docstring)."""
    return target.kernel == REFERENCE or target.group == "planted"


def named(findings: List[Finding]) -> List[Tuple[str, str, str, int, int]]:
    """What is compared of a finding list: (kind, buffer, region, start, stop), sorted, audit kinds left out."""
    return sorted((f.kind.value, f.buffer, f.region, f.start, f.stop) for f in findings if f.kind not in AUDIT_KINDS)


@dataclass(frozen=True)
class Target:
    """One kernel (and sizing) whose cases both paths judge."""

    name: str
    group: str  # "reference", "kernel mutant", "sizing mutant" or "planted"
    kernel: str
    sizing: str
    domain: str
    what: str
    #: Draw the §6 fields too (a draft-kernel mutant of a §6 path, on the CPU domain, as the self-test).
    family: bool = False
    #: Config pins that reach the target's bug (its mutant's ``AIM``), for the extra rounds: (field, value)s.
    aim: Tuple[Tuple[str, int], ...] = ()
    #: False for a scale mutant on the CPU: its bug needs the GPU domain (``DOMAIN = "gpu"``), which the
    #: interpreter never draws, so it is not compared there (as the self-test calls it unreachable, expected).
    reachable: bool = True


@dataclass
class CaseResult:
    case: Case
    counters: Optional[List[int]]  # None: the device verifier does not judge this case (eager, need > width)
    implied: List[int]  # counters the oracle's findings imply
    oracle: List[Finding]
    device: List[Finding]
    problems: List[str]
    racy: bool = False  # two launches on one path named different findings (the module docstring)
    #: Every launch's verdict: path (device/oracle), how it ran (batch: ``check_many`` with the run's other
    #: cases; one: the case alone; cross-judge), and the kinds it named (none: clean).
    launches: List[dict] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.problems

    @property
    def dirty(self) -> bool:
        return bool(named(self.oracle))

    def to_dict(self) -> dict:
        return {"config": self.case.config.to_dict(), "batch": self.case.batch.to_dict(), "kernel": self.case.kernel,
                "counters": dict(zip(COUNTERS, self.counters)) if self.counters is not None else None,
                "counters_implied_by_oracle": [COUNTERS[i] for i in self.implied], "problems": self.problems,
                "racy": self.racy, "launches": self.launches,
                "oracle_findings": [f.headline() for f in self.oracle],
                "device_findings": [f.headline() for f in self.device]}


@dataclass
class Row:
    target: Target
    cases: int = 0
    dirty: int = 0  # cases the oracle path finds something in
    judged: int = 0  # cases the device verifier's counters judged (graph mode, need <= width)
    agree: int = 0
    racy: int = 0  # cases two launches on one path named differently (judged by the racy rule)
    counters_seen: List[str] = field(default_factory=list)
    kinds: List[str] = field(default_factory=list)
    first_disagreement: Optional[dict] = None
    #: The first ``RACY_KEPT`` racy cases in full (each launch's verdict included), so that a reader of the
    #: JSON sees what the racy rule was shown, not only how often it ruled.
    racy_cases: List[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def disagree(self) -> int:
        return self.cases - self.agree

    @property
    def exercised(self) -> bool:
        """Every target but the reference must leave damage in some case, or comparing on it proved
        nothing. (Whether a mutant is caught, and how fast, is the mutation self-test's question.)"""
        return self.target.group == REFERENCE or self.dirty > 0

    def add(self, r: CaseResult) -> None:
        self.cases += 1
        self.dirty += r.dirty
        self.judged += r.counters is not None
        self.agree += r.agree
        self.racy += r.racy
        if r.counters is not None:
            self.counters_seen = sorted(set(self.counters_seen) | {COUNTERS[i] for i, c in enumerate(r.counters) if c},
                                        key=COUNTERS.index)
        self.kinds = sorted(set(self.kinds) | {f.kind.value for f in r.oracle})
        if not r.agree and self.first_disagreement is None:
            self.first_disagreement = r.to_dict()
        if r.racy and len(self.racy_cases) < RACY_KEPT:
            self.racy_cases.append(r.to_dict())

    def to_dict(self) -> dict:
        t = self.target
        return {"name": t.name, "group": t.group, "kernel": t.kernel, "sizing": t.sizing, "domain": t.domain,
                "what": t.what, "reachable": t.reachable, "cases": self.cases, "dirty": self.dirty,
                "judged_by_counters": self.judged,
                "agree": self.agree, "disagree": self.disagree, "racy": self.racy, "exercised": self.exercised,
                "counters_seen": self.counters_seen, "oracle_kinds": self.kinds, "seconds": round(self.seconds, 2),
                "first_disagreement": self.first_disagreement, "racy_cases": self.racy_cases}


@dataclass
class Comparison:
    device: str
    max_examples: int
    seed: int
    max_bytes: Optional[int]
    rows: List[Row] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(r.cases for r in self.rows)

    @property
    def agree(self) -> int:
        return sum(r.agree for r in self.rows)

    @property
    def disagree(self) -> int:
        return sum(r.disagree for r in self.rows)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and self.disagree == 0 and all(r.exercised or not r.target.reachable for r in self.rows)

    def to_dict(self) -> dict:
        return {"device": self.device, "max_examples": self.max_examples, "seed": self.seed,
                "max_gpu_mem": self.max_bytes, "cases": self.cases, "agree": self.agree, "disagree": self.disagree,
                "racy": sum(r.racy for r in self.rows),
                "not_exercised": [r.target.name for r in self.rows if not r.exercised and r.target.reachable],
                "passed": self.passed,
                "rows": [r.to_dict() for r in self.rows]}


def row_verdict(r: Row) -> str:
    if r.disagree:
        return f"DISAGREE in {r.disagree}"
    if not r.target.reachable:
        return "not reachable here (expected)"
    if not r.exercised:
        return "NOT EXERCISED (no dirty case)"
    return "agree" if r.dirty else "agree (all clean)"


def format_table(report: Comparison) -> str:
    rows = [("target", "group", "domain", "cases", "dirty", "judged", "agree", "disagree", "counters seen",
             "oracle kinds", "verdict")]
    for r in report.rows:
        rows.append((r.target.name, r.target.group, r.target.domain, str(r.cases), str(r.dirty), str(r.judged),
                     str(r.agree), str(r.disagree), ",".join(r.counters_seen) or "-", ",".join(r.kinds) or "-",
                     row_verdict(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in report.rows:
        d = r.first_disagreement
        if d is not None:
            lines.append(f"first disagreement of {r.target.name}: {'; '.join(d['problems'])}")
            lines.append(f"  case: config {d['config']}, batch {d['batch']}, counters {d['counters']}")
            lines.append("  oracle path: " + (" | ".join(d["oracle_findings"]) or "(none)"))
            lines.append("  device path: " + (" | ".join(d["device_findings"]) or "(none)"))
    unexercised = [r.target.name for r in report.rows if not r.exercised and r.target.reachable]
    unreachable = [r.target.name for r in report.rows if not r.target.reachable]
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(f"{verdict}: {report.agree}/{report.cases} cases agree, {report.disagree} disagree over "
                 f"{len(report.rows) - len(unreachable)} targets ({report.max_examples} configs each, seed "
                 f"{report.seed}, device {report.device})"
                 + (f"; never dirty: {', '.join(unexercised)}" if unexercised else "")
                 + (f"; not reachable here (expected): {', '.join(unreachable)}" if unreachable else ""))
    return "\n".join(lines)
