"""``kvfence fuzz``: fuzz the kernel against the oracle inside guarded buffers (kvfence.engine.loop),
one process or ``--jobs`` children, then the case file, summary.json and the reports.

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import List, Optional

from kvfence.cli.common import (
    _exit_codes, _positive_int, _non_negative_int, _seconds, _stderr, _writable, _out_dir, _lock_out, _output_failure,
    _output_errors, _add_worker_args, _add_target_args, _add_config_args, _add_family_args,
)
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, BadInput, require
from kvfence.provenance import stamped


def _shard(text: str):
    """An argparse type: ``--shard I/N``, ``auto`` or ``auto/N`` (kvfence.engine.campaign.parse_shard), one-line
    error otherwise."""
    from kvfence.engine.campaign import parse_shard

    try:
        return parse_shard(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None


#: The config flags a contract may take (``RunPlan.pins``; ``Contract.pins`` says which): a flag set away from
#: its default goes into the plan, and a contract that does not take it refuses it in one line.
PIN_FLAGS = ("topk", "num_steps", "page_size", "ctx", "max_bs", "window", "sink", "entry_page_size", "translate",
             "family", "layout", "seq_len_limit")


#: What ``fuzz --resume`` uses; any other flag set away from its default is refused (it would be ignored).
_RESUME_FLAGS = {"out", "device", "json", "quiet", "resume", "in_process", "case_timeout"}


def _check_resume_flags(args) -> None:
    ignored = sorted(dest for dest, default in args.fuzz_defaults.items()
                     if dest not in _RESUME_FLAGS and getattr(args, dest) != default)
    require(not ignored, f"--resume only collects cases left in flight by runs that died; it would ignore "
                         f"{', '.join('--' + d.replace('_', '-') for d in ignored)}: drop them or run without --resume")


#: The default budgets: the CPU's interpreter checks an example budget; on CUDA the plain command checks
#: what the machine can check in ``DEFAULT_GPU_SECONDS`` (on every core, ``_default_jobs``).
DEFAULT_MAX_EXAMPLES = 100


DEFAULT_GPU_SECONDS = 60.0


def _resolve_budget(args, device: str) -> None:
    """Fill in ``--max-examples`` / ``--max-seconds``: a time budget alone bounds the run by time
    (examples unbounded); with neither, CUDA gets ``DEFAULT_GPU_SECONDS``, the CPU ``DEFAULT_MAX_EXAMPLES``."""
    from kvfence.engine.progress import UNBOUNDED_EXAMPLES

    if args.max_examples is None and args.max_seconds is None and device == "cuda":
        args.max_seconds = DEFAULT_GPU_SECONDS
    if args.max_examples is None:
        args.max_examples = UNBOUNDED_EXAMPLES if args.max_seconds is not None else DEFAULT_MAX_EXAMPLES


#: Examples a ``--jobs`` child should get at least, so process start-up does not dominate a short run.
MIN_EXAMPLES_PER_JOB = 50


#: Batches of one config per Hypothesis example on CUDA (config-major: compile and capture once, replay
#: many), and the bulk after them, off by default (``kvfence.contracts.draft.strategies.case_runs(bulk=)``: batches drawn
#: by a seeded PRNG, new in structure by construction; ``--bulk-per-example N`` turns it on, after
#: ``--bulk-after`` seconds of search). What they decide is time to a kill: many batches of one config
#: spend the example on that config while the bugs that need a rare config wait for the next. On the
#: H200 (8 runs sharing the GPU, 3-4 seeds), 8 Hypothesis batches with no bulk had the lower median
#: search time on 25 of the 31 shipped mutants against a bulk of 64, and on 25 of 31 against a bulk of
#: 256 opened after 5 s (the other six within 0.15 s either way): the bulk's checking slows every other
#: run and job sharing the GPU (BENCHMARKS.md, "Time to a kill"); with the stub checker of
#: benchmarks/bulk_choices.py (``cpu_bulk_choices.json``) 8 batches also beat 32 on every trigger's median
#: (though every shape but 32 with a bulk of 1,024 missed one trigger in one seed of five). The
#: bulk raises the structural rate, not the kill rate: it stays an option for long campaigns.
GPU_BATCHES_PER_EXAMPLE = 8
GPU_BULK_PER_EXAMPLE = 0
#: Seconds of search before a bulk that is turned on opens (until then an example is what bulk-off draws).
GPU_BULK_AFTER_S = 5.0


def _default_jobs(device: str, max_examples: int, max_seconds) -> int:
    """All usable CPU cores on CUDA (``kvfence.engine.jobs.usable_cores``; one left for the parent and
    the driver), fewer when the example budget is too small to keep them busy; one process on the CPU
    (the interpreter is the bottleneck)."""
    if device != "cuda":
        return 1
    from kvfence.engine.jobs import usable_cores

    cores = max(1, usable_cores() - 1)
    if max_seconds is not None:
        return min(cores, 16)
    return max(1, min(cores, 16, max_examples // MIN_EXAMPLES_PER_JOB))


def _run_jobs(args, device: str) -> int:
    """``--jobs``, refused in one line when the machine cannot hold it; without it, the default
    (``_default_jobs``) cut to what the machine holds now (a host short of memory runs fewer jobs)."""
    from kvfence.engine.jobs import JOB_MEMORY_BYTES, JOBS_PER_CORE, max_jobs

    if args.jobs is None:
        return min(max_jobs(), _default_jobs(device, args.max_examples, args.max_seconds))
    require(args.jobs <= max_jobs(), f"--jobs {args.jobs}: this machine can hold at most {max_jobs()} jobs "
                                     f"({JOBS_PER_CORE} per CPU core, {JOB_MEMORY_BYTES >> 30} GiB of available memory each)")
    return args.jobs


def _plan(args, device: str):
    """The run's ``RunPlan`` from the flags (validated, one-line errors): domain, jobs, batches per example,
    the bulk, the memory budget and the config flags set away from their defaults (``pins``)."""
    from kvfence.contracts.draft.budget import default_budget, parse_size
    from kvfence.engine.plan import RunPlan

    scale = args.scale or ("gpu" if device == "cuda" else "cpu")
    require(not (scale == "gpu" and device != "cuda"),
            "--scale gpu needs --device cuda: production-sized launches under the interpreter would take hours")
    jobs = _run_jobs(args, device)  # before anything is sized by jobs
    require(not (args.resume and jobs > 1), "--resume collects crashed cases of one folder; it takes no --jobs")
    per_example = args.batches_per_example or (GPU_BATCHES_PER_EXAMPLE if device == "cuda" else 1)
    if args.bulk_per_example is None:  # resolved here, so --jobs children get the same value
        args.bulk_per_example = GPU_BULK_PER_EXAMPLE if device == "cuda" else 0
    if args.bulk_after is None:
        args.bulk_after = GPU_BULK_AFTER_S if device == "cuda" else 0.0
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else default_budget(device, jobs)
    defaults = args.fuzz_defaults
    pins = {name: getattr(args, name) for name in PIN_FLAGS if getattr(args, name) != defaults.get(name)}
    return RunPlan(contract=args.contract, kernel=args.kernel, sizing=args.sizing, device=device, mode=args.mode,
                   domain=scale, pins=pins, seed=args.seed, max_examples=args.max_examples,
                   max_seconds=args.max_seconds, shrink_seconds=args.shrink_seconds, batches_per_example=per_example,
                   bulk_per_example=args.bulk_per_example, bulk_after=args.bulk_after, max_bytes=max_bytes,
                   jobs=jobs, host_jobs=args.host_jobs or jobs, targeting=not args.no_target, keep_going=args.keep_going,
                   isolate=not args.in_process, case_timeout=args.case_timeout, audit=False if args.no_audit else None)


def _child_args(parser, args, *, seed: int, max_examples: int, max_bytes: int, host_jobs: int) -> List[str]:
    """The flags a ``--jobs`` child gets: the parent's, except those each child gets its own value of."""
    own = {"jobs", "seed", "out", "max_examples", "json", "quiet", "max_gpu_mem", "progress_file", "stop_file",
           "resume", "host_jobs"}
    argv = []
    for action in parser._actions:
        if not action.option_strings or action.dest in own or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        argv += [action.option_strings[0]] if value is True else [action.option_strings[0], str(value)]
    return argv + ["--jobs", "1", "--host-jobs", str(host_jobs), "--seed", str(seed), "--max-examples",
                   str(max_examples), "--quiet", "--max-gpu-mem", str(max_bytes)]


