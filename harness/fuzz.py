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
from typing import Callable, Dict, List, NamedTuple, Optional

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings, target

from harness.case import Case
from harness.findings import Finding
from harness.session import Session


class FindingsFound(AssertionError):
    """Raised inside the Hypothesis test when a case has findings; carries the case and findings."""

    def __init__(self, case: Case, findings: List[Finding]):
        self.case = case
        self.findings = findings
        super().__init__(format_failure(case, findings))


def format_failure(case: Case, findings: List[Finding], limit: int = 8) -> str:
    c, b = case.config, case.batch
    lines = [f"{len(findings)} finding(s) for topk={c.topk} num_steps={c.num_steps} page_size={c.page_size} "
             f"ctx={c.ctx} max_bs={c.max_bs} sizing={c.sizing} layout={c.layout} mode={c.mode}; "
             f"seq_lens={list(b.seq_lens)} req_pool_indices={list(b.req_pool_indices)} token_seed={b.token_seed}"]
    lines += ["  " + f.headline() for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"  ... {len(findings) - limit} more")
    return "\n".join(lines)


class ExampleStat(NamedTuple):
    """What one explored example was: the coverage plot's point (reports/render.py)."""

    topk: int
    num_steps: int
    page_size: int
    num_seqs: int  # launched rows (the bucket, in graph mode)
    raw_bs: int
    need: int
    width: int
    failed: bool


#: Example stats kept per run (a uniform reservoir sample beyond this), so long GPU runs stay small.
MAX_STATS = 20000


@dataclass
class FuzzResult:
    examples: int = 0
    launches: int = 0
    elapsed_s: float = 0.0
    case: Optional[Case] = None
    findings: List[Finding] = field(default_factory=list)
    max_utilisation: float = 0.0
    shrink_cut: bool = False
    shrinking: bool = False
    #: Seconds from the start to the first failing case, and the examples it took (before shrinking).
    first_failure_s: Optional[float] = None
    examples_to_failure: Optional[int] = None
    #: Per-example stats (a reservoir sample of at most ``MAX_STATS``), and the shrunk failure's stat.
    stats: List[ExampleStat] = field(default_factory=list)
    failure_stat: Optional[ExampleStat] = None
    #: ``harness.casefile.hypothesis_blob()`` of the final replay of the shrunk failure.
    hypothesis: Optional[dict] = None

    @property
    def cases_per_s(self) -> float:
        return self.examples / self.elapsed_s if self.elapsed_s > 0 else 0.0


def utilisation(case: Case) -> float:
    """need / width of the case's launch: Hypothesis ``target()``s it to press against the limit."""
    summary = case.sizing_summary()
    return summary["need"] / summary["width"]


def example_stat(case: Case, failed: bool) -> ExampleStat:
    summary = case.sizing_summary()
    c = case.config
    return ExampleStat(c.topk, c.num_steps, c.page_size, summary["num_seqs"], case.batch.raw_bs, summary["need"],
                       summary["width"], failed)


def _keep(result: FuzzResult, stat: ExampleStat, rng: random.Random) -> None:
    """Reservoir sampling: ``result.stats`` is a uniform sample of the examples seen so far."""
    if len(result.stats) < MAX_STATS:
        result.stats.append(stat)
    else:
        j = rng.randrange(result.examples)
        if j < MAX_STATS:
            result.stats[j] = stat


def fuzz(session: Session, strategy, *, max_examples: int, seed: Optional[int] = None,
         shrink_seconds: float = 60.0, progress: Optional[Callable[[FuzzResult], None]] = None,
         progress_every_s: float = 2.0, database=None, database_key: Optional[bytes] = None, journal=None,
         targeting: bool = True) -> FuzzResult:
    """Run Hypothesis over ``strategy`` (of ``Case``, or of lists of them) for ``max_examples`` examples.

    ``FuzzResult.examples`` counts the cases checked while generating (not while shrinking).

    ``journal`` (a ``harness.journal.Journal``) records each case as in flight around its launch.
    ``database`` (a Hypothesis ``ExampleDatabase``) needs ``database_key`` (``harness.campaign.database_key``):
    every kernel shares this one test function, so Hypothesis's default key would mix their examples.
    ``targeting`` turns on Hypothesis's target phase on need/width (hill-climbing toward the buffer
    limit): better at sizing bugs, but its bookkeeping costs about as much as generation itself.
    """
    from harness.casefile import hypothesis_blob, hypothesis_final

    result = FuzzResult()
    rng = random.Random(0)
    verdicts: Dict[Case, List[Finding]] = {}
    state = {"first_failure": None, "last_progress": 0.0}
    start = time.perf_counter()

    def body(example):
        # An example is one Case, or a list of Cases sharing a config (strategies.case_runs).
        utilisations = [check_one(case) for case in (example if isinstance(example, list) else (example,))]
        if targeting and state["first_failure"] is None:
            target(max(utilisations), label="need/width")  # once per example: Hypothesis's rule

    def check_one(case: Case):
        now = time.perf_counter()
        shrinking = state["first_failure"] is not None
        if case in verdicts:
            findings = verdicts[case]
        elif shrinking and now - state["first_failure"] > shrink_seconds:
            result.shrink_cut = True
            return 0.0  # shrink budget spent: unseen candidates are not launched
        else:
            if journal is not None:
                journal.begin(case)
            findings = session.check(case)
            if journal is not None:
                journal.end()
            verdicts[case] = findings
            result.launches += 1
        utilisation = 0.0
        if not shrinking:
            result.examples += 1
            stat = example_stat(case, bool(findings))
            _keep(result, stat, rng)
            utilisation = stat.need / stat.width
            result.max_utilisation = max(result.max_utilisation, utilisation)
        if progress is not None and now - state["last_progress"] >= progress_every_s:
            state["last_progress"] = now
            result.elapsed_s = now - start
            progress(result)
        if findings:
            if state["first_failure"] is None:
                state["first_failure"] = time.perf_counter()
                result.first_failure_s = state["first_failure"] - start
                result.examples_to_failure = result.examples
                result.shrinking = True
            if hypothesis_final():
                result.hypothesis = hypothesis_blob()
            raise FindingsFound(case, findings)
        return utilisation

    test = given(strategy)(body)
    if seed is not None:
        # Before @settings: @seed on its own turns the example database off; the settings below decide.
        test = hyp_seed(seed)(test)
    test = settings(max_examples=max_examples, deadline=None, database=database, verbosity=Verbosity.quiet,
                    report_multiple_bugs=False, print_blob=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.target] if targeting else [])
                    + [Phase.shrink],
                    suppress_health_check=list(HealthCheck))(test)
    if database is not None:
        from harness.campaign import apply_database_key

        if database_key is None:
            raise ValueError("fuzz(database=...) needs a database_key (harness.campaign.database_key)")
        apply_database_key(test, body, database_key)
    try:
        test()
    except FindingsFound as failure:
        result.case = failure.case
        result.findings = failure.findings
        result.failure_stat = example_stat(failure.case, True)
    result.shrinking = False
    result.elapsed_s = time.perf_counter() - start
    return result


def damage_kinds(findings: List[Finding]) -> List[str]:
    return sorted({f.kind.value for f in findings})
