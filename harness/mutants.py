"""Mutation self-test: does kvfence catch the bugs it exists for?

``kernels/mutants/`` holds small files, each one known bug (its module docstring says which):

* kernel mutants (``KIND = "kernel"``): a ``PATCH``, a list of ``(reference text, mutated text)``
  pairs applied to ``kernels/draft_kv_indices.py`` (each must match exactly once). ``build_kernel``
  writes the mutated module to a per-process scratch folder and it is loaded through the plug-in path
  (``file.py:generate_draft_decode_kv_indices``), exactly like a user's kernel file; run with ``safe``;
* sizing mutants (``KIND = "sizing"``): a policy ``row_width(n, topk, ctx, num_steps)``, run with the
  reference kernel.

Each file's ``PINS`` are ``strategies.configs`` keyword arguments under which its bug shows (e.g.
``topk >= 2`` for a draft-layout bug). ``run_all`` fuzzes every mutant under a fixed example budget and
seed and records whether (and after how many examples) a finding appeared. The reference kernel with
the ``safe`` sizing is fuzzed over the same pinned configs and must stay clean.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

from hypothesis import strategies as st

from harness.errors import require

MUTANTS_DIR = Path(__file__).resolve().parent.parent / "kernels" / "mutants"
REFERENCE_KERNEL = Path(__file__).resolve().parent.parent / "kernels" / "draft_kv_indices.py"
KERNEL_ATTR = "generate_draft_decode_kv_indices"
SIZING_ATTR = "row_width"
KINDS = ("kernel", "sizing")
REFERENCE = "reference"


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # "kernel" or "sizing"
    path: Path
    pins: dict
    bug: str  # first line of the docstring

    kernel_file: Optional[Path] = None  # the built (mutated) kernel module, for kernel mutants

    @property
    def kernel(self) -> str:
        return f"{self.kernel_file}:{KERNEL_ATTR}" if self.kind == "kernel" else REFERENCE

    @property
    def sizing(self) -> str:
        return f"{self.path}:{SIZING_ATTR}" if self.kind == "sizing" else "safe"


@dataclass
class MutantResult:
    name: str
    detected: bool
    examples_to_detection: Optional[int]
    kinds: List[str]
    seconds: float
    examples: int
    bug: str = ""
    kind: str = ""
    headline: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "detected": self.detected,
                "examples_to_detection": self.examples_to_detection, "kinds": self.kinds,
                "seconds": round(self.seconds, 3), "examples": self.examples, "bug": self.bug,
                "first_finding": self.headline}


@dataclass
class SelfTest:
    mutants: List[MutantResult] = field(default_factory=list)
    reference: Optional[MutantResult] = None
    max_examples: int = 0
    #: The reference's example budget (by default twice ``max_examples``: it covers every mutant's pins).
    reference_examples: int = 0
    seed: int = 0
    device: str = ""

    @property
    def passed(self) -> bool:
        return all(m.detected for m in self.mutants) and self.reference is not None and not self.reference.detected

    def to_dict(self) -> dict:
        return {"device": self.device, "max_examples": self.max_examples,
                "reference_examples": self.reference_examples, "seed": self.seed, "passed": self.passed,
                "reference": self.reference.to_dict() if self.reference else None,
                "mutants": [m.to_dict() for m in self.mutants]}


_SCRATCH: List[Path] = []


def build_kernel(name: str, patch) -> Path:
    """Apply ``patch`` to the reference kernel's source and write the mutated module; returns its path.

    The folder is a per-process temporary one (several pytest-xdist workers never share a file).
    """
    require(isinstance(patch, (list, tuple)) and patch and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in patch),
        f"mutant {name}: PATCH must be a non-empty list of (reference text, mutated text) pairs")
    source = REFERENCE_KERNEL.read_text()
    for old, new in patch:
        found = source.count(old)
        require(found == 1, f"mutant {name}: {old.strip()!r} matches {found} places in kernels/draft_kv_indices.py "
                            "(a patch must match exactly once)")
        require(old != new, f"mutant {name}: a patch pair leaves {old.strip()!r} unchanged")
        source = source.replace(old, new)
    if not _SCRATCH:
        import tempfile

        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="kvfence-mutants-")))
    path = _SCRATCH[0] / f"{name}.py"
    path.write_text(f"# kvfence mutant {name!r}: kernels/draft_kv_indices.py with kernels/mutants/{name}.py's PATCH.\n"
                    + source)
    return path


def kernel_spec(name: str, directory: Path = MUTANTS_DIR) -> str:
    """``--kernel`` spec of one kernel mutant (built on the way), e.g. for tests and ``fuzz --kernel``."""
    (mutant,) = discover(directory, names=[name])
    require(mutant.kind == "kernel", f"mutant {name} is a {mutant.kind} mutant, not a kernel")
    return mutant.kernel


def discover(directory: Path = MUTANTS_DIR, names: Optional[List[str]] = None) -> List[Mutant]:
    """Every mutant file in ``directory`` (sorted), or only ``names``; ``BadInput`` on a malformed file.

    Imports each file (a kernel file's ``@triton.jit`` runs now: choose the device first).
    """
    from harness.targets import _load_attr

    paths = sorted(p for p in Path(directory).glob("*.py") if not p.name.startswith("_"))
    if names:
        known = {p.stem: p for p in paths}
        unknown = [n for n in names if n not in known]
        require(not unknown, f"unknown mutant(s) {', '.join(unknown)}: choose from {', '.join(known)}")
        paths = [known[n] for n in names]
    out = []
    for path in paths:
        kind = _load_attr(f"{path}:KIND", "mutant")
        pins = _load_attr(f"{path}:PINS", "mutant")
        require(kind in KINDS, f"mutant {path.name}: KIND must be one of {', '.join(KINDS)}, got {kind!r}")
        require(isinstance(pins, dict), f"mutant {path.name}: PINS must be a dict of strategies.configs arguments")
        doc = (_load_attr(f"{path}:__doc__", "mutant") or "").strip()
        require(doc, f"mutant {path.name} has no docstring stating its bug")
        kernel_file = build_kernel(path.stem, _load_attr(f"{path}:PATCH", "mutant")) if kind == "kernel" else None
        out.append(Mutant(path.stem, kind, path, dict(pins), doc.splitlines()[0], kernel_file))
    return out


def _strategy(mutant: Mutant, kernel: str, sizing: str):
    from strategies import cases, configs

    return cases(configs(sizing=sizing, **mutant.pins), kernel=kernel)


def _run(name: str, session, strategy, *, max_examples: int, seed: int, kind: str = "", bug: str = "") -> MutantResult:
    from harness.fuzz import damage_kinds, fuzz

    start = time.perf_counter()
    # No shrinking budget: the first failing example is the detection; its findings are reported.
    result = fuzz(session, strategy, max_examples=max_examples, seed=seed, shrink_seconds=0.0)
    detected = bool(result.findings)
    return MutantResult(name, detected, result.examples if detected else None,
                        damage_kinds(result.findings) if detected else [], time.perf_counter() - start,
                        result.examples, bug, kind, result.findings[0].headline() if detected else "")


def run_all(device: str, *, max_examples: int = 30, seed: int = 0, names: Optional[List[str]] = None,
            reference_examples: Optional[int] = None, audit: Optional[bool] = None,
            progress: Optional[Callable[[MutantResult], None]] = None, directory: Path = MUTANTS_DIR) -> SelfTest:
    """Fuzz every mutant (``max_examples`` each), then the reference over the union of their pins."""
    from harness.session import Session
    from harness.targets import resolve_sizing

    require(max_examples >= 1, f"max_examples must be positive, got {max_examples}")
    mutants = discover(directory, names=names)
    require(mutants, f"no mutant files in {directory}")
    report = SelfTest(max_examples=max_examples, seed=seed, device=device)
    reference = Session(device, REFERENCE, audit=audit)
    for m in mutants:
        resolve_sizing(m.sizing)  # a broken sizing file is bad input before anything runs
        session = reference if m.kind == "sizing" else Session(device, m.kernel, audit=audit)
        result = _run(m.name, session, _strategy(m, m.kernel, m.sizing), max_examples=max_examples, seed=seed,
                      kind=m.kind, bug=m.bug)
        report.mutants.append(result)
        if progress is not None:
            progress(result)
    union = st.one_of([_strategy(m, REFERENCE, "safe") for m in mutants])
    budget = reference_examples if reference_examples is not None else max_examples * 2
    report.reference_examples = budget
    report.reference = _run(REFERENCE, reference, union, max_examples=budget, seed=seed, kind="kernel",
                            bug="the reference kernel with the safe sizing (must stay clean)")
    if progress is not None:
        progress(report.reference)
    return report


def verdict(r: MutantResult) -> str:
    """What a result means: a mutant should be detected, the reference should stay clean."""
    if r.name == REFERENCE:
        return "FINDINGS (unexpected)" if r.detected else "clean (expected)"
    return "detected" if r.detected else "NOT detected"


def examples_text(r: MutantResult, budget: int) -> str:
    """``examples checked/budget``: a detection stops at the failing example, a clean run uses the budget."""
    return f"{r.examples_to_detection if r.detected else r.examples}/{budget}"


def format_table(report: SelfTest) -> str:
    rows = [("mutant", "kind", "verdict", "examples/budget", "finding kinds", "seconds")]
    for r in report.mutants + ([report.reference] if report.reference else []):
        budget = report.reference_examples if r.name == REFERENCE else report.max_examples
        rows.append((r.name, r.kind, verdict(r), examples_text(r, budget), ", ".join(r.kinds) or "-",
                     f"{r.seconds:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    found = sum(r.detected for r in report.mutants)
    ref = report.reference
    ref_text = (f"reference clean in {ref.examples} examples" if ref and not ref.detected
                else "reference NOT clean" if ref else "reference not run")
    lines.append(f"{'PASS' if report.passed else 'FAIL'}: {found}/{len(report.mutants)} mutants detected "
                 f"(budget {report.max_examples} examples each), {ref_text} "
                 f"(budget {report.reference_examples}); seed {report.seed}, device {report.device}")
    return "\n".join(lines)