def cmd_fuzz(args) -> int:
    from kvfence import contract as contracts
    from kvfence.device import select
    from kvfence.engine import run as pipeline

    if args.resume:
        _check_resume_flags(args)
    json_path = _writable(args.json, "--json")
    out_dir = _out_dir(args.out)
    require(args.max_seconds is None or (args.max_seconds > 0 and args.max_seconds == args.max_seconds),
            f"--max-seconds {args.max_seconds}: expected a positive number of seconds")
    record = contracts.get(args.contract)
    if not args.progress_file:  # a --jobs child's plug-ins were checked by its parent
        from kvfence.engine.probe import check_plugins

        # their import cannot end this process
        check_plugins(record, {"kernel": args.kernel, "sizing": args.sizing})
    record.sizing(args.sizing)  # unknown policy: exit 2 before anything runs
    # Only the process that launches kernels imports torch: the supervisor and a --jobs parent do not.
    device = select(args.device, announce=_stderr, prepare=bool(args.in_process))
    _resolve_budget(args, device)
    plan = _plan(args, device)
    pipeline.record(plan)  # the plan against the contract (its pins, kernel, sizing): exit 2 before anything runs
    session = None
    if plan.jobs == 1 and not args.resume:
        if out_dir.is_dir():  # another run in this folder: refused now, before a worker starts
            _lock_out(out_dir)
        # Start-up off the critical path: the worker starts first, everything else happens meanwhile.
        session = pipeline.checker(plan, background=True)
    try:
        return _fuzz_prepared(args, plan, session, json_path, out_dir)
    finally:
        if hasattr(session, "close"):
            session.close()


