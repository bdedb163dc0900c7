"""The mutation self-test: does kvfence catch the bugs each contract exists for, reliably?

Every contract lists its planted bugs (``Contract.mutants``: a patch of its reference kernel's text, a kernel of
its own, or the reference kernel under a buggy sizing), each with the finding kinds that must catch it and the
domain whose *default, unpinned* draws must reach it. ``self_test(record, device, seeds=...)`` fuzzes each one
over the seeds through the engine every run uses (the contract's draws, its checker in a checking worker, the
fuzz loop; the first failure as found: no shrinking, no target phase), and the reference kernel under the
``safe`` sizing over the same domains, which must stay clean:

* a mutant on its own domain must be detected in at least ``REQUIRED_RATE`` of the seeds, and a detection counts
  only when the first failure's kinds include one it declares (any other failure is a miss, reported with its
  kinds, so a broken mutant never passes);
* a ``gpu``-domain mutant (a scale bug: past a copy block, a lane width, a page of 64) fuzzed on the CPU domain
  must *not* be found at all, which proves it really is scale-only;
* a kernel bug that shows only under a buggy sizing is searched for its own kinds, beside the reference under the
  same sizing and filter (which must stay clean of them);
* a mutant that only the interpreter's address audit can see (every kind it declares is ``AUDIT_KINDS``) is not
  reachable on CUDA, where nothing audits addresses: there it must not be found, as a scale bug on the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from kvfence.contract import Contract
from kvfence.engine.findings import Kind
from kvfence.errors import BadInput, require

#: The kinds only the CPU interpreter's address audit reports (``kvfence.engine.audit``).
AUDIT_KINDS = frozenset({Kind.OOB_READ.value, Kind.OOB_WRITE.value})

#: Fraction of seeds under which a mutant must be detected (on its own domain) for the self-test to pass.
REQUIRED_RATE = 0.95
#: Cases of one config per example on the GPU domain, for a contract whose examples are runs of one config.
GPU_BATCHES = 32


def budget(record, domain: str) -> int:
    """Examples per mutant and seed on ``domain`` when the caller sets none: what the contract declares
    (``Contract.selftest_examples``, whose default suits one launch an example), on whichever device runs it: a
    CPU-domain bug on CUDA gets the CPU domain's budget, its draws are the same."""
    declared = getattr(record, "selftest_examples", None) or {}
    examples = declared.get(domain, Contract.selftest_examples[domain])
    require(isinstance(examples, int) and examples >= 1,
            f"contract {record.name}: selftest_examples[{domain!r}] must be a positive integer, got {examples!r}")
    return examples


