"""What a fuzz run found and counted (``FuzzResult``), and the control flow of its search: the exceptions that
end an example or the search (a failure, a duplicate, a bulk failure to splice, a spent budget), and the digests
a run counts cases by, the same in every process (a ``--jobs`` merge adds them up).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from kvfence.contract import Contract, Launch
from kvfence.engine import launch as launches
from kvfence.engine import registry
from kvfence.engine.casefile import format_failure
from kvfence.engine.findings import Finding, Kind


class FindingsFound(AssertionError):
    """Raised inside the Hypothesis test when a case has findings; carries the case and findings."""

    def __init__(self, case: Any, findings: List[Finding]) -> None:
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


def failure_signature(case: Any, findings: List[Finding]) -> tuple[Any, ...]:
    """What makes two failures the same for ``--keep-going``: their finding kinds and config (the contract's
    ``Keys.config`` with the launch's settings)."""
    return tuple(sorted({f.kind.value for f in findings})), launches.keys(registry.get(case.contract), case).config


class BulkFailure(BaseException):
    """Raised inside the Hypothesis test when the run's first failure is a bulk case of a
    ``kvfence.contracts.draft.strategies.CaseRun``: ``fuzz`` then replays ``choices`` (the example spliced down to that
    case) through Hypothesis, which shrinks it as any failure."""

    def __init__(self, case: Any, findings: List[Finding], choices: Optional[tuple[Any, ...]]) -> None:
        self.case, self.findings, self.choices = case, findings, choices
        super().__init__(format_failure(case, findings))


class SpliceMismatch(BaseException):
    """Raised inside the splice replay when Hypothesis's replay of the spliced choices is not the bulk
    case (a Hypothesis whose internals differ): the failure is then reported as found."""


#: What ``FuzzResult.bulk_splice`` says when the spliced replay reproduced the bulk failure.
SPLICE_REPLAYED = "replayed"


#: Seconds between two calls of ``fuzz(stop_requested=)`` (a file's existence, asked per example otherwise).
STOP_POLL_S = 0.05


class RunAborted(BaseException):
    """A ``BadInput`` inside an example (a sizing plug-in that ends its process, a case that cannot fit the
    memory budget): not a failure of the kernel, so it is neither shrunk nor replayed; the search stops at once and
    the run ends with that one line (a ``BaseException``, which Hypothesis passes through)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


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
    case: Any = None  # the failing launch (or a run of them), None without a failure
    findings: List[Finding] = field(default_factory=list)
    max_utilisation: float = 0.0
    #: The case of ``max_utilisation`` (need/width), so the report can name it.
    max_utilisation_stat: Optional[tuple[Any, ...]] = None
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
    first_examples: List[dict[str, Any]] = field(default_factory=list)
    #: Per-example stats (a reservoir sample of at most ``MAX_STATS``), and the shrunk failure's stat;
    #: ``coverage_fields`` names their columns (``kvfence.engine.launch.coverage_fields``).
    stats: List[tuple[Any, ...]] = field(default_factory=list)
    coverage_fields: Optional[tuple[Any, ...]] = None
    failure_stat: Optional[tuple[Any, ...]] = None
    #: ``kvfence.engine.casefile.hypothesis_blob()`` of the final replay of the shrunk failure.
    hypothesis: Optional[dict[str, Any]] = None
    #: Distinct configs checked, and the largest one launched (by its memory estimate).
    distinct_configs: int = 0
    largest_config: Optional[dict[str, Any]] = None
    #: Edge class -> cases that reached it (the contract's ``Keys.edges``).
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
    duplicate_of: Optional[tuple[Any, ...]] = None
    first_signature: Optional[tuple[Any, ...]] = None
    failures: list[Any] = field(default_factory=list)
    choices: Optional[bytes] = None
    #: ``--keep-going`` only: phases run, distinct failures, duplicates, known repeats.
    keep_going: Optional[dict[str, Any]] = None

    structure_keys: set[Any] = field(default_factory=set)
    read_keys: set[Any] = field(default_factory=set)
    config_keys: set[Any] = field(default_factory=set)

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


def config_key(config: Any) -> int:
    """A digest of a value, the same in every process (``hash`` is not: strings and None hash per process)."""
    return int.from_bytes(hashlib.blake2b(repr(config).encode(), digest_size=8).digest(), "little")


def structure_key(config_digest: int, structure: Any) -> int:
    """A case's structure (its config's digest and the contract's ``Keys.structure``: what changes where the
    kernel writes), the same in every process whatever the contract's structure holds."""
    return config_key((config_digest, structure))


def read_key(record: Contract[Any], config_digest: int, case: Launch[Any]) -> int:
    """A case's structure and reads (its contract's ``Keys.structure`` and ``Keys.reads``): two cases of one
    read key differ only in values the kernel copies (the bulk skips the second)."""
    found = launches.keys(record, case)
    return structure_key(config_digest, (found.structure, found.reads))


def keep_sample(result: FuzzResult, make_stat: Callable[[], tuple[Any, ...]],
                rng: random.Random) -> Optional[tuple[Any, ...]]:
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