def _fuzz_prepared(args, plan, session, json_path: Optional[Path], out_dir: Path) -> int:
    """``cmd_fuzz`` once the plan is made and the worker is starting: strategies, database, the run."""
    from kvfence.engine import campaign
    from kvfence.engine import run as pipeline

    # Validates every pinned field and the budget now (BadInput), not inside Hypothesis.
    strategy, shard_info = pipeline.draws(plan, args.shard)
    seed, seed_source = (args.seed, "given") if args.seed is not None else (random.getrandbits(32), "random")
    run = dict(pipeline.run_record(plan, seed, seed_source), resume=bool(args.resume))
    # The example database: a malformed URL here, an unreachable Redis below, both before any work.
    if args.database is None:
        args.database = campaign.default_database(out_dir)  # --jobs children share it
    db_spec = campaign.parse_database(args.database)
    if db_spec.password:  # --jobs children get it from the environment, never on their command line
        os.environ[campaign.REDIS_PASSWORD_ENV] = db_spec.password
        args.database = db_spec.display
    db_key = pipeline.database_key(plan, args.shard)
    if plan.jobs > 1:
        database = campaign.open_database(db_spec)
        run["campaign"] = campaign.summary_block(db_spec, db_key, shard_info, None,
                                                 campaign.stored_failures(database, db_key))
        return _fuzz_jobs(args, plan, run, out_dir, json_path)
    previous = _previous_summary(out_dir) if args.resume else None
    if out_dir.is_dir():  # another run in this folder: refused now
        _lock_out(out_dir)
    database = None if args.resume else campaign.open_database(db_spec)
    run["campaign"] = campaign.summary_block(db_spec, db_key if database is not None else None, shard_info,
                                             campaign.shard_seed(seed, args.shard),
                                             campaign.stored_failures(database, db_key))
    if hasattr(session, "wait_ready"):
        session.wait_ready()  # resolves the kernel in the worker: BadInput here, before the first example
    return _fuzz_run(args, plan, strategy, session, out_dir, json_path, previous, run,
                     database=database, db_key=db_key, db_spec=db_spec)


#: Errnos of storage that stopped taking writes: a full disk or quota, a filesystem remounted read-only.
_FULL_DISK = ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO")


def _fuzz_command(args) -> int:
    """``fuzz``: ``cmd_fuzz``, then the ``--out`` lock it took is released however it ended."""
    from kvfence.engine import interrupt
    from kvfence.engine import outlock

    interrupt.defer()  # a signal from now on is never lost: the run ends as interrupted, outputs written
    try:
        code = cmd_fuzz(args)
        signalled = interrupt.pending()  # e.g. while the outputs were being written: they were, in full
        return interrupt.exit_code_for(signalled) if signalled else code
    except OSError as exc:
        # Storage that stopped taking writes mid-run (journal, case file): one line, never a traceback.
        # Other OSErrors are not the disk's doing and stay loud.
        import errno as errno_mod

        if exc.filename is None or exc.errno not in {getattr(errno_mod, name, None) for name in _FULL_DISK}:
            raise
        raise _output_failure(exc.filename, exc) from None
    finally:
        outlock.release_all()


