"""Mutation self-test: does kvfence catch the bugs it exists for, reliably?

``kernels/draft/mutants/`` holds small files, each one known bug (its module docstring says which):

* kernel mutants (``KIND = "kernel"``): a ``PATCH``, a list of ``(reference text, mutated text)``
  pairs applied to ``kernels/draft/draft_kv_indices.py`` (each must match exactly once). ``build_kernel``
  writes the mutated module to a per-process scratch folder and it is loaded through the plug-in path
  (``file.py:generate_draft_decode_kv_indices``), exactly like a user's kernel file; run with ``safe``;
* sizing mutants (``KIND = "sizing"``): a policy ``row_width(n, topk, ctx, num_steps)``, run with the
  reference kernel.

Each file's ``CONTRACT`` (``draft`` unless stated) is the kernel contract it breaks (docs/contract.md §6):
a ``window-rail`` kernel mutant patches ``kernels/draft/window_kv_indices.py`` instead, and every mutant of it
is fuzzed (and the reference checked) under ``--contract window-rail``. Draws include the §6 fields
(window, sinks, page-granular rows, translation), as the default ``fuzz`` of a kernel that takes them.

Each file's ``DETECTS`` (required) is the tuple of finding kinds (``kvfence.engine.findings.Kind`` values)
its bug shows as: a seed detects the mutant only when the first failure's findings include one of them.
Any other failure (a ``LAUNCH_ERROR`` of a patch that does not compile, say, unless declared) is a
miss, reported with its kinds, so a broken mutant can never pass the self-test.

Each file's ``DOMAIN`` (``cpu`` unless stated) is the config space whose *default, unpinned* draws must
reach the bug (``kvfence.contracts.draft.domain``): no field is pinned, so a detection is the strategies' doing, not
the test author's. ``gpu`` mutants are scale bugs (past a copy block, a lane width, a page of 64): on a
CUDA device they are fuzzed on the GPU domain the way ``fuzz --device cuda`` does (config-major, many
batches per example) and must be caught; on the CPU they are fuzzed on the CPU domain and must *not*
be, which proves they really are scale-only. ``run_all(seeds=N)`` runs every mutant under N seeds and
reports its detection rate and median / worst examples-to-detection; the reference kernel with the
``safe`` sizing is fuzzed over the same domains, under every seed, and must stay clean.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple


from kvfence.errors import require
from kvfence.kernels import KERNELS_DIR

MUTANTS_DIR = KERNELS_DIR / "draft" / "mutants"
REFERENCE_KERNEL = KERNELS_DIR / "draft" / "draft_kv_indices.py"
KERNEL_ATTR = "generate_draft_decode_kv_indices"
#: Per contract: the reference file a kernel mutant patches and the kernel it names (docs/contract.md §6).
CONTRACT_KERNELS = {"draft": (REFERENCE_KERNEL, KERNEL_ATTR),
                    "window-rail": (REFERENCE_KERNEL.parent / "window_kv_indices.py",
                                    "generate_draft_decode_window_kv_indices")}
SIZING_ATTR = "row_width"
#: The attribute of a mutant file naming the finding kinds that count as detecting it.
DETECTS_ATTR = "DETECTS"
KINDS = ("kernel", "sizing")
REFERENCE = "reference"
#: Fraction of seeds under which a mutant must be detected (on its own domain) for the self-test to pass.
REQUIRED_RATE = 0.95


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # "kernel" or "sizing"
    path: Path
    domain: str  # "cpu" or "gpu": where default draws must reach the bug
    bug: str  # first line of the docstring

    kernel_file: Optional[Path] = None  # the built (mutated) kernel module, for kernel mutants
    contract: str = "draft"  # the contract it breaks (docs/contract.md §6): draft or window-rail
    detects: Tuple[str, ...] = ()  # the finding kinds its bug shows as (the file's DETECTS)

    @property
    def kernel(self) -> str:
        return f"{self.kernel_file}:{CONTRACT_KERNELS[self.contract][1]}" if self.kind == "kernel" else REFERENCE

    @property
    def sizing(self) -> str:
        return f"{self.path}:{SIZING_ATTR}" if self.kind == "sizing" else "safe"


@dataclass
class MutantResult:
    """One mutant under ``len(seeds)`` seeds. ``expected`` is whether it should be detected here (False
    for the reference, and for a GPU-domain mutant fuzzed on the CPU domain)."""

    name: str
    kind: str
    domain: str
    ran_on: str  # the domain its cases were drawn from
    expected: bool
    #: The finding kinds that count as detecting it (the file's DETECTS); empty for the reference,
    #: where any finding counts (it must stay clean).
    detects: Tuple[str, ...] = ()
    seeds: List[int] = field(default_factory=list)
    #: Per seed: examples to the first finding of a declared kind (None: not detected within the budget).
    to_detection: List[Optional[int]] = field(default_factory=list)
    seconds_to_detection: List[Optional[float]] = field(default_factory=list)
    kinds: List[str] = field(default_factory=list)
    #: Per seed: the kinds of the first failure when none was declared (a miss: not the planted bug).
    undeclared: List[Optional[List[str]]] = field(default_factory=list)
    seconds: float = 0.0
    budget: int = 0
    bug: str = ""
    headline: str = ""
    #: A reference row (the unmutated kernel, one per contract), not a mutant.
    reference: bool = False

    @property
    def detections(self) -> int:
        return sum(x is not None for x in self.to_detection)

    @property
    def detected(self) -> bool:
        return self.detections > 0

    @property
    def rate(self) -> float:
        return self.detections / len(self.seeds) if self.seeds else 0.0

    @property
    def examples_to_detection(self) -> Optional[int]:
        """Median examples to detection over the seeds that detected it."""
        found = sorted(x for x in self.to_detection if x is not None)
        return found[len(found) // 2] if found else None

    @property
    def worst_to_detection(self) -> Optional[int]:
        found = [x for x in self.to_detection if x is not None]
        return max(found) if found else None

    @property
    def passed(self) -> bool:
        # Off its domain (or the reference) nothing at all may be found, declared kinds or not.
        return self.rate >= REQUIRED_RATE if self.expected else self.detections == 0 and not any(self.undeclared)

    def to_dict(self) -> dict:
        secs = [x for x in self.seconds_to_detection if x is not None]
        return {"name": self.name, "kind": self.kind, "domain": self.domain, "ran_on": self.ran_on,
                "expected": self.expected, "passed": self.passed, "detected": self.detected,
                "seeds": len(self.seeds), "detections": self.detections, "rate": round(self.rate, 3),
                "examples_to_detection": self.examples_to_detection, "worst_examples_to_detection": self.worst_to_detection,
                "median_seconds_to_detection": round(sorted(secs)[len(secs) // 2], 3) if secs else None,
                "worst_seconds_to_detection": round(max(secs), 3) if secs else None,
                "per_seed": self.to_detection, "kinds": self.kinds, "detects": list(self.detects),
                "undeclared_per_seed": self.undeclared, "seconds": round(self.seconds, 3),
                "budget": self.budget, "bug": self.bug, "first_finding": self.headline}


@dataclass
class SelfTest:
    mutants: List[MutantResult] = field(default_factory=list)
    reference: List[MutantResult] = field(default_factory=list)
    max_examples: Optional[int] = None  # None: BUDGETS by domain
    seeds: List[int] = field(default_factory=list)
    device: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.reference) and all(r.passed for r in self.mutants + self.reference)

    def to_dict(self) -> dict:
        return {"device": self.device, "max_examples": self.max_examples, "seeds": self.seeds, "passed": self.passed,
                "required_rate": REQUIRED_RATE, "reference": [r.to_dict() for r in self.reference],
                "mutants": [m.to_dict() for m in self.mutants]}


def build_kernel(name: str, patch, contract: str = "draft", reference: Optional[Path] = None) -> Path:
    """Apply ``patch`` to the reference kernel's source (of ``contract``, or the file ``reference``: a
    plug-in contract's kernel) and write the mutated module; returns its path
    (``kvfence.contracts.draft.targets.patched_kernel``)."""
    from kvfence.contracts.draft.targets import patched_kernel

    plain = reference is None
    reference = reference or CONTRACT_KERNELS[contract][0]
    return patched_kernel(name, patch, reference, f"{name}.py" if plain else f"{reference.stem}-{name}.py")


def kernel_spec(name: str, directory: Path = MUTANTS_DIR) -> str:
    """``--kernel`` spec of one kernel mutant (built on the way), e.g. for tests and ``fuzz --kernel``."""
    (mutant,) = discover(directory, names=[name])
    require(mutant.kind == "kernel", f"mutant {name} is a {mutant.kind} mutant, not a kernel")
    return mutant.kernel


def discover(directory: Path = MUTANTS_DIR, names: Optional[List[str]] = None) -> List[Mutant]:
    """Every mutant file in ``directory`` (sorted), or only ``names``; ``BadInput`` on a malformed file.

    Imports each file (a kernel file's ``@triton.jit`` runs now: choose the device first).
    """
    from kvfence.contracts.draft.targets import _load_attr

    paths = sorted(p for p in Path(directory).glob("*.py") if not p.name.startswith("_"))
    if names:
        known = {p.stem: p for p in paths}
        unknown = [n for n in names if n not in known]
        require(not unknown, f"unknown mutant(s) {', '.join(unknown)}: choose from {', '.join(known)}")
        paths = [known[n] for n in names]
    out = []
    for path in paths:
        kind = _load_attr(f"{path}:KIND", "mutant")
        require(kind in KINDS, f"mutant {path.name}: KIND must be one of {', '.join(KINDS)}, got {kind!r}")
        domain = getattr(_module_of(path), "DOMAIN", "cpu")
        require(domain in ("cpu", "gpu"), f"mutant {path.name}: DOMAIN must be cpu or gpu, got {domain!r}")
        contract = getattr(_module_of(path), "CONTRACT", "draft")
        require(contract in CONTRACT_KERNELS,
                f"mutant {path.name}: CONTRACT must be one of {', '.join(CONTRACT_KERNELS)}, got {contract!r}")
        doc = (_load_attr(f"{path}:__doc__", "mutant") or "").strip()
        require(doc, f"mutant {path.name} has no docstring stating its bug")
        detects = declared_kinds(path, getattr(_module_of(path), DETECTS_ATTR, None))
        kernel_file = (build_kernel(path.stem, _load_attr(f"{path}:PATCH", "mutant"), contract)
                       if kind == "kernel" else None)
        out.append(Mutant(path.stem, kind, path, domain, doc.splitlines()[0], kernel_file, contract, detects))
    return out


def declared_kinds(path: Path, value) -> Tuple[str, ...]:
    """A mutant file's ``DETECTS``, validated: a non-empty tuple (or list) of distinct finding kinds."""
    from kvfence.engine.findings import Kind

    known = [k.value for k in Kind]
    require(isinstance(value, (tuple, list)) and value and all(isinstance(k, str) for k in value),
            f"mutant {Path(path).name}: {DETECTS_ATTR} must be a non-empty tuple of finding kinds "
            f"({', '.join(known)}), got {value!r}")
    unknown = [k for k in value if k not in known]
    require(not unknown, f"mutant {Path(path).name}: {DETECTS_ATTR} names unknown kind(s) {', '.join(unknown)}: "
                         f"choose from {', '.join(known)}")
    require(len(set(value)) == len(value), f"mutant {Path(path).name}: {DETECTS_ATTR} repeats a kind: {list(value)}")
    return tuple(value)


def names_the_bug(kinds, detects) -> bool:
    """Whether a failure's finding kinds detect a mutant: one of the kinds it declares (``DETECTS``). The
    reference declares none, and fails on any finding."""
    return bool(kinds) and (not detects or bool(set(kinds) & set(detects)))


def _module_of(path: Path):
    from kvfence.contracts.draft.targets import _load_file

    return _load_file(path)


#: Batches per example on the GPU domain, as ``fuzz --device cuda`` draws them (config-major).
GPU_BATCHES = 32


def _strategy(domain: str, kernel: str, sizing: str, max_bytes: Optional[int], contract: str = "draft"):
    from kvfence.contracts.draft.strategies import case_runs, cases, configs

    # The §6 fields drawn as the default fuzz of the reference draws them (every mutant is one of it):
    # in the domain's share of examples (fuzz --family auto, kvfence.contracts.draft.domain).
    config = configs(sizing=sizing, domain=domain, max_bytes=max_bytes, family="auto", contract=contract)
    if domain == "gpu":
        return case_runs(config, kernel=kernel, max_batches=GPU_BATCHES)
    return cases(config, kernel=kernel)


def _run(result: MutantResult, session, strategy, *, max_examples: int, seeds: List[int],
         progress: Optional[Callable[[MutantResult], None]] = None) -> MutantResult:
    from kvfence.engine.loop import damage_kinds, fuzz

    start = time.perf_counter()
    for seed in seeds:
        # No shrinking budget: the first failing example is the detection; its findings are reported.
        r = fuzz(session, strategy, max_examples=max_examples, seed=seed, shrink_seconds=0.0, targeting=False)
        result.seeds.append(seed)
        kinds = damage_kinds(r.findings)
        found = names_the_bug(kinds, result.detects)
        result.to_detection.append(r.examples_to_failure if found else None)
        result.seconds_to_detection.append(r.first_failure_s if found else None)
        result.undeclared.append(kinds if kinds and not found else None)
        if found and not result.kinds:
            result.kinds, result.headline = kinds, r.findings[0].headline()
        result.seconds = time.perf_counter() - start
        result.budget = max_examples
        if progress is not None:
            progress(result)  # after every seed: a long self-test shows (and can save) where it is
    return result


#: Examples per mutant and seed when the caller sets none, by the domain the mutant runs on. A GPU-domain
#: example is up to 32 batches of one config, and Hypothesis mutates the config rarely from one example
#: to the next, so 60 examples see only a dozen or so configs: a bug that needs pages of 128 tokens
#: (one page size of eight) was reached in 17-18 of 20 seeds with 60, in 20 of 20 with 100 (a strategy
#: simulation on the CPU; the H200 record is in BENCHMARKS.md). Under the production-weighted prior
#: (kvfence.contracts.draft.domain), which gives page 1 a third of the draws, 100 reached it in 18 of 20 seeds and
#: 150 in 20 of 20 (``benchmarks/prior_reach.py``).
BUDGETS = {"cpu": 60, "gpu": 150}


def run_all(device: str, *, max_examples: Optional[int] = None, seeds=(0,), names: Optional[List[str]] = None,
            reference_examples: Optional[int] = None, audit: Optional[bool] = None,
            progress: Optional[Callable[[MutantResult], None]] = None, directory: Path = MUTANTS_DIR,
            max_bytes: Optional[int] = None, verifier: str = "auto") -> SelfTest:
    """Fuzz every mutant under each seed (``max_examples`` each, unpinned draws from its domain), then
    the reference over every domain that ran, which must stay clean. ``verifier`` is the sessions'
    (``kvfence.contracts.draft.session.VERIFIERS``). ``max_bytes`` (``None``: the device's default budget, as
    ``kvfence mutants`` passes it) bounds every config drawn: the budget shapes the draws, so a self-test
    without it would test other examples than the command's."""
    from kvfence.contracts.draft.budget import default_budget
    from kvfence.contracts.draft.session import Session
    from kvfence.contracts.draft.targets import resolve_sizing

    require(max_examples is None or max_examples >= 1, f"max_examples must be positive, got {max_examples}")
    seeds = list(seeds)
    require(seeds and all(isinstance(x, int) and x >= 0 for x in seeds), f"seeds must be non-negative integers, got {seeds}")
    mutants = discover(directory, names=names)
    require(mutants, f"no mutant files in {directory}")
    report = SelfTest(max_examples=max_examples, seeds=seeds, device=device)
    max_bytes = default_budget(device) if max_bytes is None else max_bytes
    reference = Session(device, REFERENCE, audit=audit, max_bytes=max_bytes, verifier=verifier)
    ran_on = set()
    for m in mutants:
        resolve_sizing(m.sizing)  # a broken sizing file is bad input before anything runs
        domain = m.domain if device == "cuda" else "cpu"
        ran_on.add((domain, m.contract))
        session = reference if m.kind == "sizing" else Session(device, m.kernel, audit=audit, max_bytes=max_bytes,
                                                              verifier=verifier)
        result = MutantResult(m.name, m.kind, m.domain, domain, expected=(domain == m.domain), bug=m.bug,
                              detects=m.detects)
        report.mutants.append(_run(result, session, _strategy(domain, m.kernel, m.sizing, max_bytes, m.contract),
                                   max_examples=max_examples or BUDGETS[domain], seeds=seeds, progress=progress))
    for domain, contract in sorted(ran_on):
        what = "" if contract == "draft" else f", contract {contract}"
        # One row per contract, named by it: two rows both called "reference" could not be told apart.
        result = MutantResult(f"{REFERENCE} ({contract})", "kernel", domain, domain, expected=False, reference=True,
                              bug=f"the reference kernel with the safe sizing{what} (must stay clean)")
        budget = reference_examples if reference_examples is not None else 2 * (max_examples or BUDGETS[domain])
        report.reference.append(_run(result, reference, _strategy(domain, REFERENCE, "safe", max_bytes, contract),
                                     max_examples=budget, seeds=seeds, progress=progress))
    return report


def _budget_text(max_examples: Optional[int]) -> str:
    if max_examples:
        return f"{max_examples} examples"
    return "examples " + ", ".join(f"{n} on the {d} domain" for d, n in BUDGETS.items())


def verdict_text(r: MutantResult) -> str:
    """What a row means, in words: the reference is "clean (expected)", a scale mutant on the CPU domain
    "not reachable here (expected)", a mutant on its own domain its detection count."""
    if r.reference:
        return "clean (expected)" if not r.detected else "FOUND: the reference is not clean"
    if not r.expected:
        return "not reachable here (expected)" if r.passed else "FOUND off its domain"
    misses = sorted({k for kinds in r.undeclared if kinds for k in kinds})
    return (f"{r.detections}/{len(r.seeds)} seeds" + ("" if r.passed else " (below 95%)")
            + (f"; undeclared kinds {', '.join(misses)} (DETECTS: {', '.join(r.detects)})" if misses else ""))


def format_table(report: SelfTest) -> str:
    rows = [("mutant", "kind", "domain", "ran on", "verdict", "examples (median/worst)", "budget", "finding kinds",
             "seconds")]
    for r in report.mutants + report.reference:
        examples = f"{r.examples_to_detection}/{r.worst_to_detection}" if r.detected else "-"
        rows.append((r.name, r.kind, r.domain, r.ran_on, verdict_text(r), examples, str(r.budget),
                     ", ".join(r.kinds) or "-", f"{r.seconds:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    own = [m for m in report.mutants if m.expected]
    caught = sum(m.passed for m in own)
    off = [m for m in report.mutants if not m.expected]
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(f"{verdict}: {caught}/{len(own)} mutants detected in >= {REQUIRED_RATE:.0%} of {len(report.seeds)} "
                 f"seed(s) on their domain"
                 + (f", {sum(m.passed for m in off)}/{len(off)} scale mutants unreachable on the CPU domain" if off else "")
                 + f", reference {'clean' if all(r.passed for r in report.reference) else 'NOT clean'} "
                 f"({_budget_text(report.max_examples)} per mutant and seed, device {report.device})")
    return "\n".join(lines)


# -- the self-test of a contract's planted mutants (``Contract.mutants``) -------------------------------------------
class _OnlyKinds:
    """A session whose findings count only when they include one of ``kinds`` (the self-test of a kernel mutant
    that shows only under a buggy sizing, where every overflowing case has the sizing's own findings too)."""

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


def contract_rows(contract, names: Optional[List[str]] = None) -> list:
    """The self-test's rows: ``(row, kernel, sizing, kinds it must be found by, kinds that alone make a case
    fail)``. The reference first (clean under the safe sizing); a kernel mutant that shows only under a buggy
    sizing is searched for its own kinds, beside the reference under the same sizing and filter (clean)."""
    rows = [("reference", "reference", contract.safe_sizing, (), None)]
    for m in contract.mutants:
        if names and m.name not in names:
            continue
        both = bool(m.patch and m.sizing)
        if both:
            rows.append((f"reference under {m.sizing}, {'/'.join(m.detects)} only", "reference", m.sizing,
                         (), m.detects))
        rows.append((m.name, f"mutant:{m.name}" if m.patch else "reference", m.sizing or contract.safe_sizing,
                     m.detects, m.detects if both else None))
    return rows


def contract_self_test(contract, device: str, *, seeds, max_examples: int, names: Optional[List[str]] = None,
                       progress=None, on_row=None, isolate: bool = True) -> dict:
    """Each of ``contract``'s planted mutants fuzzed over ``seeds`` by the engine every run uses
    (``kvfence.engine.loop``, the contract's draws, a checking worker): a kernel mutant under the safe sizing,
    a sizing mutant as the reference kernel under its sizing; on CUDA in captured graphs. Detected when the first
    failure's kinds include one it declares; the first failure as found (the question is whether each bug is
    found: no shrinking, no target phase). The reference must be clean under the safe sizing on every seed.
    ``on_row(report)`` is called after each row with the report so far (``complete`` false), so a run cut
    short keeps the rows it finished. One worker checks every row (each case names its kernel)."""
    from kvfence.engine.plan import RunPlan
    from kvfence.engine import run as pipeline
    from kvfence.engine.loop import damage_kinds, fuzz

    targets = contract_rows(contract, names)
    mode = "graph" if device == "cuda" else "eager"
    base = RunPlan(contract=contract.name, sizing=contract.safe_sizing, device=device, mode=mode,
                   domain="gpu" if device == "cuda" else "cpu", max_examples=max_examples, shrink_seconds=0.0,
                   isolate=isolate)
    rows = []

    def report(complete: bool) -> dict:
        passed = complete and all(r["good"] == r["seeds"] if not r["detects"] else r["good"] >= REQUIRED_RATE * r["seeds"]
                                  for r in rows)
        return {"contract": contract.name, "device": device, "max_examples": max_examples, "seeds": list(seeds),
                "passed": passed, "complete": complete, "rows_planned": len(targets), "rows": rows}

    session = pipeline.checker(base)
    try:
        for name, kernel, sizing, detects, fail_on in targets:
            plan = base.with_(kernel=kernel, sizing=sizing)
            checker = _OnlyKinds(session, fail_on) if fail_on else session
            runs, row_start = [], time.monotonic()
            for s in seeds:
                r = fuzz(checker, pipeline.draws(plan)[0], max_examples=max_examples, seed=s, shrink_seconds=0,
                         targeting=False, contract=contract)
                kinds = damage_kinds(r.findings)
                clean_row = not detects
                ok = (not r.findings) if clean_row else bool(set(kinds) & set(detects))
                runs.append({"seed": s, "clean" if clean_row else "detected": ok, "kinds": kinds,
                             "examples": r.examples, "search_s": r.first_failure_s})
                if progress:
                    progress(f"kvfence: {contract.name} {name} seed {s}: {'ok' if ok else 'NOT OK'} {kinds}")
            good = sum(1 for x in runs if x.get("detected", x.get("clean")))
            rows.append({"name": name, "kernel": kernel, "sizing": sizing, "detects": list(detects),
                         "fail_on": list(fail_on) if fail_on else None, "good": good, "seeds": len(runs),
                         "seconds": round(time.monotonic() - row_start, 1), "runs": runs})
            if on_row is not None:
                on_row(report(False))
    finally:
        if hasattr(session, "close"):
            session.close()
    return report(True)
