"""The fuzz loop: Hypothesis draws cases, the session checks them, a failure is shrunk to a minimal case.

``fuzz(...)`` returns a ``FuzzResult``; the CLI turns it into output, JSON and an exit code. Hypothesis
shrinks on the exception ``FindingsFound``; once ``shrink_seconds`` have passed, new candidate cases
are no longer launched (they count as passing) while cases already seen keep their verdict, so the
final replay of the smallest failure still fails and the run stays deterministic.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Callable, Container, Dict, Iterator, List, Optional, Set, Tuple

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from kvfence.contract import Checker, Contract, Launch
from kvfence.engine import budget, registry
from kvfence.engine import launch as launches
from kvfence.engine.findings import Finding
from kvfence.engine.interrupt import Interrupted, pending, raise_pending
from kvfence.engine.result import (
    EXAMPLE_WORK,
    FIRST_EXAMPLES_KEPT,
    RESTART_KINDS,
    SPLICE_REPLAYED,
    STOP_POLL_S,
    BulkFailure,
    DuplicateFailure,
    FindingsFound,
    FuzzResult,
    RunAborted,
    SpliceMismatch,
    TimeBudgetSpent,
    config_key,
    failure_signature,
    keep_sample,
    read_key,
    structure_key,
)
from kvfence.errors import BadInput

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase
    from hypothesis.strategies import SearchStrategy

    from kvfence.engine.journal import Journal
    from kvfence.engine.plan import RunPlan


def _check_many(session: Checker, cases: List[Launch[Any]], journal: Optional[Journal],
                enough: Callable[[List[Finding]], bool],
                one_at_a_time: bool = False) -> Dict[Launch[Any], List[Finding]]:
    """Verdicts of ``cases`` (one config): in one device round trip when the session can batch them
    (with ``one_at_a_time``, a session that stops early checks them one per message instead).
    Cases checked one at a time (a session without ``check_many``, or a worker's re-runs after a crash,
    ``RemoteSession.check_many``) stop once ``enough(findings)`` is true: the rest get no verdict."""
    batch = getattr(session, "check_many", None)
    if batch is not None and len(cases) > 1:
        if journal is not None:
            journal.begin_many(cases)
        stops_early = getattr(session, "STOPS_EARLY", False)
        out = batch(cases, enough=enough, one_at_a_time=one_at_a_time) if stops_early else batch(cases)
        if journal is not None:
            journal.end()
        return {case: findings for case, findings in zip(cases, out) if findings is not None}
    got: Dict[Launch[Any], List[Finding]] = {}
    for case in cases:
        if journal is not None:
            journal.begin(case)
        got[case] = findings = session.check(case)
        if journal is not None:
            journal.end()
        if enough(findings):
            break
    return got


#: Bulk cases per ``check_many`` round trip at most: an example's Hypothesis-drawn cases go first, on their
#: own, then its bulk in chunks of up to this many, and checking stops at the first chunk holding a failure.
BULK_CHECK_CHUNK = 256
#: Seconds one bulk chunk should take: a chunk holds as many cases as the last round trip's rate checks in
#: that time (at most ``BULK_CHECK_CHUNK``; one on the interpreter), and the time budget is looked at between
#: chunks, so a run whose every case is slow still ends within one chunk of ``max_seconds``.
CHUNK_TARGET_S = 1.0


def _check_chunks(count: int, head: int, per_case_s: Callable[[], Optional[float]]) -> Iterator[Tuple[int, int]]:
    """``(lo, hi)`` slices of an example's ``count`` fresh cases, the first ``head`` (Hypothesis-drawn)
    on their own, then chunks sized by ``per_case_s()`` (the last round trip's seconds per case; None
    before any): ``BULK_CHECK_CHUNK`` when cases are fast, fewer when they are slow."""
    if head:
        yield 0, head
    lo = head
    while lo < count:
        rate = per_case_s()
        size = BULK_CHECK_CHUNK if not rate else max(1, min(BULK_CHECK_CHUNK, int(CHUNK_TARGET_S / rate)))
        yield lo, min(count, lo + size)
        lo += size


def fuzz(session: Checker, strategy: SearchStrategy[Any], plan: RunPlan, *, contract: Optional[Contract[Any]] = None,
         journal: Optional[Journal] = None, database: Optional[ExampleDatabase] = None,
         database_key: Optional[bytes] = None, known: Optional[Container[object]] = None,
         carry: Optional[Dict[str, Any]] = None, progress: Optional[Callable[[FuzzResult], None]] = None,
         progress_every_s: float = 2.0, on_first_failure: Optional[Callable[[FuzzResult], None]] = None,
         stop_requested: Optional[Callable[[], bool]] = None) -> FuzzResult:
    """Run Hypothesis over ``strategy`` (of one contract's cases, or of lists of them) as ``plan``
    (``kvfence.engine.plan.RunPlan``) says: ``plan.max_examples`` examples, or until ``plan.max_seconds`` have
    passed (whichever comes first; the first example is checked whatever the clock says; shrinking has its own
    budget, ``plan.shrink_seconds``), under ``plan.seed``, with the target phase when ``plan.targeting``.
    What a case is, the loop asks the contract's record (``contract``, or the record its first case names:
    ``kvfence.contract.Contract``): its config, structure, need/width, coverage row and edge classes.

    ``session`` is anything with ``check(case) -> List[Finding]`` (and optionally ``check_many``):
    ``kvfence.contracts.draft.session.Session`` (in this process) or ``kvfence.engine.worker.RemoteSession`` (in a
    worker process that may crash or hang).

    ``journal`` (a ``kvfence.engine.journal.Journal``) records the cases in flight around each launch.
    ``database`` (a Hypothesis ``ExampleDatabase``) needs ``database_key`` (``kvfence.engine.campaign.database_key``):
    every kernel shares this one test function, so Hypothesis's default key would mix their examples.
    ``plan.targeting`` turns on Hypothesis's target phase on need/width (hill-climbing toward the buffer
    limit): better at sizing bugs, but its bookkeeping costs about as much as generation itself.
    ``known`` (``failure_signature``s) and ``carry`` (verdict cache, shapes and configs seen, shared by
    the phases of one run) are for ``kvfence.engine.keepgoing``.
    ``progress(result)`` is called at most every ``progress_every_s``, ``on_first_failure(result)`` at the first
    failure, before it is shrunk.
    ``stop_requested()``, asked at most every ``STOP_POLL_S`` while exploring (never while shrinking),
    ends the exploration when true, as the time budget does (``job_failure_cut``): a ``--jobs`` child
    stops once another job has found a failure (``kvfence.engine.jobs``).
    """
    search = _Search(session, plan, contract=contract, journal=journal, known=known, carry=carry,
                     progress=progress, progress_every_s=progress_every_s, on_first_failure=on_first_failure,
                     stop_requested=stop_requested)
    # No shrink budget: the first failure is the answer (Hypothesis's shrinker would still replay
    # thousands of candidates through the strategy, for nothing).
    shrink = [Phase.shrink] if plan.shrink_seconds > 0 else []
    explore = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.target] if plan.targeting else [])
    bulk = search.run(search.hypothesis_test(strategy, explore + shrink, database, database_key))
    if bulk is not None:
        _shrink_bulk_failure(bulk, search, strategy, shrink, database, database_key)
    return search.finish()


class _Search:
    """One ``fuzz`` run: its plan and its caller's wiring, what it found (``result``), and what it has seen (the
    verdicts, shapes and configs, shared through ``carry`` by the phases of a ``--keep-going`` run)."""

    def __init__(self, session: Checker, plan: RunPlan, *, contract: Optional[Contract[Any]],
                 journal: Optional[Journal], known: Optional[Container[object]], carry: Optional[Dict[str, Any]],
                 progress: Optional[Callable[[FuzzResult], None]], progress_every_s: float,
                 on_first_failure: Optional[Callable[[FuzzResult], None]],
                 stop_requested: Optional[Callable[[], bool]]) -> None:
        self.session, self.plan, self.journal, self.known = session, plan, journal, known
        self.progress, self.progress_every_s, self.on_first_failure = progress, progress_every_s, on_first_failure
        self.stop_requested = stop_requested
        self.record = contract  # the contract's record, from the first case when not given
        self.result = result = FuzzResult()
        self.rng = random.Random(0)
        carry = {} if carry is None else carry
        self.verdicts: Dict[Launch[Any], List[Finding]] = carry.setdefault("verdicts", {})
        self.configs_seen: Dict[object, int] = carry.setdefault("configs", {})
        self.shapes: Set[object] = carry.setdefault("shapes", set())
        self.read_shapes: Set[object] = carry.setdefault("read_shapes", set())
        result.structure_keys, result.read_keys = self.shapes, self.read_shapes
        self.config_digests: Dict[object, int] = carry.setdefault("config_digests", {})
        self.first_failure: Optional[float] = None  # perf_counter time of the first failure: shrinking from then
        self.last_progress, self.stop_asked = 0.0, 0.0
        self.largest = 0  # the largest config's memory estimate (the contract's config_bytes; none: never largest)
        self.restarts = False  # the failure being shrunk is a CRASH or HANG (RESTART_KINDS)
        self.splice: Optional[Launch[Any]] = None  # the bulk case the splice replay's first example must be
        self.work_before: Dict[str, float] = {}
        self.last_failure: Optional[Tuple[Launch[Any], List[Finding]]] = None  # the smallest failure so far
        self.start = time.perf_counter()

    def _record(self, case: Launch[Any]) -> Contract[Any]:
        if self.record is None:
            self.record = registry.get(case.contract)
        return self.record

    def body(self, example: Any) -> None:
        """Check one example: launch its unseen cases, record each, raise at its first failure."""
        raise_pending()  # a signal that came while the run was starting: it ends the run here, cleanly
        # An example is one case, or a list of cases sharing a config (kvfence.contracts.draft.strategies.case_runs),
        # the bulk ones (a CaseRun) from bulk_start on.
        cases: List[Launch[Any]] = example if isinstance(example, list) else [example]
        bulk_start: int = getattr(example, "bulk_start", len(cases))
        now = time.perf_counter()
        shrinking = self.first_failure is not None
        self._admit(cases, now, shrinking)
        if bulk_start < len(cases):
            # Shrinking works on the Hypothesis-drawn cases only (the bulk follows from them and shrinks to off).
            cases = cases[:bulk_start] + ([] if shrinking else self._bulk_to_launch(cases, bulk_start))
        head_set = set(cases[:bulk_start]) if bulk_start < len(cases) else None
        launched, checked = self._launch(cases, head_set, now, shrinking)
        if not shrinking and cases and len(self.result.first_examples) < FIRST_EXAMPLES_KEPT:
            self._keep_first_example(cases[0], began=time.time() - (time.perf_counter() - now), checked=len(checked))
        utilisations = self._judge(example, cases, bulk_start, launched, checked, shrinking)
        if self.progress is not None and now - self.last_progress >= self.progress_every_s:
            self.last_progress = now
            self.result.elapsed_s = now - self.start
            self.result.launches = int(self.session.stats.get("launches", self.result.verified_cases))
            self.progress(self.result)
        if self.plan.targeting and utilisations and self.first_failure is None:
            target(max(utilisations), label="need/width")  # once per example: Hypothesis's rule

    def _admit(self, cases: List[Launch[Any]], now: float, shrinking: bool) -> None:
        """Before an example's checks: the splice replay's check, the budgets and the stop request (exploring
        only; each ends the exploration by raising), then the example counted."""
        expect, self.splice = self.splice, None
        if expect is not None and cases != [expect]:
            raise SpliceMismatch()  # the spliced replay is not the bulk case: fuzz() reports it as found
        if shrinking:
            return
        # The first example is always checked: a budget spent before it (start-up on a loaded machine) must not end
        # the run with no verdict at all, which would read as a pass.
        max_seconds = self.plan.max_seconds
        if max_seconds is not None and self.result.examples and now - self.start > max_seconds:
            self.result.time_cut = True
            raise TimeBudgetSpent()
        if self.stop_requested is not None and now - self.stop_asked >= STOP_POLL_S:
            self.stop_asked = now
            if self.stop_requested():
                self.result.job_failure_cut = True
                raise TimeBudgetSpent()
        self.result.examples += 1

    def _bulk_to_launch(self, cases: List[Launch[Any]], bulk_start: int) -> List[Launch[Any]]:
        """The bulk cases of an explored example worth launching: a bulk case whose structure was verified before
        is not launched unless its verdict is cached (a replay keeps its verdict)."""
        rec = self._record(cases[0])
        digest = self._digest(launches.keys(rec, cases[0]).config)
        bulk = []
        for case in cases[bulk_start:]:
            if case in self.verdicts or read_key(rec, digest, case) not in self.read_shapes:
                bulk.append(case)
            else:
                self.result.bulk_skipped += 1
        return bulk

    def _launch(self, cases: List[Launch[Any]], head_set: Optional[Set[Launch[Any]]], now: float,
                shrinking: bool) -> Tuple[Set[Launch[Any]], Dict[Launch[Any], List[Finding]]]:
        """Check the example's cases with no verdict yet; returns those launched and their findings.
        ``head_set``: the Hypothesis-drawn cases of an example with a bulk (None: no bulk)."""
        fresh = [c for c in dict.fromkeys(cases) if c not in self.verdicts]
        first = self.first_failure
        if fresh and shrinking and first is not None and now - first > self.plan.shrink_seconds:
            self.result.shrink_cut = True
            return set(), {}  # shrink budget spent: unseen candidates are not launched (they pass)
        if not fresh:
            return set(), {}
        if self.result.first_launch_at is None:
            self.result.first_launch_at = time.time()
        checked = self._check_fresh(fresh, head_set, shrinking)
        launched = set(checked)
        self.result.verified_cases += len(checked)
        if head_set is not None:
            self.result.bulk_cases += len(launched - head_set)
            # A clean bulk case is not kept (memory: the bulk is most cases): a replay of its example
            # draws it again and skips it, its structure being known; a failing one keeps its verdict.
            self.verdicts.update((c, f) for c, f in checked.items() if f or c in head_set)
        else:
            self.verdicts.update(checked)
        return launched, checked

    def _check_fresh(self, fresh: List[Launch[Any]], head_set: Optional[Set[Launch[Any]]],
                     shrinking: bool) -> Dict[Launch[Any], List[Finding]]:
        """Findings of ``fresh``, the drawn cases first, then the bulk in chunks (``_check_chunks``), up to the
        first chunk holding a failure or the budget's end."""
        head_fresh = sum(1 for c in fresh if c in head_set) if head_set is not None else len(fresh)
        timing: Dict[str, Optional[float]] = {"per_case": None}
        checked: Dict[Launch[Any], List[Finding]] = {}
        for lo, hi in _check_chunks(len(fresh), head_fresh, lambda: timing["per_case"]):
            if lo and not shrinking and self._over_budget(False):
                self.result.time_cut = True  # the rest of the bulk is not launched: the budget holds
                break
            chunk = fresh[lo:hi]
            t0 = time.perf_counter()
            got = _check_many(self.session, chunk, self.journal, lambda findings: self._enough(findings, shrinking),
                              one_at_a_time=shrinking and self.restarts)
            timing["per_case"] = (time.perf_counter() - t0) / len(chunk)
            checked.update(got)
            if self.known is None and any(got.values()):
                # The example fails at its first failing case (``_judge`` raises there): cases
                # after it need no verdict, and a dirty bulk would cost one full re-check per case.
                # (--keep-going may pass a known failure, so it checks every case.)
                break
        return checked

    def _judge(self, example: Any, cases: List[Launch[Any]], bulk_start: int, launched: Set[Launch[Any]],
               checked: Dict[Launch[Any], List[Finding]], shrinking: bool) -> List[float]:
        """Record each case's verdict (fresh or cached) and raise at the first failing one; returns the need/width
        of the explored Hypothesis-drawn cases."""
        utilisations = []
        for i, case in enumerate(cases):
            findings = checked[case] if case in launched else self.verdicts.get(case)
            if findings is None:
                continue  # unseen candidate after the shrink budget: passes
            verified_now = case in launched
            if not verified_now:
                self.result.cached_cases += 1
            if shrinking:
                self.result.shrink_cases += 1
            else:
                u = self._explored(case, findings, verified_now)
                if i < bulk_start:  # the target phase climbs on what its choices decide, not on the bulk
                    utilisations.append(u)
            if findings:
                self._failed(case, findings, example if i >= bulk_start and not shrinking else None)
        return utilisations

    def _over_budget(self, shrinking: bool) -> bool:
        """Whether the budget of the phase running (exploring: ``max_seconds``; shrinking:
        ``shrink_seconds`` from the first failure) is spent."""
        now = time.perf_counter()
        if shrinking:
            return self.first_failure is not None and now - self.first_failure > self.plan.shrink_seconds
        return self.plan.max_seconds is not None and now - self.start > self.plan.max_seconds

    def _enough(self, findings: List[Finding], shrinking: bool) -> bool:
        """Whether an example's cases still unchecked need no verdict: a failure was found (the example
        fails at its first; ``--keep-going`` checks on, as it may pass a known failure), or the phase's
        budget is spent (cases checked one at a time, each a worker restart when every case crashes,
        stop there, so the budget holds within one restart; the cases left pass, as after a cut)."""
        if findings and self.known is None:
            return True
        if self._over_budget(shrinking):
            if shrinking:
                self.result.shrink_cut = True
            else:
                self.result.time_cut = True
            return True
        return False

    def _explored(self, case: Launch[Any], findings: List[Finding], verified_now: bool) -> float:
        """Record one explored case (stats, coverage, largest config); returns its need/width."""
        result = self.result
        result.generated_cases += 1
        rec = self._record(case)
        found = launches.keys(rec, case)
        config = found.config
        digest = self._digest(config)
        shape, reads = structure_key(digest, found.structure), read_key(rec, digest, case)
        if shape not in self.shapes:
            self.shapes.add(shape)
            result.structural_cases += 1
        elif reads not in self.read_shapes:
            result.read_variant_cases += 1
        elif verified_now:
            result.token_variant_cases += 1
        self.read_shapes.add(reads)
        if result.coverage_fields is None:
            result.coverage_fields = launches.coverage_fields(rec, case)
        u: float = launches.utilisation(rec, case)
        stat = keep_sample(result, lambda: launches.coverage_row(rec, case, bool(findings)), self.rng)
        if u > result.max_utilisation:
            result.max_utilisation = u
            result.max_utilisation_stat = stat or launches.coverage_row(rec, case, bool(findings))
        if config not in self.configs_seen:
            self.configs_seen[config] = size = budget.launch_bytes(rec, case)
            if size > self.largest:
                self.largest = size
                result.largest_config = dict(launches.summary(rec, case)["config"], estimated_bytes=size)
        for name in found.edges:
            result.boundaries[name] = result.boundaries.get(name, 0) + 1
        return u

    def _keep_first_example(self, case: Launch[Any], *, began: float, checked: int) -> None:
        """One row of ``result.first_examples``: the example began at epoch ``began``; its check ended now.
        ``work`` is what the checking sessions counted since the row before (``EXAMPLE_WORK``): an example
        that took seconds says whether it compiled, built buffers, captured, or waited on the device."""
        from kvfence.engine.clock import since_start

        rec = self._record(case)
        stats, before = self.session.stats, self.work_before
        work = {k: round(stats.get(k, 0) - before.get(k, 0), 4) for k in EXAMPLE_WORK}
        self.work_before = {k: stats.get(k, 0) for k in EXAMPLE_WORK}
        self.result.first_examples.append({"example": self.result.examples, "began_s": since_start(began),
                                           "checked_s": since_start(time.time()), "cases_checked": checked,
                                           "work": work, "config": launches.summary(rec, case)["config"]})

    def _digest(self, config: object) -> int:
        digest = self.config_digests.get(config)
        if digest is None:
            digest = self.config_digests[config] = config_key(config)
        return digest

    def _failed(self, case: Launch[Any], findings: List[Finding], run: Any = None) -> None:
        """A failing case: the first failure's bookkeeping, then ``FindingsFound`` for Hypothesis to
        shrink, or ``BulkFailure`` when it is a bulk case of the ``CaseRun`` ``run``."""
        if self.known is not None and not self._counts_for_keep_going(self.known, case, findings):
            return
        if self.first_failure is None:
            self._first_failure(case, findings)
        from kvfence.engine.casefile import hypothesis_blob, hypothesis_final

        if hypothesis_final():
            result = self.result
            result.hypothesis = hypothesis_blob()
            if self.known is not None or result.bulk_splice is not None:
                from kvfence.engine.casefile import current_choices

                result.choices = current_choices()
        self.last_failure = (case, findings)  # Hypothesis only tries smaller ones from here
        if run is not None:
            raise BulkFailure(case, findings, run.splice(run.index(case)))
        raise FindingsFound(case, findings)

    def _counts_for_keep_going(self, known: Container[object], case: Launch[Any], findings: List[Finding]) -> bool:
        """``--keep-going`` (``known``: the failures saved): whether this failure is one to report and shrink (False:
        it passes); ``DuplicateFailure`` when shrinking reaches a failure already saved."""
        signature = failure_signature(case, findings)
        if self.first_failure is None and signature in known:
            self.result.known_repeats += 1  # already saved by an earlier phase: passes while exploring
            return False
        if self.first_failure is not None:
            assert self.result.first_signature is not None  # set below when the first failure counted
            if not set(signature[0]) & set(self.result.first_signature[0]):
                return False  # another failure than the one being shrunk: no slipping from one bug to another
        if self.first_failure is not None and signature in known:
            self.result.duplicate_of = signature
            raise DuplicateFailure()
        if self.first_failure is None:
            self.result.first_signature = signature
        return True

    def _first_failure(self, case: Launch[Any], findings: List[Finding]) -> None:
        """The run's first failure: its time and line, said at once (shrinking may take ``--shrink-seconds``)."""
        result = self.result
        self.first_failure = first = time.perf_counter()
        result.first_failure_s = first - self.start
        result.first_failure_at = time.time()
        result.examples_to_failure = result.examples
        result.shrinking = True
        result.first_failure_text = first_failure_line(case, findings)
        self.restarts = any(f.kind in RESTART_KINDS for f in findings)
        if self.on_first_failure is not None:
            self.on_first_failure(result)
        if self.progress is not None:
            result.elapsed_s = first - self.start
            self.progress(result)

    def hypothesis_test(self, strategy: SearchStrategy[Any], phases: List[Phase], db: Optional[ExampleDatabase],
                        key: Optional[bytes]) -> Callable[[], None]:
        """The Hypothesis test of ``strategy`` through ``body``: its phases, database and key."""

        @st.composite
        def aborting(draw: st.DrawFn) -> Any:
            """The strategy's draw, a ``BadInput`` in it ending the run (``RunAborted``) instead of failing the
            example; a draw that is no launch ends it too (``require_launches``)."""
            try:
                drawn = draw(strategy)
            except BadInput as exc:
                raise RunAborted(exc) from None
            require_launches(drawn)
            return drawn

        def checked(drawn: Any) -> None:
            try:
                return self.body(drawn)
            except BadInput as exc:
                raise RunAborted(exc) from None

        test = given(aborting())(checked)
        if self.plan.seed is not None:
            # Before @settings: @seed on its own turns the example database off; the settings below decide.
            test = hyp_seed(self.plan.seed)(test)
        # derandomize off: the run's own seed decides (a profile's derandomize, pytest's ci, would ignore it).
        test = settings(max_examples=self.plan.max_examples, deadline=None, database=db, verbosity=Verbosity.quiet,
                        derandomize=False,
                        report_multiple_bugs=False, print_blob=False, phases=phases,
                        suppress_health_check=list(HealthCheck))(test)
        if db is not None:
            from kvfence.engine.campaign import apply_database_key

            if key is None:
                raise ValueError("fuzz(database=...) needs a database_key (kvfence.engine.campaign.database_key)")
            apply_database_key(test, checked, key)
        return test

    def whose(self) -> str:
        """Whose code may have raised what the search did not expect: the contract's, or a plug-in's."""
        name = self.record.name if self.record is not None else None
        return f"contract {name}'s or a plug-in's code" if name else "a contract's or a plug-in's code"

    def run(self, test: Callable[[], None]) -> Optional[BulkFailure]:
        """Run ``test``; the failure it ends with goes into ``result`` (a bulk one is returned)."""
        result = self.result
        try:
            test()
        except FindingsFound as failure:
            result.case = failure.case
            result.findings = failure.findings
            result.failure_stat = launches.coverage_row(self._record(failure.case), failure.case, True)
        except BulkFailure as failure:
            return failure
        except KeyboardInterrupt as stop:
            self._interrupted(stop)
        except (TimeBudgetSpent, DuplicateFailure, SpliceMismatch):
            pass
        except RunAborted as stop:
            raise stop.error from None
        except SystemExit as exc:  # code's, not the run's: never an exit (0 would read as a pass)
            raise BadInput(f"SystemExit({exc.code!r}) was raised during the search (by {self.whose()}); the run is "
                           "not a verdict") from None
        return None

    def _interrupted(self, stop: KeyboardInterrupt) -> None:
        """A signal ended the search: keep what was checked and the smallest failure so far (not fully shrunk).
        A ``KeyboardInterrupt`` with no signal was raised by code (a contract's method, a plug-in), not the user."""
        if not isinstance(stop, Interrupted) and pending() is None:
            raise BadInput(f"a KeyboardInterrupt was raised while no signal came (by {self.whose()}, during the "
                           f"search): {stop!r}; the run is not a verdict") from None
        result = self.result
        result.interrupted = getattr(stop, "signal_name", None) or "SIGINT"
        if self.last_failure is not None:
            result.case, result.findings = self.last_failure
            result.failure_stat = launches.coverage_row(self._record(result.case), result.case, True)

    def finish(self) -> FuzzResult:
        """The result once the search is over: totals and the sessions' counters."""
        result = self.result
        result.shrinking = False
        if result.case is not None and self.plan.shrink_seconds <= 0:
            result.shrink_cut = True  # no shrink phase ran: the failure is reported as first found
        result.elapsed_s = time.perf_counter() - self.start
        result.distinct_configs = len(self.configs_seen)
        result.config_keys = set(self.config_digests.values())
        result.session_stats = dict(self.session.stats)
        result.launches = int(self.session.stats.get("launches", result.verified_cases))
        return result