def _previous_summary(out_dir: Path) -> Optional[dict]:
    """``--resume`` adds to the folder's summary.json: it must be readable (or absent) before any work."""
    from kvfence.engine.casefile import parse_json_file
    from kvfence.engine.summary import validate

    where = out_dir / "summary.json"
    if not where.exists():
        return None
    try:
        return validate(parse_json_file(where, "summary"), str(where))
    except BadInput as exc:
        raise BadInput(f"--resume adds to {where}, which cannot be read: {exc}") from None


def _fuzz_run(args, plan, strategy, session, out_dir: Path, json_path: Optional[Path], previous, run: dict, *,
              database, db_key, db_spec) -> int:
    from kvfence.engine.loop import SPLICE_REPLAYED, FuzzResult, fuzz
    from kvfence.engine.interrupt import exit_code_for, signals_interrupt
    from kvfence.engine.journal import Journal, recover
    from kvfence.engine.outdir import set_aside_earlier_cases

    _lock_out(out_dir)
    seed, device = run["seed"], plan.device
    if not args.resume:  # --resume adds to the folder's results: its case files stay where they are
        # Before anything is written: the folder's case files from earlier runs go to cases/earlier/<time>/.
        args.earlier_cases = set_aside_earlier_cases(out_dir)
        if args.earlier_cases:
            _stderr(f"kvfence: {args.earlier_cases['count']} case file(s) of an earlier run moved to "
                    f"{args.earlier_cases['folder']}")
    # Cases in flight when an earlier run's process died: CRASH findings (an unusable slot is set aside, said here).
    crashes = recover(out_dir, report=lambda line: _stderr(f"kvfence: {line}"))
    for crash in crashes:
        _stderr(f"kvfence: CRASH: a run died launching a case: {crash.path}")
    if args.resume:
        result = FuzzResult()
        print(f"kvfence fuzz --resume: {len(crashes)} crashed case(s) recovered from {out_dir}")
    else:
        from kvfence.engine.progress import Progress

        progress = None if args.quiet else Progress(args.max_examples, seconds=args.max_seconds)
        callback = progress.update if progress else None
        if args.progress_file:
            from kvfence.engine.jobs import POLL_S, write_progress

            callback = lambda r, path=Path(args.progress_file): write_progress(path, r)  # noqa: E731
        # SIGINT/SIGTERM end fuzz() cleanly (kvfence.engine.interrupt); the journal slot closes as on any exit.
        with Journal(out_dir, device=device) as journal, signals_interrupt():
            run_fuzz, keep_going = fuzz, {"stop_requested": _stop_requested(args)}
            if args.keep_going:  # phases until the budgets are spent; each new failure saved at once
                from kvfence.engine.keepgoing import fuzz_keep_going

                run_fuzz = fuzz_keep_going
                keep_going = {"on_failure": lambda failure: _save_failure(args, run, device, out_dir, failure)}
            try:
                result = run_fuzz(session, strategy, max_examples=plan.max_examples, on_first_failure=_announcer(),
                              seed=run["campaign"]["hypothesis_seed"], database=database, database_key=db_key,
                              shrink_seconds=plan.shrink_seconds, journal=journal, targeting=plan.targeting,
                              progress=callback, max_seconds=plan.max_seconds,
                              progress_every_s=POLL_S if args.progress_file else (progress.every_s if progress else 2.0),
                              **keep_going)
            finally:
                if progress:
                    progress.close()
        if result.interrupted:
            _stderr(f"kvfence: {result.interrupted}: run stopped; writing what was checked")
        if result.bulk_splice and result.bulk_splice != SPLICE_REPLAYED:
            _stderr(f"kvfence: {result.bulk_splice}")
        if run["campaign"]["stored_failures_at_start"]:
            print(f"kvfence fuzz: replayed {run['campaign']['stored_failures_at_start']} stored failure(s) "
                  f"from {db_spec.display} first")
        print(f"kvfence fuzz: {result.verified_cases} cases verified ({result.cached_cases} from cache) in "
              f"{result.elapsed_s:.1f}s ({result.cases_per_s:.1f} verified cases/s, {result.structural_cases_per_s:.1f} "
              f"structurally distinct/s) on {device}, {_target_text(run)}, domain {plan.domain}, "
              f"seed {'random (%d)' % seed if run['seed_source'] == 'random' else seed}")
    run = dict(run, interrupted=result.interrupted, **_phases(session, result))
    if session is not None and not args.in_process:
        run["worker"] = {k: v for k, v in session.stats.items()}
    code = _fuzz_outputs(args, device, result, crashes, out_dir, json_path, run, previous=previous)
    return exit_code_for(result.interrupted) if result.interrupted else code


