"""The fuzz loop: Hypothesis draws cases, the session checks them, a failure is shrunk to a minimal case.

``fuzz(...)`` returns a ``FuzzResult``; the CLI turns it into output, JSON and an exit code. Hypothesis
shrinks on the exception ``FindingsFound``; once ``shrink_seconds`` have passed, new candidate cases
are no longer launched (they count as passing) while cases already seen keep their verdict, so the
final replay of the smallest failure still fails and the run stays deterministic.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings, target

from kvfence import contract as contracts
from kvfence.engine.casefile import format_failure
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.interrupt import raise_pending


class FindingsFound(AssertionError):
    """Raised inside the Hypothesis test when a case has findings; carries the case and findings."""

    def __init__(self, case, findings: List[Finding]):
        self.case = case
        self.findings = findings
        super().__init__(format_failure(case, findings))


#: Example stats kept per run (a uniform reservoir sample beyond this), so long GPU runs stay small.
MAX_STATS = 20000
#: Explored examples whose timing and config a run keeps (``FuzzResult.first_examples``): where a slow first
#: verdict spent its time.
FIRST_EXAMPLES_KEPT = 8
#: The ``Session.stats`` counters a kept first example records the change of (``first_examples[].work``):
#: kernel variants first launched and the seconds warming them up (compiling), configs built (buffers) and
#: their seconds, graph captures and their seconds, launches and check_many round trips.
EXAMPLE_WORK = ("compiles", "compile_s", "runners", "runner_s", "captures", "capture_s", "launches", "batches")


class DuplicateFailure(BaseException):
    """Raised inside the Hypothesis test when, with ``known`` failures (``--keep-going``), shrinking
    reaches one already saved: the phase ends there instead of shrinking a failure it already has."""


def failure_signature(case, findings: List[Finding]) -> tuple:
    """What makes two failures the same for ``--keep-going``: their finding kinds and config (the contract's
    ``config_of``)."""
    return tuple(sorted({f.kind.value for f in findings})), contracts.of(case).config_of(case)


class BulkFailure(BaseException):
    """Raised inside the Hypothesis test when the run's first failure is a bulk case of a
    ``kvfence.contracts.draft.strategies.CaseRun``: ``fuzz`` then replays ``choices`` (the example spliced down to that
    case) through Hypothesis, which shrinks it as any failure."""

    def __init__(self, case, findings: List[Finding], choices: Optional[tuple]):
        self.case, self.findings, self.choices = case, findings, choices
        super().__init__(format_failure(case, findings))


class SpliceMismatch(BaseException):
    """Raised inside the splice replay when Hypothesis's replay of the spliced choices is not the bulk
    case (a Hypothesis whose internals differ): the failure is then reported as found."""


#: What ``FuzzResult.bulk_splice`` says when the spliced replay reproduced the bulk failure.
SPLICE_REPLAYED = "replayed"


#: Seconds between two calls of ``fuzz(stop_requested=)`` (a file's existence, asked per example otherwise).
STOP_POLL_S = 0.05


class TimeBudgetSpent(BaseException):
    """Raised inside the Hypothesis test when ``max_seconds`` have passed before any failure (or
    ``stop_requested`` said so).

    A ``BaseException``: Hypothesis lets it through (it is not a failure to shrink), and ``fuzz`` ends
    the run cleanly with what was checked so far.
    """


@dataclass
class FuzzResult:
    """What one run did. The counts use one vocabulary everywhere (progress, summary, table, JSON):

    * ``examples``: Hypothesis examples explored (each holds one case, or several of one config);
    * ``generated_cases``: cases drawn while exploring, repeats included;
    * ``verified_cases``: distinct cases launched and verified (exploring and shrinking);
    * ``cached_cases``: repeats answered from the verdict cache, never launched again;
    * ``shrink_cases``: cases checked while shrinking a failure (verified or cached);
    * ``launches``: kernel launches (a dirty case on the device path is launched twice);
    * ``structural_cases``: explored cases distinct in what changes where the kernel writes (the
      contract's ``structure_of``; the draft's: config and lengths, and so positions): the kernel makes
      the same stores at the same addresses for two cases of one structure, only the values copied differ;
    * ``read_variant_cases``: explored cases of a structure seen before that read other input elements
      (the contract's ``read_variant_of``; the draft's pool rows): counted apart, never in a rate called
      structural;
    * ``token_variant_cases``: explored cases verified although their structure and reads had been
      verified before (another token table only): counted apart, never in a rate called distinct;
    * ``bulk_cases``: verified cases that came from the fast generator (``case_runs(bulk=N)``), part of
      ``verified_cases``;
    * ``bulk_skipped``: bulk cases not launched because the run had already verified their structure
      and reads (they would only be token variants); not part of ``generated_cases``.

    ``cases_per_s`` is ``verified_cases / elapsed_s``: a rate only of work really done;
    ``structural_cases_per_s`` (``structural_cases / elapsed_s``) is the rate of new coverage, beside
    ``examples_per_s`` and ``distinct_configs_per_s``.
    ``structure_keys`` / ``read_keys`` / ``config_keys`` are the digests behind ``structural_cases``,
    ``read_variant_cases`` (``read_keys`` less ``structure_keys``: a new structure is a new read key too)
    and ``distinct_configs`` (``structure_key``), stable across processes, so a merge of several jobs
    counts what is distinct across all of them (``kvfence.engine.summary.merge``).
    """

    examples: int = 0
    generated_cases: int = 0
    verified_cases: int = 0
    cached_cases: int = 0
    shrink_cases: int = 0
    launches: int = 0
    structural_cases: int = 0
    read_variant_cases: int = 0
    token_variant_cases: int = 0
    bulk_cases: int = 0
    bulk_skipped: int = 0
    #: None when the first failure was a Hypothesis-drawn case; ``SPLICE_REPLAYED`` when it was a bulk
    #: case and Hypothesis replayed (and shrank) the example spliced down to it; otherwise the one line
    #: saying why the bulk failure is reported as found, unshrunk.
    bulk_splice: Optional[str] = None
    elapsed_s: float = 0.0
    case: Optional[object] = None
    findings: List[Finding] = field(default_factory=list)
    max_utilisation: float = 0.0
    #: The case of ``max_utilisation`` (need/width), so the report can name it.
    max_utilisation_stat: Optional[tuple] = None
    shrink_cut: bool = False
    shrinking: bool = False
    #: True when ``max_seconds`` ended the run before ``max_examples``.
    time_cut: bool = False
    #: True when ``stop_requested`` ended the exploration (``--jobs``: another job found a failure).
    job_failure_cut: bool = False
    #: Seconds from the start to the first failing case, and the examples it took (before shrinking).
    first_failure_s: Optional[float] = None
    examples_to_failure: Optional[int] = None
    #: Wall-clock time (epoch seconds) of the first failing case: ``--jobs`` parents compare jobs by it.
    first_failure_at: Optional[float] = None
    #: Wall-clock time (epoch seconds) when the first cases went to the session (the summary's ``first_launch_s``).
    first_launch_at: Optional[float] = None
    #: The first failure as found (before shrinking), one line: what the run announces at once.
    first_failure_text: Optional[str] = None
    #: The first ``FIRST_EXAMPLES_KEPT`` explored examples: when each began and its check ended (seconds from the
    #: command's start), the cases it checked and its config (the contract's ``config_record``).
    first_examples: List[dict] = field(default_factory=list)
    #: Per-example stats (a reservoir sample of at most ``MAX_STATS``), and the shrunk failure's stat.
    stats: List[tuple] = field(default_factory=list)
    failure_stat: Optional[tuple] = None
    #: ``kvfence.engine.casefile.hypothesis_blob()`` of the final replay of the shrunk failure.
    hypothesis: Optional[dict] = None
    #: Distinct configs checked, and the largest one launched (by its memory estimate).
    distinct_configs: int = 0
    largest_config: Optional[dict] = None
    #: Boundary class -> cases that reached it (``kvfence.contracts.draft.domain.boundary_classes``).
    boundaries: Dict[str, int] = field(default_factory=dict)
    #: The session's compile / capture counters and times (``Session.stats``), copied at the end.
    session_stats: Dict[str, float] = field(default_factory=dict)
    #: Set when a signal ended the run (``KeyboardInterrupt``, e.g. ``kvfence.cli``'s SIGINT/SIGTERM
    #: handler): the signal's name. ``case``/``findings`` are then the smallest failure seen so far.
    interrupted: Optional[str] = None
    #: ``--keep-going`` (``kvfence.engine.keepgoing``): failures already saved that exploring met again (they
    #: pass there), the saved failure this run's shrinking reached, the signature of the first failure
    #: explored (before shrinking), every distinct failure of the run
    #: (``keepgoing.Failure``), and the final replay's Hypothesis choices (to store it in the database).
    known_repeats: int = 0
    duplicate_of: Optional[tuple] = None
    first_signature: Optional[tuple] = None
    failures: list = field(default_factory=list)
    choices: Optional[bytes] = None
    #: ``--keep-going`` only: phases run, distinct failures, duplicates, known repeats.
    keep_going: Optional[dict] = None

    structure_keys: set = field(default_factory=set)
    read_keys: set = field(default_factory=set)
    config_keys: set = field(default_factory=set)

    def _per_s(self, count: int) -> float:
        return count / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cases_per_s(self) -> float:
        return self._per_s(self.verified_cases)

    @property
    def structural_cases_per_s(self) -> float:
        return self._per_s(self.structural_cases)

    @property
    def examples_per_s(self) -> float:
        return self._per_s(self.examples)

    @property
    def distinct_configs_per_s(self) -> float:
        return self._per_s(self.distinct_configs)


def config_key(config) -> int:
    """A digest of a config, the same in every process (``hash`` of a config is not: it holds strings)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(repr(config).encode(), digest_size=8).digest(), "little")