@dataclass
class Row:
    """One target under every seed: a mutant, or the reference (``reference``: any finding is a miss)."""

    name: str
    kernel: str
    sizing: str
    domain: str  # where its default draws must reach the bug
    ran_on: str  # the domain its cases were drawn from
    expected: bool  # whether it should be found here
    detects: tuple = ()
    only: Optional[tuple] = None  # the kinds that alone make a case fail (a kernel bug shown under a buggy sizing)
    doc: str = ""
    reference: bool = False
    runs: List[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def found(self) -> List[bool]:
        return [bool(r["kinds"]) and (self.reference or r["declared"]) for r in self.runs]

    @property
    def detections(self) -> int:
        return sum(self.found)

    @property
    def passed(self) -> bool:
        if self.reference or not self.expected:  # nothing at all may be found, declared kinds or not
            return not any(r["kinds"] for r in self.runs)
        return self.detections >= REQUIRED_RATE * len(self.runs)

    def to_dict(self) -> dict:
        hit = [r for r, ok in zip(self.runs, self.found) if ok]
        examples = sorted(r["examples_to_failure"] for r in hit)
        secs = sorted(r["search_s"] for r in hit if r["search_s"] is not None)
        return {"name": self.name, "kernel": self.kernel, "sizing": self.sizing, "domain": self.domain,
                "ran_on": self.ran_on, "expected": self.expected, "reference": self.reference,
                "detects": list(self.detects), "only": list(self.only) if self.only else None, "doc": self.doc,
                "passed": self.passed, "seeds": len(self.runs), "detections": self.detections,
                "rate": round(self.detections / len(self.runs), 3) if self.runs else 0.0,
                "median_examples_to_detection": examples[len(examples) // 2] if examples else None,
                "worst_examples_to_detection": examples[-1] if examples else None,
                "median_search_s": round(secs[len(secs) // 2], 3) if secs else None,
                "worst_search_s": round(secs[-1], 3) if secs else None,
                "seconds": round(self.seconds, 2), "runs": self.runs}


def rows_of(record, device: str, names: Optional[List[str]] = None) -> List[Row]:
    """The targets: each mutant on its domain (a GPU-domain one on the CPU domain when there is no GPU, and an
    audit-only one on CUDA, where it must not be found), then the reference on every domain that ran."""
    known = {m.name: m for m in record.mutants}
    unknown = [n for n in names or () if n not in known]
    require(not unknown, f"contract {record.name}: unknown mutant(s) {', '.join(unknown)}: choose from "
                         f"{', '.join(known) or '(none)'}")
    rows, domains = [], set()
    for m in record.mutants:
        if names and m.name not in names:
            continue
        ran_on = m.domain if device == "cuda" else "cpu"
        domains.add(ran_on)
        kernel = f"mutant:{m.name}" if (m.patch or m.kernel) else "reference"
        both = bool((m.patch or m.kernel) and m.sizing)
        if both:
            rows.append(Row(f"reference under {m.sizing}, {'/'.join(m.detects)} only", "reference", m.sizing, ran_on,
                            ran_on, False, only=m.detects, doc="the reference under the same sizing and filter",
                            reference=True))
        audited_only = device == "cuda" and set(m.detects) <= AUDIT_KINDS
        rows.append(Row(m.name, kernel, m.sizing or "safe", m.domain, ran_on, ran_on == m.domain and not audited_only,
                        m.detects, m.detects if both else None, m.doc))
    for domain in sorted(domains or {"cpu" if device != "cuda" else "gpu"}):
        rows.append(Row(f"reference ({record.name})", "reference", "safe", domain, domain, False,
                        doc="the reference kernel under the safe sizing (must stay clean)", reference=True))
    return rows


def require_kernels(record, specs) -> None:
    """Every planted kernel the rows run resolves (a release's text extracted from its wheel, downloaded unless
    offline), before any row runs: a self-test cut short by a missing wheel is one line first, not after minutes."""
    from kvfence.engine import kernels

    for spec in dict.fromkeys(s for s in specs if s.startswith("mutant:")):
        mutant = kernels.mutant_of(record, spec.split(":", 1)[1])
        if mutant.kernel:  # a kernel of its own (a release's text): the patched ones resolve in the worker
            try:
                kernels.check_spec(mutant.kernel, record=record)
                if kernels.release_source(mutant.kernel):
                    kernels.release_kernel_file(record, mutant.kernel)
                elif kernels.is_plugin(mutant.kernel):
                    kernels.load_attr(mutant.kernel, "kernel")
            except BadInput as exc:
                raise BadInput(f"contract {record.name}: planted bug {mutant.name} cannot be built: {exc}") from None


class _OnlyKinds:
    """A checker whose findings count only when they include one of ``kinds``."""

    def __init__(self, session, kinds):
        self.session, self.kinds = session, set(kinds)
        self.stats = session.stats
        self.STOPS_EARLY = getattr(session, "STOPS_EARLY", False)

    def _keep(self, findings):
        return findings if findings and {f.kind.value for f in findings} & self.kinds else []

    def check(self, case):
        return self._keep(self.session.check(case))

    def check_many(self, cases, **kw):
        return [None if f is None else self._keep(f) for f in self.session.check_many(cases, **kw)]


def self_test(record, device: str, *, seeds, max_examples: Optional[int] = None, names: Optional[List[str]] = None,
              max_bytes: Optional[int] = None, audit: Optional[bool] = None, isolate: bool = True,
              on_row: Optional[Callable[[dict], None]] = None,
              progress: Optional[Callable[[str], None]] = None) -> dict:
    """Every target of ``rows_of`` over ``seeds`` (see the module docstring); the report as data. ``on_row(report)``
    is called after each row with the report so far (``complete`` false), so a run cut short keeps what it
    finished."""
    from kvfence.engine import run as pipeline
    from kvfence.engine.budget import default_budget
    from kvfence.engine.loop import damage_kinds, fuzz
    from kvfence.engine.plan import RunPlan

    seeds = list(seeds)
    require(seeds and all(isinstance(s, int) and s >= 0 for s in seeds), f"seeds must be integers >= 0, got {seeds}")
    require(max_examples is None or max_examples >= 1, f"max_examples must be positive, got {max_examples}")
    rows = rows_of(record, device, names)
    require_kernels(record, [r.kernel for r in rows])
    max_bytes = default_budget(device) if max_bytes is None else max_bytes
    base = RunPlan(contract=record.name, device=device, shrink_seconds=0.0, targeting=False, max_bytes=max_bytes,
                   audit=audit, isolate=isolate)

    def report(complete: bool) -> dict:
        done = [r.to_dict() for r in rows if r.runs]
        return {"contract": record.name, "device": device, "max_examples": max_examples, "seeds": seeds,
                "required_rate": REQUIRED_RATE, "passed": complete and all(r.passed for r in rows),
                "complete": complete, "rows_planned": len(rows), "rows": done}

    session = pipeline.checker(base.with_(domain=rows[0].ran_on if rows else "cpu"))
    try:
        for row in rows:
            plan = base.with_(kernel=row.kernel, sizing=row.sizing, domain=row.ran_on,
                              max_examples=max_examples or budget(record, row.ran_on),
                              batches_per_example=GPU_BATCHES if row.ran_on == "gpu" else 1)
            checker = _OnlyKinds(session, row.only) if row.only else session
            start = time.monotonic()
            for seed in seeds:
                search = plan.with_(seed=seed, shrink_seconds=0, targeting=False, max_seconds=None)
                r = fuzz(checker, pipeline.draws(plan)[0], search, contract=record)
                kinds = damage_kinds(r.findings)
                row.runs.append({"seed": seed, "kinds": kinds, "declared": bool(set(kinds) & set(row.detects)),
                                 "examples": r.examples, "examples_to_failure": r.examples_to_failure,
                                 "search_s": r.first_failure_s})
                if progress is not None:
                    progress(f"kvfence: {record.name} {row.name} seed {seed}: {kinds or 'clean'}")
            row.seconds = time.monotonic() - start
            if on_row is not None:
                on_row(report(False))
    finally:
        if hasattr(session, "close"):
            session.close()
    return report(True)


def verdict_text(row: dict) -> str:
    """What a row means, in words."""
    if row["reference"]:
        return "clean (expected)" if row["passed"] else "FOUND: the reference is not clean"
    if not row["expected"]:
        return "not reachable here (expected)" if row["passed"] else "FOUND off its domain"
    misses = sorted({k for r in row["runs"] if r["kinds"] and not r["declared"] for k in r["kinds"]})
    return (f"{row['detections']}/{row['seeds']} seeds" + ("" if row["passed"] else " (below 95%)")
            + (f"; undeclared kinds {', '.join(misses)} (detects: {', '.join(row['detects'])})" if misses else ""))


def format_table(report: dict) -> str:
    rows = [("target", "domain", "ran on", "verdict", "examples (median/worst)", "search s (median/worst)",
             "seconds")]
    for r in report["rows"]:
        examples = (f"{r['median_examples_to_detection']}/{r['worst_examples_to_detection']}"
                    if r["median_examples_to_detection"] is not None else "-")
        secs = f"{r['median_search_s']}/{r['worst_search_s']}" if r["median_search_s"] is not None else "-"
        rows.append((r["name"], r["domain"], r["ran_on"], verdict_text(r), examples, secs, f"{r['seconds']:.1f}"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    own = [r for r in report["rows"] if r["expected"]]
    lines.append(f"{'PASS' if report['passed'] else 'FAIL'}: contract {report['contract']}: "
                 f"{sum(r['passed'] for r in own)}/{len(own)} mutants detected in >= {REQUIRED_RATE:.0%} of "
                 f"{len(report['seeds'])} seed(s) on their domain, references "
                 f"{'clean' if all(r['passed'] for r in report['rows'] if r['reference']) else 'NOT clean'} "
                 f"(device {report['device']})")
    return "\n".join(lines)