def _target_text(run: dict) -> str:
    """What a run checked, in one phrase: contract, kernel, sizing, mode (and the draft kernel's layout)."""
    layout = f", layout {run['layout']}" if run.get("layout") else ""
    return (f"contract {run['contract']}, kernel {run['kernel']}, sizing {run['sizing']}, mode {run['mode']}"
            f"{layout}")


def _stop_requested(args):
    """``fuzz(stop_requested=)`` of a ``--jobs`` child: the parent's stop file exists (another job failed)."""
    if not args.stop_file:
        return None
    return lambda path=args.stop_file: os.path.exists(path)


def _clear_progress_line() -> None:
    """On a terminal, erase the progress line (kvfence.engine.progress) before a line of its own."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K")


#: How the first verdict begins on stderr (benchmarks/first_verdict.py times the command to this line).
FIRST_FAILURE = "kvfence: first failure"


def _announce(at: Optional[float], text: Optional[str]) -> None:
    """The first verdict, as soon as it is known (shrinking it may take ``--shrink-seconds`` more)."""
    from kvfence.engine.clock import since_start

    _clear_progress_line()
    _stderr(f"{FIRST_FAILURE} {since_start(at):.2f}s into the command: {text}; shrinking it")


def _announcer():
    """``fuzz(on_first_failure=)`` for one process: the run's first failure only (``--keep-going`` runs
    phases, each with a first failure of its own, and saves each at once)."""
    done = []

    def announce(result) -> None:
        if not done:
            done.append(True)
            _announce(result.first_failure_at, result.first_failure_text)

    return announce


def _announce_job_failure(doc: dict) -> None:
    """``--jobs``: the first failure any job found (its progress file), as soon as the parent sees it."""
    _announce(doc.get("first_failure_at"), doc.get("first_failure_text"))


def _phases(session, result) -> dict:
    """Seconds from the command's start (kvfence.engine.clock) to the worker's ready and the first launch."""
    from kvfence.engine.clock import since_start

    return {"startup_s": since_start(getattr(session, "ready_at", None)),
            "first_launch_s": since_start(result.first_launch_at)}


def _jobs_deadline(plan) -> Optional[float]:
    """A ``--jobs`` run's whole budget, when it has one: exploring and shrinking (and on CUDA the lead's wait)."""
    from kvfence.engine.jobs import LEAD_WAIT_S

    if plan.max_seconds is None:
        return None  # an example budget only: no time the parent could hold a job to
    return (LEAD_WAIT_S if plan.device == "cuda" else 0.0) + plan.max_seconds + plan.shrink_seconds


def _fuzz_jobs(args, plan, run: dict, out_dir: Path, json_path: Optional[Path]) -> int:
    """``--jobs N``: N child fuzz processes (kvfence.engine.jobs), merged into one summary, report and case folder."""
    import time

    from kvfence.engine.loop import SPLICE_REPLAYED
    from kvfence.engine.jobs import adopt_case_files, run_jobs
    from kvfence.engine.progress import Progress
    from kvfence.engine import summary as summary_mod

    jobs, device = plan.jobs, plan.device
    share = [plan.max_examples // jobs + (i < plan.max_examples % jobs) for i in range(jobs)]
    require(min(share) >= 1, f"--jobs {jobs} is more than --max-examples {plan.max_examples}")
    child_args = [_child_args(args._parser, args, seed=run["seed"] + i, max_examples=share[i],
                              max_bytes=plan.max_bytes, host_jobs=jobs) for i in range(jobs)]
    _lock_out(out_dir)
    from kvfence.engine.outdir import set_aside_earlier_cases

    earlier = set_aside_earlier_cases(out_dir)  # this run's report shows only this run's case files
    if earlier:
        _stderr(f"kvfence: {earlier['count']} case file(s) of an earlier run moved to {earlier['folder']}")
    progress = None if args.quiet else Progress(args.max_examples, seconds=args.max_seconds)
    from kvfence.engine.clock import command_start

    start, started_at = time.perf_counter(), command_start()
    try:
        docs, problems, crashes, interrupted, not_started = run_jobs(
            child_args, out_dir, device=device, progress=progress.update if progress else None,
            on_first_failure=_announce_job_failure, stop_on_failure=not args.keep_going,
            deadline_s=_jobs_deadline(plan))
    finally:
        if progress:
            progress.close()
    elapsed = time.perf_counter() - start
    for line in problems:
        _stderr(f"kvfence: {line}")
    adopt_case_files(docs, out_dir)
    doc = summary_mod.merge(docs, run=run, elapsed_s=elapsed, started_at=started_at)
    doc["job_problems"] = problems
    doc["jobs_not_started"] = not_started
    doc["earlier_cases"] = earlier
    doc["interrupted"] = interrupted
    for crash in crashes:
        p = str(crash.path)
        doc["findings"].append(dict(crash.finding.to_dict(), case=p))
        doc["cases"][p] = summary_mod.case_record(p, crash.case, [crash.finding], source="journal")
    adopt_case_files([doc], out_dir)
    started = f"{jobs - not_started} of {jobs} jobs started" if not_started else f"{jobs} jobs"
    print(f"kvfence fuzz: {started}, {doc['verified_cases']} cases verified ({doc['cached_cases']} from cache) in "
          f"{elapsed:.1f}s ({doc['cases_per_s']:.1f} verified cases/s, {doc['structural_cases_per_s']:.1f} "
          f"structurally distinct/s) on {device}, {_target_text(run)}, domain {run['domain']}")
    for path, record in doc["cases"].items():
        print(f"{', '.join(record['kinds'])}: {path}")
    if not doc["findings"]:
        print("no findings")
    if interrupted:
        _stderr(f"kvfence: {interrupted}: jobs stopped; merged what they had checked")
    if doc.get("bulk_splice") and doc["bulk_splice"] != SPLICE_REPLAYED:
        _stderr(f"kvfence: {doc['bulk_splice']}")
    code = _write_summary(doc, out_dir, json_path, program=_program(args))
    if interrupted:
        from kvfence.engine.interrupt import exit_code_for

        return exit_code_for(interrupted)
    return EXIT_FINDINGS if problems and code == EXIT_CLEAN else code


def _program(args) -> str:
    """The name the user ran kvfence by (``kvfence`` or ``python -m kvfence``), from the parser's usage name."""
    parser = getattr(args, "_parser", None)
    return parser.prog.rsplit(" ", 1)[0] if parser is not None else "python -m kvfence"


