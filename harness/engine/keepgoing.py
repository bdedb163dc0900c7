"""``fuzz --keep-going``: a run goes on after its first failure, to its example and time budgets.

Hypothesis ends a test at its first failure (once shrunk). A keep-going run is a sequence of phases,
each an ordinary ``kvfence.engine.loop.fuzz`` call over what is left of the budgets:

* phase 1 is the run without ``--keep-going`` (its seed, its example database);
* each later phase gets a new Hypothesis seed (``phase_seed``) and the failures saved so far as
  ``known`` signatures (``kvfence.engine.loop.failure_signature``: finding kinds + config). While exploring,
  a case failing with a known signature counts as passing (``known_repeats``), so the phase looks for
  something else. Its shrinking stays on the failure it found: a candidate that fails with none of its
  finding kinds counts as passing (a CRASH is never shrunk into a VALUE_MISMATCH elsewhere). When
  shrinking reaches a known signature, the phase ends there (``duplicates``): the same failure found
  again, not worth the rest of its shrink; the signature it was first met under becomes known too;
* a phase that ends with a new signature saves it at once (``on_failure`` writes its case file, before
  the next phase starts) and, for phases after the first, stores its minimal example in the database
  under the run's key, so the next run replays it too.

Later phases read the database but never change it (``read_only``): a stored failure that they
treat as known passes there, and Hypothesis would delete a passing example. The verdict cache, the
shapes and configs seen are shared by all phases, so counts stay those of distinct work.

The run ends when the example budget (``max_examples``, counted over all phases) or ``max_seconds``
is spent, when a phase finds nothing (it used the whole budget left, or Hypothesis exhausted the
domain) or when a signal stops it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional

from kvfence.contract import Checker
from kvfence.engine.findings import Finding
from kvfence.engine.loop import fuzz
from kvfence.engine.result import MAX_STATS, FuzzResult, failure_signature

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase
    from hypothesis.strategies import SearchStrategy

    from kvfence.engine.plan import RunPlan


@dataclass
class Failure:
    """One distinct failure of a keep-going run, shrunk (or as far as shrinking got)."""

    case: Any  # the failing launch (or run of them)
    findings: List[Finding]
    stat: Optional[tuple[Any, ...]]
    phase: int
    hypothesis: Optional[dict[str, Any]] = None
    shrink_cut: bool = False
    interrupted: Optional[str] = None
    #: Where ``on_failure`` saved it (the case file), when it did.
    path: Optional[str] = None

    @property
    def signature(self) -> tuple[Any, ...]:
        return failure_signature(self.case, self.findings)


def phase_seed(seed: Optional[int], phase: int) -> Optional[int]:
    """Phase 0 keeps the run's seed (a keep-going run starts like a plain one); later phases get
    seeds no plain run of a 32-bit ``--seed`` uses."""
    if seed is None or phase == 0:
        return seed
    return seed + (phase << 32)


def read_only(inner: Any) -> Any:
    """A view of the example database ``inner`` whose examples are read (replayed) but never saved,
    moved or deleted. (A function, so that importing this module does not import Hypothesis.)"""
    from hypothesis.database import ExampleDatabase

    class ReadOnlyDatabase(ExampleDatabase):
        def fetch(self, key: bytes) -> Iterable[bytes]:
            found: Iterable[bytes] = inner.fetch(key)
            return found

        def save(self, key: bytes, value: bytes) -> None:
            pass

        def delete(self, key: bytes, value: bytes) -> None:
            pass

        def move(self, src: bytes, dest: bytes, value: bytes) -> None:
            pass

    return ReadOnlyDatabase()


def _absorb(total: FuzzResult, r: FuzzResult, offset_s: float) -> None:
    """Add one phase's counts to the run's (the shared ``carry`` keeps shapes and configs distinct)."""
    for key in ("examples", "generated_cases", "verified_cases", "cached_cases", "shrink_cases",
                "structural_cases", "read_variant_cases", "token_variant_cases", "bulk_cases", "bulk_skipped",
                "known_repeats"):
        setattr(total, key, getattr(total, key) + getattr(r, key))
    total.launches, total.session_stats, total.distinct_configs = r.launches, r.session_stats, r.distinct_configs
    # the shared carry's
    total.structure_keys, total.read_keys, total.config_keys = r.structure_keys, r.read_keys, r.config_keys
    if r.max_utilisation > total.max_utilisation:
        total.max_utilisation, total.max_utilisation_stat = r.max_utilisation, r.max_utilisation_stat
    if r.largest_config and (not total.largest_config or r.largest_config.get("estimated_bytes", 0)
                             > total.largest_config.get("estimated_bytes", 0)):
        total.largest_config = r.largest_config
    for name, count in r.boundaries.items():
        total.boundaries[name] = total.boundaries.get(name, 0) + count
    total.stats.extend(r.stats[:max(0, MAX_STATS - len(total.stats))])
    if total.first_launch_at is None:
        total.first_launch_at = r.first_launch_at
    if not total.first_examples:
        total.first_examples = list(r.first_examples)  # the run's first examples are its first phase's
    if total.first_failure_s is None and r.first_failure_s is not None:
        total.first_failure_text = r.first_failure_text
        total.first_failure_s = offset_s + r.first_failure_s
        total.first_failure_at = r.first_failure_at
        total.examples_to_failure = total.examples - r.examples + (r.examples_to_failure or 0)
    total.shrink_cut = total.shrink_cut or r.shrink_cut
    total.bulk_splice = total.bulk_splice or r.bulk_splice
    total.time_cut = r.time_cut
    total.interrupted = r.interrupted


def fuzz_keep_going(session: Checker, strategy: SearchStrategy[Any], plan: RunPlan, *,
                    database: Optional[ExampleDatabase] = None, database_key: Optional[bytes] = None,
                    on_failure: Optional[Callable[[Failure], Optional[str]]] = None,
                    **fuzz_kwargs: Any) -> FuzzResult:
    """``kvfence.engine.loop.fuzz`` in phases until ``plan``'s budgets are spent (module docstring).

    Returns one ``FuzzResult`` for the whole run: counts summed, ``failures`` every distinct failure in
    the order found, ``case``/``findings`` the first of them. ``on_failure(failure)`` is called as soon
    as a phase ends with a new one and may return the path it was saved under. Each phase runs ``plan``
    with what is left of its budgets and the phase's seed (``plan.shrink_seconds`` is each phase's own shrink
    budget); ``fuzz_kwargs`` go to every phase.
    """
    max_examples, seed, max_seconds = plan.max_examples, plan.seed, plan.max_seconds
    total = FuzzResult()
    known: dict[Any, Any] = {}  # failure signature -> its first Failure
    carry: dict[str, Any] = {}
    duplicates = 0
    start = time.perf_counter()
    phase = 0
    while total.examples < max_examples:
        offset = time.perf_counter() - start
        left_s = None if max_seconds is None else max_seconds - offset
        if left_s is not None and left_s <= 0:
            total.time_cut = True
            break
        db = database if phase == 0 or database is None else read_only(database)
        phase_plan = plan.with_(max_examples=max_examples - total.examples, seed=phase_seed(seed, phase),
                                max_seconds=left_s)
        r = fuzz(session, strategy, phase_plan, database=db, database_key=database_key, known=known, carry=carry,
                 **fuzz_kwargs)
        _absorb(total, r, offset)
        if r.case is not None and r.findings:
            failure = Failure(r.case, r.findings, r.failure_stat, phase, r.hypothesis, r.shrink_cut, r.interrupted)
            if failure.signature in known:
                duplicates += 1
            else:
                known[failure.signature] = failure
                total.failures.append(failure)
                if on_failure is not None:
                    failure.path = on_failure(failure)
                # fuzz refuses a database without its key (ValueError): the key is there whenever the database is
                if phase > 0 and database is not None and database_key is not None and r.choices is not None:
                    database.save(database_key, r.choices)  # replayed first by the next run
        elif r.duplicate_of is not None:
            duplicates += 1
            # The config it was first met in shrinks to a saved failure: later phases pass it too.
            known.setdefault(r.first_signature, known[r.duplicate_of])
        phase += 1
        if r.interrupted or r.time_cut or (r.case is None and r.duplicate_of is None):
            break
    total.elapsed_s = time.perf_counter() - start
    if total.failures:
        first = total.failures[0]
        total.case, total.findings, total.failure_stat, total.hypothesis = (first.case, first.findings, first.stat,
                                                                           first.hypothesis)
    total.keep_going = {"phases": phase, "distinct_failures": len(total.failures), "duplicates": duplicates,
                        "known_repeats": total.known_repeats}
    return total