def structure_key(config_digest: int, structure) -> int:
    """A case's structure (its config's digest and the contract's ``structure_of``: what changes where the
    kernel writes), the same in every process: a tuple of ints hashes identically everywhere."""
    return hash((config_digest, structure))


def read_key(record, config_digest: int, case) -> int:
    """A case's structure and reads (its contract's ``structure_of`` and ``read_variant_of``): two cases of
    one read key differ only in values the kernel copies (the bulk skips the second)."""
    return structure_key(config_digest, (record.structure_of(case), record.read_variant_of(case)))


def utilisation(case) -> float:
    """need / width of the case's launch (its contract's ``utilisation``): Hypothesis ``target()``s it to press
    against the limit."""
    return contracts.of(case).utilisation(case)


def _keep(result: FuzzResult, make_stat: Callable[[], tuple], rng: random.Random) -> Optional[tuple]:
    """Reservoir sampling: ``result.stats`` is a uniform sample of the cases seen so far. The stat is
    built (``make_stat()``) only when it is kept, and returned then."""
    if len(result.stats) < MAX_STATS:
        stat = make_stat()
        result.stats.append(stat)
        return stat
    j = rng.randrange(result.generated_cases)
    if j < MAX_STATS:
        stat = result.stats[j] = make_stat()
        return stat
    return None