def _write_summary(doc: dict, out_dir: Path, json_path: Optional[Path], *, previous: Optional[dict] = None,
                   program: str = "python -m kvfence") -> int:
    """summary.json (and --json), report.md / report.html, the table on stdout; the exit code.

    With ``previous`` (``fuzz --resume``) the doc is added to that summary rather than replacing it, and
    the exit code says whether this run found anything new."""
    from kvfence.engine import casefile
    from kvfence.engine import summary as summary_mod
    from kvfence.reports.render import write_reports

    new_findings = bool(doc["findings"])
    from kvfence.engine.interrupt import pending

    if pending() and not doc.get("interrupted"):  # a signal after checking ended: the outputs still say so
        doc["interrupted"] = pending()
    if previous is not None:  # README: "Resuming into a folder"
        doc = summary_mod.merge_resumed(previous, doc)
    # The code stamp (kvfence.provenance): which kvfence wrote this summary, for a figure quoted from it.
    text = json.dumps(stamped(doc), indent=1) + "\n"
    # A disk that fills up (or turns read-only) now, after the case files, is one line and exit 2.
    with _output_errors(out_dir / "summary.json", doc):
        casefile.atomic_write_text(out_dir / "summary.json", text)
    if json_path is not None:
        with _output_errors(json_path, doc):
            casefile.atomic_write_text(json_path, text)
    with _output_errors(out_dir / "report.md", doc):
        written = write_reports(doc, out_dir)
    print()
    print(summary_mod.text_table(doc, program))
    print(f"\nreports: {out_dir / 'summary.json'}, {written['md']}, {written['html']}")
    if written["plot_skipped"]:
        _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
    return EXIT_FINDINGS if new_findings else EXIT_CLEAN


def _case_extras(args, run: dict, *, interrupted: Optional[str], shrink_cut: bool) -> dict:
    """What a fuzz case file records besides the case: how it was found and how far it was shrunk."""
    extras = {"fuzz": {"seed": run["seed"], "max_examples": args.max_examples, "domain": run["domain"]}}
    if run.get("seq_len_limit"):
        extras["fuzz"]["seq_len_limit"] = run["seq_len_limit"]
    if interrupted:
        extras["interrupted"] = {"signal": interrupted, "shrunk": False,
                                 "note": "the run was stopped before shrinking finished: the case may not be minimal"}
    if shrink_cut:
        extras["shrink"] = {"cut": True, "shrink_seconds": args.shrink_seconds,
                            "note": "shrunk as far as it got within --shrink-seconds: the case may not be minimal"}
    return extras