#: Sub-key of Hypothesis's secondary corpus (engine ``secondary_key``: ``key + b".secondary"``).
SECONDARY_SUFFIX = b".secondary"
#: The database key of the splice replay when the run has no database.
_SPLICE_KEY = b"kvfence.fuzz.bulk-splice"


def _shrink_bulk_failure(bulk: BulkFailure, search: _Search, strategy: SearchStrategy[Any], shrink: List[Phase],
                         database: Optional[ExampleDatabase], database_key: Optional[bytes]) -> None:
    """The run's first failure was bulk case ``bulk.case``: replay the example spliced down to it (its
    config's choices, one batch, the case's recorded choices, the bulk off) from an in-memory database
    through Hypothesis's reuse phase, which then shrinks it like any failure, and store the minimal
    example in the run's database as Hypothesis would. If the replay is not that case (this Hypothesis's
    internals differ), the failure is reported as found, unshrunk, and ``bulk_splice`` says why."""
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    result = search.result
    reason = None
    if bulk.choices is None:
        reason = "this Hypothesis does not expose an example's choices"
    else:
        try:
            blob = choices_to_bytes(bulk.choices)
        except Exception as exc:  # noqa: BLE001 - an encoding this Hypothesis lacks: reported below
            reason, blob = f"cannot encode the spliced choices: {type(exc).__name__}", None
        if blob is not None:
            memory, key = InMemoryExampleDatabase(), database_key or _SPLICE_KEY
            # The secondary corpus (failing, not yet minimal): one in the primary corpus counts as
            # already shrunk, and Hypothesis would only replay it.
            memory.save(key + SECONDARY_SUFFIX, blob)
            result.bulk_splice = SPLICE_REPLAYED
            search.splice = bulk.case  # the body checks that the first replay is this case
            search.run(search.hypothesis_test(strategy, [Phase.reuse] + shrink, memory, key))
            if result.case is not None and result.findings:
                if database is not None and database_key is not None and result.choices is not None:
                    database.save(database_key, result.choices)
                return
            if result.interrupted:
                return
            reason = "Hypothesis's replay of the spliced example was not the failing bulk case"
    result.bulk_splice = f"the first failure (a bulk case) is reported unshrunk: {reason}"
    result.case, result.findings = bulk.case, bulk.findings
    result.failure_stat = launches.coverage_row(registry.get(bulk.case.contract), bulk.case, True)
    result.shrink_cut = True


def require_launches(example: object) -> None:
    """Every value the loop hands a contract's record is an engine ``Launch`` (``kvfence.contract``): a contract's
    own case type (the draft runner's ``Case``, which ``kvfence.contracts.draft.strategies`` draws) reaching the
    record's ``keys`` or ``need`` would fail deep inside them, on one device's path only. Such a draw ends the run
    at once (``RunAborted``) with a ``TypeError`` naming the strategies that draw launches."""
    first = example[0] if isinstance(example, list) and example else example
    if not isinstance(first, Launch):
        raise RunAborted(TypeError(
            f"fuzz() checks launches (kvfence.contract.Launch), but the strategy drew a {type(first).__module__}."
            f"{type(first).__qualname__}: draw launches (kvfence.strategies.cases() / case_runs() for the draft "
            "kernel, or the contract's cases(domain) through kvfence.engine.run.draws)"))


def first_failure_line(case: Launch[Any], findings: List[Finding]) -> str:
    """One line naming a failure as first found: its finding kinds and its config."""
    return f"{', '.join(damage_kinds(findings))} at {launches.describe(registry.get(case.contract), case)}"


def damage_kinds(findings: List[Finding]) -> List[str]:
    return sorted({f.kind.value for f in findings})
