"""One ``kvfence fuzz`` run from its plan: one process or ``--jobs`` children, and its outputs.

``run(plan, outputs, say)`` is what the command does once its flags are a ``RunPlan`` (``kvfence.cli.fuzz``): the
contract's draws and checker (``kvfence.engine.run``), the example database and shard (``kvfence.engine.campaign``),
the journal of cases in flight, the fuzz loop (``kvfence.engine.loop``, or its ``--keep-going`` phases), then the
case file, summary.json and the reports. A ``--jobs`` run starts N children, each given the plan as data (a JSON
file: its seed, share of the budget, folder and host's job count set there), and merges what they wrote
(``kvfence.engine.jobs``). Lines for the user go through ``say`` (stdout) and ``warn`` (stderr), so the command
prints and nothing here decides where.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Literal, Optional, Union

from kvfence.engine import casefile
from kvfence.engine import run as pipeline
from kvfence.engine import summary as summaries
from kvfence.engine.clock import budget_left, command_start, since_start
from kvfence.engine.plan import RunPlan
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, BadInput
from kvfence.provenance import stamped

if TYPE_CHECKING:  # annotations only: the run's modules are imported where the run needs them
    from kvfence.engine.campaign import DatabaseSpec
    from kvfence.engine.keepgoing import Failure
    from kvfence.engine.result import FuzzResult

#: How the first verdict begins on stderr (benchmarks/first_verdict.py times the command to this line).
FIRST_FAILURE = "kvfence: first failure"
#: ``max_seconds`` of a search whose ``--max-seconds`` was spent before it began (start-up on a loaded machine): a
#: plan's budget is positive, and any budget below the first example's time ends the search after that example.
SPENT_BUDGET_S = 1e-6
#: Errnos of storage that stopped taking writes: a full disk or quota, a filesystem remounted read-only.
FULL_DISK = ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO")


@dataclass(frozen=True)
class Outputs:
    """Where a run's results go beside its folder: ``--json``, whether progress lines are shown, the program
    name repro lines are spelled with, and for a ``--jobs`` child its progress and stop files."""

    json: Optional[Path] = None
    quiet: bool = False
    program: str = "python -m kvfence"
    progress_file: Optional[Path] = None
    stop_file: Optional[Path] = None
    render: Optional[Callable[..., Any]] = None  # (doc, out_dir) -> {"md", "html", "plot_skipped"}: report.md / .html
    table: Optional[Callable[..., Any]] = None  # (doc, program) -> the summary table printed at the end


def output_failure(path: Union[str, Path], exc: OSError, doc: Optional[dict[str, Any]] = None) -> BadInput:
    """The one-line error for an output that cannot be written (full disk, read-only filesystem, ...): the path,
    the errno, and where the run's findings already are (case files are written first)."""
    import errno as errno_mod

    name = errno_mod.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno else type(exc).__name__
    text = f"cannot write {path}: {exc.strerror or exc} ({name})"
    cases = sorted((doc or {}).get("cases") or {})
    if doc is not None and cases:
        shown = ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")
        text += (f"; the run has {len(doc['findings'])} finding(s), saved before this in {len(cases)} case "
                 f"file(s): {shown}")
    elif doc is not None and doc.get("findings"):
        text += f"; the run has {len(doc['findings'])} finding(s) (printed above)"
    return BadInput(text)


class output_errors:
    """``with output_errors(path, doc):`` turns an ``OSError`` of writing ``path`` into ``output_failure``."""

    def __init__(self, path: Union[str, Path], doc: Optional[dict[str, Any]] = None) -> None:
        self.path, self.doc = path, doc

    def __enter__(self) -> "output_errors":
        return self

    def __exit__(self, kind: object, exc: Optional[BaseException], tb: object) -> Literal[False]:
        if isinstance(exc, OSError):
            raise output_failure(self.path, exc, self.doc) from None
        return False