def _save_failure(args, run: dict, device: str, out_dir: Path, failure) -> str:
    """``--keep-going``: write one distinct failure's case file as soon as it is found; its path."""
    from kvfence.engine import casefile

    extras = _case_extras(args, run, interrupted=failure.interrupted, shrink_cut=failure.shrink_cut)
    extras["hypothesis"] = failure.hypothesis or {"unavailable": "the final replay did not run"}
    extras["fuzz"]["keep_going_phase"] = failure.phase + 1
    where = out_dir / casefile.CASES_DIR / f"{casefile.case_hash(failure.case)}.json"
    try:
        return str(casefile.write_case(failure.case, failure.findings, out_dir=out_dir, device=device,
                                       source="fuzz", extras=extras))
    except OSError as exc:
        from kvfence.engine.casefile import format_failure

        print(format_failure(failure.case, failure.findings, limit=20))  # the finding is never lost
        raise _output_failure(where, exc, {"findings": failure.findings}) from None


def _fuzz_outputs(args, device: str, result, crashes, out_dir: Path, json_path: Optional[Path], run: dict, *,
                  previous: Optional[dict] = None) -> int:
    """The fuzz run's outputs: case file, summary table, summary.json (and --json), report.md/html."""
    from kvfence.engine import casefile
    from kvfence.engine import summary as summary_mod

    case_path = None
    if result.failures:  # --keep-going: every distinct failure already has its case file
        from kvfence.engine.casefile import format_failure

        for failure in result.failures:
            print(format_failure(failure.case, failure.findings, limit=20))
            print(f"  case file: {failure.path}")
        case_path = result.failures[0].path
    elif result.findings:
        from kvfence.engine.casefile import format_failure

        extras = _case_extras(args, run, interrupted=result.interrupted, shrink_cut=result.shrink_cut)
        extras["hypothesis"] = result.hypothesis or {"unavailable": "the final replay did not run"}
        print(format_failure(result.case, result.findings, limit=20))  # first: the finding is never lost
        with _output_errors(out_dir / casefile.CASES_DIR / f"{casefile.case_hash(result.case)}.json",
                            {"findings": result.findings}):
            case_path = str(casefile.write_case(result.case, result.findings, out_dir=out_dir, device=device,
                                                source="fuzz", extras=extras))
        if result.shrink_cut:
            print(f"(shrinking stopped after --shrink-seconds {args.shrink_seconds:g}; the case may not be minimal)")
        if result.interrupted:
            print(f"(interrupted by {result.interrupted} before shrinking finished; the case may not be minimal)")
    elif not crashes:
        print("no findings")
    from kvfence.engine.clock import command_start

    doc = summary_mod.build(result, run=run, case_path=case_path, crashes=crashes, versions=casefile.versions(),
                            earlier=getattr(args, "earlier_cases", None), started_at=command_start())
    if result.keep_going is not None:
        for failure in result.failures[1:]:
            doc["findings"] += [dict(f.to_dict(), case=failure.path) for f in failure.findings]
            doc["cases"][failure.path] = summary_mod.case_record(failure.path, failure.case, failure.findings,
                                                                 source="fuzz")
        doc["keep_going"] = result.keep_going
        print(f"kvfence fuzz --keep-going: {result.keep_going['distinct_failures']} distinct failure(s) in "
              f"{result.keep_going['phases']} phase(s) ({result.keep_going['duplicates']} found again and dropped)")
    return _write_summary(doc, out_dir, json_path, previous=previous, program=_program(args))