#: Kinds of a failure whose every candidate costs a worker restart while it is shrunk (the worker died or
#: was killed): its candidates are checked one case per message (``RemoteSession.check_many``'s
#: ``one_at_a_time``), so a crashing candidate costs one restart, not two.
RESTART_KINDS = frozenset({Kind.CRASH, Kind.HANG})


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
    examples, or until ``max_seconds`` have passed (whichever comes first; shrinking has its own budget).
    What a case is, the loop asks the contract's record (``contract``, or the record its first case names:
    ``kvfence.contract.Contract``): its config, structure, need/width, coverage row and edge classes.

    ``session`` is anything with ``check(case) -> List[Finding]`` (and optionally ``check_many``):
    ``kvfence.contracts.draft.session.Session`` (in this process) or ``kvfence.engine.worker.RemoteSession`` (in a worker
    process that may crash or hang).

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
            record[0] = contracts.of(case)
        return record[0]

    def body(example):
        raise_pending()  # a signal that came while the run was starting: it ends the run here, cleanly
        # An example is one case, or a list of cases sharing a config (kvfence.contracts.draft.strategies.case_runs), the
        # bulk ones (a CaseRun) from bulk_start on.
        cases = example if isinstance(example, list) else [example]
        bulk_start = getattr(example, "bulk_start", len(cases))
        now = time.perf_counter()
        shrinking = state["first_failure"] is not None
        expect = state.pop("splice", None)
        if expect is not None and cases != [expect]:
            raise SpliceMismatch()  # the spliced replay is not the bulk case: fuzz() reports it as found
        if not shrinking and max_seconds is not None and now - start > max_seconds:
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
                digest = _digest(rec.config_of(cases[0]))
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
        config = rec.config_of(case)
        digest = _digest(config)
        shape, reads = structure_key(digest, rec.structure_of(case)), read_key(rec, digest, case)
        if shape not in shapes:
            shapes.add(shape)
            result.structural_cases += 1
        elif reads not in read_shapes:
            result.read_variant_cases += 1
        elif verified_now:
            result.token_variant_cases += 1
        read_shapes.add(reads)
        u = rec.utilisation(case)
        stat = _keep(result, lambda: rec.coverage_row(case, bool(findings)), rng)
        if u > result.max_utilisation:
            result.max_utilisation, result.max_utilisation_stat = u, stat or rec.coverage_row(case, bool(findings))
        if config not in configs_seen:
            configs_seen[config] = size = rec.config_bytes(config)
            if size > state["largest"]:
                state["largest"] = size
                result.largest_config = dict(rec.config_record(config), estimated_bytes=size)
        for name in rec.boundaries(case):
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
                                      "work": work, "config": rec.config_record(rec.config_of(case))})

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

    def hypothesis_test(phases, db, key):
        test = given(strategy)(body)
        if seed is not None:
            # Before @settings: @seed on its own turns the example database off; the settings below decide.
            test = hyp_seed(seed)(test)
        test = settings(max_examples=max_examples, deadline=None, database=db, verbosity=Verbosity.quiet,
                        report_multiple_bugs=False, print_blob=False, phases=phases,
                        suppress_health_check=list(HealthCheck))(test)
        if db is not None:
            from kvfence.engine.campaign import apply_database_key

            if key is None:
                raise ValueError("fuzz(database=...) needs a database_key (kvfence.engine.campaign.database_key)")
            apply_database_key(test, body, key)
        return test

    def run(test) -> Optional[BulkFailure]:
        """Run ``test``; the failure it ends with goes into ``result`` (a bulk one is returned)."""
        try:
            test()
        except FindingsFound as failure:
            result.case = failure.case
            result.findings = failure.findings
            result.failure_stat = _record(failure.case).coverage_row(failure.case, True)
        except BulkFailure as failure:
            return failure
        except KeyboardInterrupt as stop:
            # A signal: keep what was checked and the smallest failure so far (not fully shrunk).
            result.interrupted = getattr(stop, "signal_name", None) or "SIGINT"
            if state.get("last_failure") is not None:
                result.case, result.findings = state["last_failure"]
                result.failure_stat = _record(result.case).coverage_row(result.case, True)
        except (TimeBudgetSpent, DuplicateFailure, SpliceMismatch):
            pass
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
    result.failure_stat = contracts.of(bulk.case).coverage_row(bulk.case, True)
    result.shrink_cut = True


def first_failure_line(case, findings: List[Finding]) -> str:
    """One line naming a failure as first found: its finding kinds and its config."""
    return f"{', '.join(damage_kinds(findings))} at {contracts.of(case).describe(case)}"


def damage_kinds(findings: List[Finding]) -> List[str]:
    return sorted({f.kind.value for f in findings})
