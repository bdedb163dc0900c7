"""The fuzz loop: Hypothesis draws cases, the session checks them, a failure is shrunk to a minimal case.

``fuzz(...)`` returns a ``FuzzResult``; the CLI turns it into output, JSON and an exit code. Hypothesis
shrinks on the exception ``FindingsFound``; once ``shrink_seconds`` have passed, new candidate cases
are no longer launched (they count as passing) while cases already seen keep their verdict, so the
final replay of the smallest failure still fails and the run stays deterministic.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Dict, List, Optional

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from kvfence.contract import Launch
from kvfence.engine import launch as launches
from kvfence.engine import registry
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


def _check_many(session, cases: list, journal, enough: Callable[[List[Finding]], bool],
                one_at_a_time: bool = False) -> dict:
    """Verdicts of ``cases`` (one config): in one device round trip when the session can batch them
    (with ``one_at_a_time``, a session that stops early checks them one per message instead).
    Cases checked one at a time (a session without ``check_many``, or a worker's re-runs after a crash,
    ``RemoteSession.check_many``) stop once ``enough(findings)`` is true: the rest get no verdict."""
    batch = getattr(session, "check_many", None)
    if batch is not None and len(cases) > 1:
        if journal is not None:
            journal.begin_many(cases)
        if getattr(session, "STOPS_EARLY", False):
            out = batch(cases, enough=enough, one_at_a_time=one_at_a_time)
        else:
            out = batch(cases)
        if journal is not None:
            journal.end()
        return {case: findings for case, findings in zip(cases, out) if findings is not None}
    got = {}
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


def _check_chunks(count: int, head: int, per_case_s: Callable[[], Optional[float]]):
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


def fuzz(session, strategy, *, max_examples: int, seed: Optional[int] = None,
         shrink_seconds: float = 60.0, progress: Optional[Callable[[FuzzResult], None]] = None,
         progress_every_s: float = 2.0, database=None, database_key: Optional[bytes] = None, journal=None,
         targeting: bool = True, max_seconds: Optional[float] = None, known=None,
         carry: Optional[dict] = None, on_first_failure: Optional[Callable[[FuzzResult], None]] = None,
         stop_requested: Optional[Callable[[], bool]] = None, contract=None) -> FuzzResult:
    """Run Hypothesis over ``strategy`` (of one contract's cases, or of lists of them) for ``max_examples``
    examples, or until ``max_seconds`` have passed (whichever comes first; the first example is checked whatever
    the clock says; shrinking has its own budget).
    What a case is, the loop asks the contract's record (``contract``, or the record its first case names:
    ``kvfence.contract.Contract``): its config, structure, need/width, coverage row and edge classes.

    ``session`` is anything with ``check(case) -> List[Finding]`` (and optionally ``check_many``):
    ``kvfence.contracts.draft.session.Session`` (in this process) or ``kvfence.engine.worker.RemoteSession`` (in a
    worker process that may crash or hang).

    ``journal`` (a ``kvfence.engine.journal.Journal``) records the cases in flight around each launch.
    ``database`` (a Hypothesis ``ExampleDatabase``) needs ``database_key`` (``kvfence.engine.campaign.database_key``):
    every kernel shares this one test function, so Hypothesis's default key would mix their examples.
    ``targeting`` turns on Hypothesis's target phase on need/width (hill-climbing toward the buffer
    limit): better at sizing bugs, but its bookkeeping costs about as much as generation itself.
    ``known`` (``failure_signature``s) and ``carry`` (verdict cache, shapes and configs seen, shared by
    the phases of one run) are for ``kvfence.engine.keepgoing``.
    ``stop_requested()``, asked at most every ``STOP_POLL_S`` while exploring (never while shrinking),
    ends the exploration when true, as the time budget does (``job_failure_cut``): a ``--jobs`` child
    stops once another job has found a failure (``kvfence.engine.jobs``).
    """
    from kvfence.engine.casefile import hypothesis_blob, hypothesis_final

    result = FuzzResult()
    rng = random.Random(0)
    carry = {} if carry is None else carry
    verdicts: Dict[object, List[Finding]] = carry.setdefault("verdicts", {})
    configs_seen: Dict[object, int] = carry.setdefault("configs", {})
    shapes = carry.setdefault("shapes", set())
    read_shapes = carry.setdefault("read_shapes", set())
    result.structure_keys, result.read_keys = shapes, read_shapes
    config_digests: Dict[object, int] = carry.setdefault("config_digests", {})
    # "largest": a config's memory estimate (the contract's config_bytes; one that estimates none is never largest)
    # "restarts": the failure being shrunk is a CRASH or HANG (RESTART_KINDS)
    state = {"first_failure": None, "last_progress": 0.0, "largest": 0, "stop_asked": 0.0, "restarts": False}
    start = time.perf_counter()
    record = [contract]  # the contract's record, from the first case when not given

    def _record(case):
        if record[0] is None:
            record[0] = registry.get(case.contract)
        return record[0]

    def body(example):
        raise_pending()  # a signal that came while the run was starting: it ends the run here, cleanly
        # An example is one case, or a list of cases sharing a config (kvfence.contracts.draft.strategies.case_runs),
        # the bulk ones (a CaseRun) from bulk_start on.
        cases = example if isinstance(example, list) else [example]
        bulk_start = getattr(example, "bulk_start", len(cases))
        now = time.perf_counter()
        shrinking = state["first_failure"] is not None
        expect = state.pop("splice", None)
        if expect is not None and cases != [expect]:
            raise SpliceMismatch()  # the spliced replay is not the bulk case: fuzz() reports it as found
        # The first example is always checked: a budget spent before it (start-up on a loaded machine) must not end
        # the run with no verdict at all, which would read as a pass.
        if not shrinking and max_seconds is not None and result.examples and now - start > max_seconds:
            result.time_cut = True
            raise TimeBudgetSpent()
        if not shrinking and stop_requested is not None and now - state["stop_asked"] >= STOP_POLL_S:
            state["stop_asked"] = now
            if stop_requested():
                result.job_failure_cut = True
                raise TimeBudgetSpent()
        if not shrinking:
            result.examples += 1
        if bulk_start < len(cases):
            # Shrinking works on the Hypothesis-drawn cases only (the bulk follows from them and shrinks to
            # off). Exploring, a bulk case whose structure was verified before is not launched unless its
            # verdict is cached (a replay keeps its verdict).
            bulk = []
            if not shrinking:
                rec = _record(cases[0])
                digest = _digest(launches.keys(rec, cases[0]).config)
                for case in cases[bulk_start:]:
                    if case in verdicts or read_key(rec, digest, case) not in read_shapes:
                        bulk.append(case)
                    else:
                        result.bulk_skipped += 1
            cases = cases[:bulk_start] + bulk
        fresh = [c for c in dict.fromkeys(cases) if c not in verdicts]
        head_set = set(cases[:bulk_start]) if bulk_start < len(cases) else None
        launched = set(fresh)
        if fresh and shrinking and now - state["first_failure"] > shrink_seconds:
            result.shrink_cut = True
            fresh, launched = [], set()  # shrink budget spent: unseen candidates are not launched (they pass)
        checked = {}
        if fresh:
            if result.first_launch_at is None:
                result.first_launch_at = time.time()
            head_fresh = sum(1 for c in fresh if c in head_set) if bulk_start < len(cases) else len(fresh)
            timing = {"per_case": None}
            for lo, hi in _check_chunks(len(fresh), head_fresh, lambda: timing["per_case"]):
                if lo and not shrinking and _over_budget(False):
                    result.time_cut = True  # the rest of the bulk is not launched: the budget holds
                    break
                chunk = fresh[lo:hi]
                t0 = time.perf_counter()
                got = _check_many(session, chunk, journal, lambda findings: _enough(findings, shrinking),
                                  one_at_a_time=shrinking and state["restarts"])
                timing["per_case"] = (time.perf_counter() - t0) / len(chunk)
                checked.update(got)
                if known is None and any(got.values()):
                    # The example fails at its first failing case (the loop below raises there): cases
                    # after it need no verdict, and a dirty bulk would cost one full re-check per case.
                    # (--keep-going may pass a known failure, so it checks every case.)
                    break
            launched = set(checked)
            result.verified_cases += len(checked)
            if bulk_start < len(cases):
                result.bulk_cases += len(launched - head_set)
                # A clean bulk case is not kept (memory: the bulk is most cases): a replay of its example
                # draws it again and skips it, its structure being known; a failing one keeps its verdict.
                verdicts.update((c, f) for c, f in checked.items() if f or c in head_set)
            else:
                verdicts.update(checked)
        if not shrinking and cases and len(result.first_examples) < FIRST_EXAMPLES_KEPT:
            _keep_first_example(cases[0], began=time.time() - (time.perf_counter() - now), checked=len(checked))
        utilisations = []
        for i, case in enumerate(cases):
            findings = checked[case] if case in launched else verdicts.get(case)
            if findings is None:
                continue  # unseen candidate after the shrink budget: passes
            verified_now = case in launched
            if not verified_now:
                result.cached_cases += 1
            if shrinking:
                result.shrink_cases += 1
            else:
                u = _explored(case, findings, verified_now)
                if i < bulk_start:  # the target phase climbs on what its choices decide, not on the bulk
                    utilisations.append(u)
            if findings:
                _failed(case, findings, example if i >= bulk_start and not shrinking else None)
        if progress is not None and now - state["last_progress"] >= progress_every_s:
            state["last_progress"] = now
            result.elapsed_s = now - start
            result.launches = session.stats.get("launches", result.verified_cases)
            progress(result)
        if targeting and utilisations and state["first_failure"] is None:
            target(max(utilisations), label="need/width")  # once per example: Hypothesis's rule

    def _over_budget(shrinking: bool) -> bool:
        """Whether the budget of the phase running (exploring: ``max_seconds``; shrinking:
        ``shrink_seconds`` from the first failure) is spent."""
        now = time.perf_counter()
        if shrinking:
            return now - state["first_failure"] > shrink_seconds
        return max_seconds is not None and now - start > max_seconds

    def _enough(findings, shrinking: bool) -> bool:
        """Whether an example's cases still unchecked need no verdict: a failure was found (the example
        fails at its first; ``--keep-going`` checks on, as it may pass a known failure), or the phase's
        budget is spent (cases checked one at a time, each a worker restart when every case crashes,
        stop there, so the budget holds within one restart; the cases left pass, as after a cut)."""
        if findings and known is None:
            return True
        if _over_budget(shrinking):
            if shrinking:
                result.shrink_cut = True
            else:
                result.time_cut = True
            return True
        return False

    def _explored(case, findings, verified_now: bool) -> float:
        """Record one explored case (stats, coverage, largest config); returns its need/width."""
        result.generated_cases += 1
        rec = _record(case)
        found = launches.keys(rec, case)
        config = found.config
        digest = _digest(config)
        shape, reads = structure_key(digest, found.structure), read_key(rec, digest, case)
        if shape not in shapes:
            shapes.add(shape)
            result.structural_cases += 1
        elif reads not in read_shapes:
            result.read_variant_cases += 1
        elif verified_now:
            result.token_variant_cases += 1
        read_shapes.add(reads)
        if result.coverage_fields is None:
            result.coverage_fields = launches.coverage_fields(rec, case)
        u = launches.utilisation(rec, case)
        stat = keep_sample(result, lambda: launches.coverage_row(rec, case, bool(findings)), rng)
        if u > result.max_utilisation:
            result.max_utilisation = u
            result.max_utilisation_stat = stat or launches.coverage_row(rec, case, bool(findings))
        if config not in configs_seen:
            configs_seen[config] = size = launches.table_bytes(rec, case)
            if size > state["largest"]:
                state["largest"] = size
                result.largest_config = dict(launches.summary(rec, case)["config"], estimated_bytes=size)
        for name in found.edges:
            result.boundaries[name] = result.boundaries.get(name, 0) + 1
        return u

    def _keep_first_example(case, *, began: float, checked: int) -> None:
        """One row of ``result.first_examples``: the example began at epoch ``began``; its check ended now.
        ``work`` is what the checking sessions counted since the row before (``EXAMPLE_WORK``): an example
        that took seconds says whether it compiled, built buffers, captured, or waited on the device."""
        from kvfence.engine.clock import since_start

        rec = _record(case)
        stats = session.stats
        before = state.setdefault("work_before", {})
        work = {k: round(stats.get(k, 0) - before.get(k, 0), 4) for k in EXAMPLE_WORK}
        state["work_before"] = {k: stats.get(k, 0) for k in EXAMPLE_WORK}
        result.first_examples.append({"example": result.examples, "began_s": since_start(began),
                                      "checked_s": since_start(time.time()), "cases_checked": checked,
                                      "work": work, "config": launches.summary(rec, case)["config"]})

    def _digest(config) -> int:
        digest = config_digests.get(config)
        if digest is None:
            digest = config_digests[config] = config_key(config)
        return digest

    def _failed(case, findings, run=None) -> None:
        """A failing case: the first failure's bookkeeping, then ``FindingsFound`` for Hypothesis to
        shrink, or ``BulkFailure`` when it is a bulk case of the ``CaseRun`` ``run``."""
        if known is not None:  # --keep-going (kvfence.engine.keepgoing)
            signature = failure_signature(case, findings)
            if state["first_failure"] is None and signature in known:
                result.known_repeats += 1  # already saved by an earlier phase: passes while exploring
                return
            if state["first_failure"] is not None and not set(signature[0]) & set(result.first_signature[0]):
                return  # another failure than the one being shrunk: no slipping from one bug to another
            if state["first_failure"] is not None and signature in known:
                result.duplicate_of = signature
                raise DuplicateFailure()
            if state["first_failure"] is None:
                result.first_signature = signature
        if state["first_failure"] is None:
            state["first_failure"] = time.perf_counter()
            result.first_failure_s = state["first_failure"] - start
            result.first_failure_at = time.time()
            result.examples_to_failure = result.examples
            result.shrinking = True
            result.first_failure_text = first_failure_line(case, findings)
            state["restarts"] = any(f.kind in RESTART_KINDS for f in findings)
            # The verdict is known now: say so before shrinking (which may take --shrink-seconds).
            if on_first_failure is not None:
                on_first_failure(result)
            if progress is not None:
                result.elapsed_s = state["first_failure"] - start
                progress(result)
        if hypothesis_final():
            result.hypothesis = hypothesis_blob()
            if known is not None or result.bulk_splice is not None:
                from kvfence.engine.casefile import current_choices

                result.choices = current_choices()
        state["last_failure"] = (case, findings)  # Hypothesis only tries smaller ones from here
        if run is not None:
            raise BulkFailure(case, findings, run.splice(run.index(case)))
        raise FindingsFound(case, findings)

    @st.composite
    def aborting(draw):
        """The strategy's draw, a ``BadInput`` in it ending the run (``RunAborted``) instead of failing the example;
        a draw that is no launch ends it too (``require_launches``)."""
        try:
            drawn = draw(strategy)
        except BadInput as exc:
            raise RunAborted(exc) from None
        require_launches(drawn)
        return drawn

    def checked(drawn):
        try:
            return body(drawn)
        except BadInput as exc:
            raise RunAborted(exc) from None

    def hypothesis_test(phases, db, key):
        test = given(aborting())(checked)
        if seed is not None:
            # Before @settings: @seed on its own turns the example database off; the settings below decide.
            test = hyp_seed(seed)(test)
        # derandomize off: the run's own seed decides (a profile's derandomize, pytest's ci, would ignore it).
        test = settings(max_examples=max_examples, deadline=None, database=db, verbosity=Verbosity.quiet,
                        derandomize=False,
                        report_multiple_bugs=False, print_blob=False, phases=phases,
                        suppress_health_check=list(HealthCheck))(test)
        if db is not None:
            from kvfence.engine.campaign import apply_database_key

            if key is None:
                raise ValueError("fuzz(database=...) needs a database_key (kvfence.engine.campaign.database_key)")
            apply_database_key(test, checked, key)
        return test

    def whose() -> str:
        """Whose code may have raised what the search did not expect: the contract's, or a plug-in's."""
        name = record[0].name if record[0] is not None else None
        return f"contract {name}'s or a plug-in's code" if name else "a contract's or a plug-in's code"

    def run(test) -> Optional[BulkFailure]:
        """Run ``test``; the failure it ends with goes into ``result`` (a bulk one is returned)."""
        try:
            test()
        except FindingsFound as failure:
            result.case = failure.case
            result.findings = failure.findings
            result.failure_stat = launches.coverage_row(_record(failure.case), failure.case, True)
        except BulkFailure as failure:
            return failure
        except KeyboardInterrupt as stop:
            if not isinstance(stop, Interrupted) and pending() is None:
                # No signal came: code raised it (a contract's method, a plug-in), not the user.
                raise BadInput(f"a KeyboardInterrupt was raised while no signal came (by {whose()}, during the "
                               f"search): {stop!r}; the run is not a verdict") from None
            # A signal: keep what was checked and the smallest failure so far (not fully shrunk).
            result.interrupted = getattr(stop, "signal_name", None) or "SIGINT"
            if state.get("last_failure") is not None:
                result.case, result.findings = state["last_failure"]
                result.failure_stat = launches.coverage_row(_record(result.case), result.case, True)
        except (TimeBudgetSpent, DuplicateFailure, SpliceMismatch):
            pass
        except RunAborted as stop:
            raise stop.error from None
        except SystemExit as exc:  # code's, not the run's: never an exit (0 would read as a pass)
            raise BadInput(f"SystemExit({exc.code!r}) was raised during the search (by {whose()}); the run is not "
                           "a verdict") from None
        return None

    # No shrink budget: the first failure is the answer (Hypothesis's shrinker would still replay
    # thousands of candidates through the strategy, for nothing).
    shrink = [Phase.shrink] if shrink_seconds > 0 else []
    bulk = run(hypothesis_test([Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.target] if targeting else [])
                               + shrink, database, database_key))
    if bulk is not None:
        _shrink_bulk_failure(bulk, hypothesis_test, run, shrink, result, state, database, database_key)
    result.shrinking = False
    if result.case is not None and shrink_seconds <= 0:
        result.shrink_cut = True  # no shrink phase ran: the failure is reported as first found
    result.elapsed_s = time.perf_counter() - start
    result.distinct_configs = len(configs_seen)
    result.config_keys = set(config_digests.values())
    result.session_stats = dict(session.stats)
    result.launches = session.stats.get("launches", result.verified_cases)
    return result


#: Sub-key of Hypothesis's secondary corpus (engine ``secondary_key``: ``key + b".secondary"``).
SECONDARY_SUFFIX = b".secondary"
#: The database key of the splice replay when the run has no database.
_SPLICE_KEY = b"kvfence.fuzz.bulk-splice"


def _shrink_bulk_failure(bulk: BulkFailure, hypothesis_test, run, shrink: list, result: FuzzResult, state: dict,
                         database, database_key) -> None:
    """The run's first failure was bulk case ``bulk.case``: replay the example spliced down to it (its
    config's choices, one batch, the case's recorded choices, the bulk off) from an in-memory database
    through Hypothesis's reuse phase, which then shrinks it like any failure, and store the minimal
    example in the run's database as Hypothesis would. If the replay is not that case (this Hypothesis's
    internals differ), the failure is reported as found, unshrunk, and ``bulk_splice`` says why."""
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

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
            state["splice"] = bulk.case  # the body checks that the first replay is this case
            run(hypothesis_test([Phase.reuse] + shrink, memory, key))
            if result.case is not None and result.findings:
                if database is not None and result.choices is not None:
                    database.save(database_key, result.choices)
                return
            if result.interrupted:
                return
            reason = "Hypothesis's replay of the spliced example was not the failing bulk case"
    result.bulk_splice = f"the first failure (a bulk case) is reported unshrunk: {reason}"
    result.case, result.findings = bulk.case, bulk.findings
    result.failure_stat = launches.coverage_row(registry.get(bulk.case.contract), bulk.case, True)
    result.shrink_cut = True


def require_launches(example) -> None:
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


def first_failure_line(case, findings: List[Finding]) -> str:
    """One line naming a failure as first found: its finding kinds and its config."""
    return f"{', '.join(damage_kinds(findings))} at {launches.describe(registry.get(case.contract), case)}"


def damage_kinds(findings: List[Finding]) -> List[str]:
    return sorted({f.kind.value for f in findings})