def add_parser(sub) -> None:
    fz = sub.add_parser("fuzz", help="fuzz the kernel against the oracle inside guarded buffers",
                        description="Fuzz the kernel against the oracle inside guarded buffers; a failure is "
                                    "shrunk and saved as a case file under --out/cases/.",
                        epilog=_exit_codes(one="findings (the shrunk case file and the reports are written)"))
    _add_target_args(fz)
    _add_config_args(fz)
    _add_family_args(fz)
    fz.add_argument("--max-examples", type=_positive_int, default=None,
                    help=f"Hypothesis examples to generate (default: {DEFAULT_MAX_EXAMPLES} on the CPU; on CUDA no "
                         f"example budget, the run is bounded by --max-seconds)")
    fz.add_argument("--seed", type=_non_negative_int, default=None,
                    help="Hypothesis seed for a repeatable run (default: random)")
    fz.add_argument("--shrink-seconds", type=_seconds(False), default=60.0, help="time budget for shrinking a failure (0: report the first failing case unshrunk)")
    fz.add_argument("--json", default=None, help="also write the JSON summary here (default: only --out/summary.json)")
    fz.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    fz.add_argument("--batches-per-example", type=_positive_int, default=None,
                    help=f"up to N batches of one config per Hypothesis example (config-major: one compile and "
                         f"capture, many replays; default {GPU_BATCHES_PER_EXAMPLE} on CUDA, 1 on the CPU)")
    fz.add_argument("--bulk-per-example", type=_non_negative_int, default=None, metavar="N",
                    help=f"after the Hypothesis batches of an example, up to N more of its config from a fast seeded "
                         f"generator (same draw code, each structure new; a failure among them is spliced back into "
                         f"Hypothesis and shrunk); 0: off (default {GPU_BULK_PER_EXAMPLE} on CUDA, 0 on the CPU)")
    fz.add_argument("--bulk-after", type=_seconds(False), default=None, metavar="SECONDS",
                    help=f"with --bulk-per-example N: keep the bulk off for the first SECONDS of the search, so bugs "
                         f"that die quickly die as fast as without it (default {GPU_BULK_AFTER_S:g} on CUDA; 0: from "
                         f"the first example)")
    fz.add_argument("--scale", default=None, choices=["cpu", "gpu"],
                    help="config space: cpu (interpreter-sized: ctx <= 48, max_bs <= 4) or gpu (production-sized: "
                         "max_bs <= 256 in SGLang's capture buckets, ctx <= 131072, topk and steps <= 16, pages "
                         "1-128); default gpu on CUDA, cpu on the CPU")
    fz.add_argument("--max-gpu-mem", default=None, metavar="SIZE",
                    help="device memory one config may take (e.g. 8G, 512M); larger draws are shrunk to fit; "
                         "default 60%% of free GPU memory split over the jobs (4G per job on the CPU)")
    fz.add_argument("--jobs", type=_positive_int, default=None,
                    help="fuzzing processes sharing the GPU(s), merged into one run (default on CUDA: the CPU cores "
                         f"less one, at most 16, and under an example budget one per {MIN_EXAMPLES_PER_JOB} examples; "
                         "1 on the CPU); at most 2 per CPU core and one per GiB of available memory; on CUDA job 0 "
                         "starts first and the others once it has checked an example")
    fz.add_argument("--max-seconds", type=float, default=None,
                    help=f"stop exploring after this many seconds (shrinking a failure has --shrink-seconds; "
                         f"default {DEFAULT_GPU_SECONDS:g} on CUDA when --max-examples is not given, none on the CPU); "
                         f"the summary's ended_by says which budget ended the run")
    fz.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)  # --jobs children report here
    fz.add_argument("--stop-file", default=None, help=argparse.SUPPRESS)  # --jobs children stop when it exists
    fz.add_argument("--host-jobs", type=_positive_int, default=None, help=argparse.SUPPRESS)  # a child's siblings
    fz.add_argument("--no-target", action="store_true",
                    help="skip Hypothesis's target phase on need/width (faster generation, less pressure on limits)")
    fz.add_argument("--keep-going", action="store_true",
                    help="after a failure is shrunk and saved, go on looking for other failures until --max-examples "
                         "or --max-seconds is spent; each distinct failure (finding kinds + config) gets a case file")
    fz.add_argument("--out", default="reports/out",
                    help="folder for cases/, summary.json, report.md and report.html; an earlier run's case "
                         "files there are moved to cases/earlier/<time>/")
    fz.add_argument("--resume", action="store_true",
                    help="only collect cases left in flight by runs that died (reported as CRASH); no new fuzzing")
    fz.add_argument("--database", default=None,
                    help="Hypothesis example database: none, a directory, or redis://HOST:PORT/DB; its failures "
                         "are replayed first (default: OUT/.hypothesis)")
    fz.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                    help="fuzz only shard I of N (1-based): a disjoint part of the config space and seeds "
                         "(default: all of it); auto: the index of a Slurm job array task, auto/N: of a "
                         "Kubernetes Indexed Job of N completions (docs/campaigns.md)")
    _add_worker_args(fz)
    fz.set_defaults(func=_fuzz_command, _parser=fz,
                    fuzz_defaults={a.dest: a.default for a in fz._actions if a.dest != "help"})