class Run:
    """One run of ``plan`` (see the module docstring); ``say`` / ``warn`` print a line."""

    def __init__(self, plan: RunPlan, outputs: Outputs, say: Callable[[str], None], warn: Callable[[str], None]):
        self.plan, self.outputs, self.say, self.warn = plan, outputs, say, warn
        self.out_dir = Path(plan.out)
        self.earlier: Optional[dict[str, Any]] = None

    # -- the whole run ------------------------------------------------------------------------------------
    def run(self) -> int:
        from kvfence.engine import campaign
        from kvfence.engine.outlock import acquire

        plan = self.plan
        session = None
        if plan.jobs == 1 and not plan.resume:
            if self.out_dir.is_dir():  # another run in this folder: refused now, before a worker starts
                acquire(self.out_dir, announce=self.warn)
            # Start-up off the critical path: the worker starts first, everything else happens meanwhile.
            session = pipeline.checker(plan, background=True)
        try:
            shard = campaign.parse_shard(plan.shard) if plan.shard else None
            # Every pinned field and the budget validated now (BadInput), not inside Hypothesis.
            strategy, shard_info = pipeline.draws(plan, shard)
            seed_source = "given" if plan.seed is not None else "random"
            seed = plan.seed if plan.seed is not None else random.getrandbits(32)
            run = dict(pipeline.run_record(plan, seed, seed_source), resume=plan.resume)
            # The example database: a malformed URL here, an unreachable Redis below, both before any work.
            db_spec = campaign.parse_database(plan.database or campaign.default_database(self.out_dir))
            db_key = pipeline.database_key(plan, shard)
            if plan.jobs > 1:
                database = campaign.open_database(db_spec)
                run["campaign"] = campaign.summary_block(db_spec, db_key, shard_info, None,
                                                         campaign.stored_failures(database, db_key))
                return self._jobs(run, db_spec)
            previous = self._previous_summary() if plan.resume else None
            database = None if plan.resume else campaign.open_database(db_spec)  # unreachable: nothing written
            acquire(self.out_dir, announce=self.warn)
            run["campaign"] = campaign.summary_block(db_spec, db_key if database is not None else None, shard_info,
                                                     campaign.shard_seed(seed, shard),
                                                     campaign.stored_failures(database, db_key))
            if session is not None and hasattr(session, "wait_ready"):
                session.wait_ready()  # resolves the kernel in the worker: BadInput here, before the first example
            return self._one(strategy, session, previous, run, database, db_key, db_spec)
        finally:
            if session is not None and hasattr(session, "close"):
                session.close()

    def _previous_summary(self) -> Optional[dict[str, Any]]:
        """``--resume`` adds to the folder's summary.json: it must be readable (or absent) before any work."""
        where = self.out_dir / "summary.json"
        if not where.exists():
            return None
        try:
            return summaries.validate(casefile.parse_json_file(where, "summary"), str(where))
        except BadInput as exc:
            raise BadInput(f"--resume adds to {where}, which cannot be read: {exc}") from None

    # -- one process ----------------------------------------------------------------------------------------
    def _one(self, strategy: Any, session: Any, previous: Optional[dict[str, Any]], run: dict[str, Any],
             database: Any, db_key: bytes, db_spec: DatabaseSpec) -> int:
        from kvfence.engine.interrupt import exit_code_for, signals_interrupt
        from kvfence.engine.journal import Journal, recover
        from kvfence.engine.loop import fuzz
        from kvfence.engine.outdir import set_aside_earlier_cases
        from kvfence.engine.result import SPLICE_REPLAYED, FuzzResult

        plan, out_dir = self.plan, self.out_dir
        if not plan.resume:  # --resume adds to the folder's results: its case files stay where they are
            # Before anything is written: the folder's case files from earlier runs go to cases/earlier/<time>/.
            self.earlier = set_aside_earlier_cases(out_dir)
            if self.earlier:
                self.warn(f"kvfence: {self.earlier['count']} case file(s) of an earlier run moved to "
                          f"{self.earlier['folder']}")
        # Cases in flight when an earlier run's process died: CRASH findings (an unusable slot set aside, said).
        crashes = recover(out_dir, report=lambda line: self.warn(f"kvfence: {line}"))
        for crash in crashes:
            self.warn(f"kvfence: CRASH: a run died launching a case: {crash.path}")
        if plan.resume:
            result = FuzzResult()
            self.say(f"kvfence fuzz --resume: {len(crashes)} crashed case(s) recovered from {out_dir}")
        else:
            result = self._search(strategy, session, run, database, db_key, fuzz, Journal, signals_interrupt)
            if result.interrupted:
                self.warn(f"kvfence: {result.interrupted}: run stopped; writing what was checked")
            if result.bulk_splice and result.bulk_splice != SPLICE_REPLAYED:
                self.warn(f"kvfence: {result.bulk_splice}")
            if run["campaign"]["stored_failures_at_start"]:
                self.say(f"kvfence fuzz: replayed {run['campaign']['stored_failures_at_start']} stored failure(s) "
                         f"from {db_spec.display} first")
            self.say(f"kvfence fuzz: {result.verified_cases} cases verified ({result.cached_cases} from cache) in "
                     f"{result.elapsed_s:.1f}s ({result.cases_per_s:.1f} verified cases/s, "
                     f"{result.structural_cases_per_s:.1f} structurally distinct/s) on {plan.device}, "
                     f"{target_text(run)}, domain {plan.domain}, "
                     f"seed {'random (%d)' % run['seed'] if run['seed_source'] == 'random' else run['seed']}")
        run = dict(run, interrupted=result.interrupted, **self._phases(session, result))
        if session is not None and plan.isolate:
            run["worker"] = dict(session.stats)
        code = self._outputs(result, crashes, run, previous)
        return exit_code_for(result.interrupted) if result.interrupted else code

    def _search(self, strategy: Any, session: Any, run: dict[str, Any], database: Any, db_key: bytes,
                fuzz: Callable[..., FuzzResult], Journal: Any, signals_interrupt: Any) -> FuzzResult:
        from kvfence.engine.jobs import POLL_S, write_progress
        from kvfence.engine.progress import Progress

        plan, outputs = self.plan, self.outputs
        progress = None if outputs.quiet else Progress(plan.max_examples, seconds=plan.max_seconds)
        callback = progress.update if progress else None
        if outputs.progress_file is not None:
            callback = lambda r, path=outputs.progress_file: write_progress(path, r)  # noqa: E731
        stop = None if outputs.stop_file is None else (lambda path=outputs.stop_file: os.path.exists(path))
        # SIGINT/SIGTERM end fuzz() cleanly (kvfence.engine.interrupt); the journal slot closes as on any exit.
        with Journal(self.out_dir, device=plan.device) as journal, signals_interrupt():
            run_fuzz = fuzz
            wiring: dict[str, Any] = {"stop_requested": stop}
            if plan.keep_going:  # phases until the budgets are spent; each new failure saved at once
                from kvfence.engine.keepgoing import fuzz_keep_going

                run_fuzz = fuzz_keep_going
                wiring = {"on_failure": lambda failure: self._save_failure(run, failure)}
            try:
                return run_fuzz(session, strategy, self._search_plan(run), on_first_failure=self._announcer(),
                                database=database, database_key=db_key, journal=journal, progress=callback,
                                progress_every_s=POLL_S if outputs.progress_file else (
                                    progress.every_s if progress else 2.0),
                                **wiring)
            finally:
                if progress:
                    progress.close()

    def _search_plan(self, run: dict[str, Any]) -> RunPlan:
        """The plan the search runs: this shard's Hypothesis seed, and what is left of ``--max-seconds`` counted
        from the command's start. A budget already spent stays positive (a plan's ``max_seconds`` is): the
        search checks its first example whatever the clock says and stops after it, as at 0."""
        left = budget_left(self.plan.max_seconds)
        return self.plan.with_(seed=run["campaign"]["hypothesis_seed"],
                               max_seconds=None if left is None else max(left, SPENT_BUDGET_S))

    @staticmethod
    def _phases(session: Any, result: FuzzResult) -> dict[str, Any]:
        """Seconds from the command's start (kvfence.engine.clock) to the worker's ready and the first launch."""

        return {"startup_s": since_start(getattr(session, "ready_at", None)),
                "first_launch_s": since_start(result.first_launch_at)}

    # -- the first verdict ----------------------------------------------------------------------------------
    def announce(self, at: Optional[float], text: Optional[str]) -> None:
        """The first verdict, as soon as it is known (shrinking it may take ``--shrink-seconds`` more)."""
        import sys


        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[2K")  # the progress line goes first
        self.warn(f"{FIRST_FAILURE} {since_start(at):.2f}s into the command: {text}; shrinking it")

    def _announcer(self) -> Callable[[FuzzResult], None]:
        """``fuzz(on_first_failure=)`` for one process: the run's first failure only (``--keep-going`` runs
        phases, each with a first failure of its own, and saves each at once)."""
        done: list[bool] = []

        def announce(result: FuzzResult) -> None:
            if not done:
                done.append(True)
                self.announce(result.first_failure_at, result.first_failure_text)

        return announce

    # -- outputs ------------------------------------------------------------------------------------------
    def _case_extras(self, run: dict[str, Any], *, interrupted: Optional[str], shrink_cut: bool) -> dict[str, Any]:
        """What a fuzz case file records besides the case: how it was found and how far it was shrunk."""
        extras = {"fuzz": {"seed": run["seed"], "max_examples": self.plan.max_examples, "domain": run["domain"]}}
        if interrupted:
            extras["interrupted"] = {"signal": interrupted, "shrunk": False,
                                     "note": "the run was stopped before shrinking finished: the case may not be "
                                             "minimal"}
        if shrink_cut:
            extras["shrink"] = {"cut": True, "shrink_seconds": self.plan.shrink_seconds,
                                "note": "shrunk as far as it got within --shrink-seconds: the case may not be minimal"}
        return extras

    def _save_failure(self, run: dict[str, Any], failure: Failure) -> str:
        """``--keep-going``: write one distinct failure's case file as soon as it is found; its path."""
        extras = self._case_extras(run, interrupted=failure.interrupted, shrink_cut=failure.shrink_cut)
        extras["hypothesis"] = failure.hypothesis or {"unavailable": "the final replay did not run"}
        extras["fuzz"]["keep_going_phase"] = failure.phase + 1
        where = self.out_dir / casefile.CASES_DIR / f"{casefile.case_hash(failure.case)}.json"
        try:
            return str(casefile.write_case(failure.case, failure.findings, out_dir=self.out_dir,
                                           device=self.plan.device, source="fuzz", extras=extras))
        except OSError as exc:
            self.say(casefile.format_failure(failure.case, failure.findings, limit=20))  # the finding is never lost
            raise output_failure(where, exc, {"findings": failure.findings}) from None

    def _outputs(self, result: FuzzResult, crashes: List[Any], run: dict[str, Any],
                 previous: Optional[dict[str, Any]]) -> int:
        """The run's outputs: case file, summary table, summary.json (and --json), report.md/html."""

        plan, out_dir = self.plan, self.out_dir
        case_path = None
        if result.failures:  # --keep-going: every distinct failure already has its case file
            for failure in result.failures:
                self.say(casefile.format_failure(failure.case, failure.findings, limit=20))
                self.say(f"  case file: {failure.path}")
            case_path = result.failures[0].path
        elif result.findings:
            extras = self._case_extras(run, interrupted=result.interrupted, shrink_cut=result.shrink_cut)
            extras["hypothesis"] = result.hypothesis or {"unavailable": "the final replay did not run"}
            self.say(casefile.format_failure(result.case, result.findings, limit=20))  # first: never lost
            with output_errors(out_dir / casefile.CASES_DIR / f"{casefile.case_hash(result.case)}.json",
                               {"findings": result.findings}):
                case_path = str(casefile.write_case(result.case, result.findings, out_dir=out_dir, device=plan.device,
                                                    source="fuzz", extras=extras))
            if result.shrink_cut:
                self.say(f"(shrinking stopped after --shrink-seconds {plan.shrink_seconds:g}; the case may not be "
                         "minimal)")
            if result.interrupted:
                self.say(f"(interrupted by {result.interrupted} before shrinking finished; the case may not be "
                         "minimal)")
        elif not crashes:
            self.say("no findings")
        doc = summaries.build(result, run=run, case_path=case_path, crashes=crashes, versions=casefile.versions(),
                              earlier=self.earlier, started_at=command_start())
        if result.keep_going is not None:
            for failure in result.failures[1:]:
                doc["findings"] += [dict(f.to_dict(), case=failure.path) for f in failure.findings]
                doc["cases"][failure.path] = summaries.case_record(failure.path, failure.case, failure.findings,
                                                                   source="fuzz")
            doc["keep_going"] = result.keep_going
            self.say(f"kvfence fuzz --keep-going: {result.keep_going['distinct_failures']} distinct failure(s) in "
                     f"{result.keep_going['phases']} phase(s) ({result.keep_going['duplicates']} found again and "
                     "dropped)")
        return self.write_summary(doc, previous=previous)

    def write_summary(self, doc: dict[str, Any], *, previous: Optional[dict[str, Any]] = None) -> int:
        """summary.json (and --json), report.md / report.html, the table on stdout; the exit code. With
        ``previous`` (``fuzz --resume``) the doc is added to that summary, and the exit code says whether this run
        found anything new."""
        from kvfence.engine.interrupt import outputs_written, pending

        new_findings = bool(doc["findings"])
        if pending() and not doc.get("interrupted"):  # a signal after checking ended: the outputs still say so
            doc["interrupted"] = pending()
        if previous is not None:  # README: "Resuming into a folder"
            doc = summaries.merge_resumed(previous, doc)
        # The code stamp (kvfence.provenance): which kvfence wrote this summary, for a figure quoted from it.
        text = json.dumps(stamped(doc), indent=1) + "\n"
        # A disk that fills up (or turns read-only) now, after the case files, is one line and exit 2.
        with output_errors(self.out_dir / "summary.json", doc):
            casefile.atomic_write_text(self.out_dir / "summary.json", text)
        if self.outputs.json is not None:
            with output_errors(self.outputs.json, doc):
                casefile.atomic_write_text(self.outputs.json, text)
        if self.outputs.render is not None and self.outputs.table is not None:  # the CLI gives both
            with output_errors(self.out_dir / "report.md", doc):
                written = self.outputs.render(doc, self.out_dir)
            self.say("")
            self.say(self.outputs.table(doc, self.outputs.program))
            self.say(f"\nreports: {self.out_dir / 'summary.json'}, {written['md']}, {written['html']}")
            if written["plot_skipped"]:
                self.warn(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
        outputs_written()  # a signal from now on changes none of what was written
        return EXIT_FINDINGS if new_findings else EXIT_CLEAN

    # -- --jobs ---------------------------------------------------------------------------------------------
    def child_plans(self, seed: int, db_spec: DatabaseSpec) -> list[Any]:
        """Each job's plan: the parent's, with its own seed, share of the example budget, folder and one job."""
        from kvfence.engine.jobs import job_dir

        plan, jobs = self.plan, self.plan.jobs
        share = [plan.max_examples // jobs + (i < plan.max_examples % jobs) for i in range(jobs)]
        if min(share) < 1:
            raise BadInput(f"--jobs {jobs} is more than --max-examples {plan.max_examples}")
        return [replace(plan, seed=seed + i, max_examples=share[i], jobs=1, host_jobs=jobs,
                        out=str(job_dir(self.out_dir, i)), database=db_spec.display) for i in range(jobs)]

    def _jobs(self, run: dict[str, Any], db_spec: DatabaseSpec) -> int:
        """``--jobs N``: N child fuzz processes (kvfence.engine.jobs), merged into one summary, report and case
        folder."""
        from kvfence.engine import campaign
        from kvfence.engine.interrupt import exit_code_for
        from kvfence.engine.jobs import adopt_case_files, run_jobs
        from kvfence.engine.outdir import set_aside_earlier_cases
        from kvfence.engine.outlock import acquire
        from kvfence.engine.progress import Progress
        from kvfence.engine.result import SPLICE_REPLAYED

        plan = self.plan
        if db_spec.password:  # children get it from the environment, never in their plan file
            os.environ[campaign.REDIS_PASSWORD_ENV] = db_spec.password
        children = self.child_plans(run["seed"], db_spec)
        acquire(self.out_dir, announce=self.warn)
        self.earlier = set_aside_earlier_cases(self.out_dir)  # this run's report shows only its case files
        if self.earlier:
            self.warn(f"kvfence: {self.earlier['count']} case file(s) of an earlier run moved to "
                      f"{self.earlier['folder']}")
        progress = None if self.outputs.quiet else Progress(plan.max_examples, seconds=plan.max_seconds)
        start, started_at = time.perf_counter(), command_start()
        try:
            docs, problems, crashes, interrupted, not_started = run_jobs(
                plan, children, progress=progress.update if progress else None,
                on_first_failure=lambda doc: self.announce(doc.get("first_failure_at"), doc.get("first_failure_text")))
        finally:
            if progress:
                progress.close()
        elapsed = time.perf_counter() - start
        for line in problems:
            self.warn(f"kvfence: {line}")
        adopt_case_files(docs, self.out_dir)
        doc = summaries.merge(docs, run=run, elapsed_s=elapsed, started_at=started_at)
        doc.update(job_problems=problems, jobs_not_started=not_started, earlier_cases=self.earlier,
                   interrupted=interrupted)
        for crash in crashes:
            p = str(crash.path)
            doc["findings"].append(dict(crash.finding.to_dict(), case=p))
            doc["cases"][p] = summaries.case_record(p, crash.case, [crash.finding], source="journal")
        adopt_case_files([doc], self.out_dir)
        jobs = plan.jobs
        started = f"{jobs - not_started} of {jobs} jobs started" if not_started else f"{jobs} jobs"
        self.say(f"kvfence fuzz: {started}, {doc['verified_cases']} cases verified ({doc['cached_cases']} from cache) "
                 f"in {elapsed:.1f}s ({doc['cases_per_s']:.1f} verified cases/s, "
                 f"{doc['structural_cases_per_s']:.1f} structurally distinct/s) on {plan.device}, {target_text(run)}, "
                 f"domain {run['domain']}")
        for path, record in doc["cases"].items():
            self.say(f"{', '.join(record['kinds'])}: {path}")
        if not doc["findings"]:
            self.say("no findings")
        if interrupted:
            self.warn(f"kvfence: {interrupted}: jobs stopped; merged what they had checked")
        if doc.get("bulk_splice") and doc["bulk_splice"] != SPLICE_REPLAYED:
            self.warn(f"kvfence: {doc['bulk_splice']}")
        code = self.write_summary(doc)
        if interrupted:
            return exit_code_for(interrupted)
        return EXIT_FINDINGS if problems and code == EXIT_CLEAN else code


def target_text(run: dict[str, Any]) -> str:
    """What a run checked, in one phrase: contract, kernel, sizing, mode and layout."""
    return (f"contract {run['contract']}, kernel {run['kernel']}, sizing {run['sizing']}, mode {run['mode']}, "
            f"layout {run.get('layout', 'redzone')}")
