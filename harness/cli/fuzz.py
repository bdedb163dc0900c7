"""``kvfence fuzz``: fuzz a kernel against its contract's oracle inside guarded buffers.

The flags become one ``RunPlan`` (``plan_from_args``: every default resolved and every value validated here,
once), and the run is ``kvfence.engine.fuzzrun`` on that plan; ``--jobs`` children get their plan as data
(``--plan FILE``, written by the parent), never a rebuilt command line.

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from kvfence.cli.common import (
    _add_config_args,
    _add_contract_arg,
    _add_target_args,
    _add_worker_args,
    _exit_codes,
    _non_negative_int,
    _out_dir,
    _positive_int,
    _seconds,
    _stderr,
    _writable,
    add_declared_options,
    declared_pins,
)
from kvfence.contract import Option
from kvfence.engine.registry import default_name
from kvfence.errors import BadInput, require

#: What ``fuzz --resume`` uses; any other flag set away from its default is refused (it would be ignored).
RESUME_FLAGS = {"out", "device", "json", "quiet", "resume", "in_process", "case_timeout"}
#: The default budgets: the CPU's interpreter checks an example budget; on CUDA the plain command checks what
#: the machine can check in ``DEFAULT_GPU_SECONDS`` (on every core, ``default_jobs``).
DEFAULT_MAX_EXAMPLES = 100
DEFAULT_GPU_SECONDS = 60.0
#: Examples a ``--jobs`` child should get at least, so process start-up does not dominate a short run.
MIN_EXAMPLES_PER_JOB = 50
#: Batches of one config per Hypothesis example on CUDA (config-major: compile and capture once, replay many),
#: and the bulk after them, off by default (a contract's ``case_runs(bulk=)``: batches drawn by a seeded PRNG,
#: new in structure by construction; ``--bulk-per-example N`` turns it on, after ``--bulk-after`` seconds of
#: search). What they decide is time to a kill: many batches of one config spend the example on that config
#: while the bugs that need a rare config wait for the next. On the H200 (8 runs sharing the GPU, 3-4 seeds),
#: 8 Hypothesis batches with no bulk had the lower median search time on 25 of the 31 shipped mutants against a
#: bulk of 64, and on 25 of 31 against a bulk of 256 opened after 5 s (BENCHMARKS.md, "Time to a kill"). The
#: bulk raises the structural rate, not the kill rate: it stays an option for long campaigns.
GPU_BATCHES_PER_EXAMPLE = 8
GPU_BULK_PER_EXAMPLE = 0
#: Seconds of search before a bulk that is turned on opens (until then an example is what bulk-off draws).
GPU_BULK_AFTER_S = 5.0


def _shard(text: str) -> str:
    """An argparse type: ``--shard I/N``, ``auto`` or ``auto/N`` (kvfence.engine.campaign.parse_shard), resolved
    now (``auto`` from the scheduler's environment), one-line error otherwise."""
    from kvfence.engine.campaign import parse_shard

    try:
        return str(parse_shard(text))
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None


def default_jobs(device: str, max_examples: int, max_seconds) -> int:
    """All usable CPU cores on CUDA (``kvfence.device.usable_cores``; one left for the parent and the
    driver), fewer when the example budget is too small to keep them busy; one process on the CPU (the
    interpreter is the bottleneck)."""
    if device != "cuda":
        return 1
    from kvfence.device import usable_cores

    cores = max(1, usable_cores() - 1)
    if max_seconds is not None:
        return min(cores, 16)
    return max(1, min(cores, 16, max_examples // MIN_EXAMPLES_PER_JOB))


def _jobs(args, device: str, max_examples: int, max_seconds) -> int:
    """``--jobs``, refused in one line when the machine cannot hold it; without it, the default (``default_jobs``)
    cut to what the machine holds now (a host short of memory runs fewer jobs)."""
    from kvfence.engine.jobs import JOB_MEMORY_BYTES, JOBS_PER_CORE, max_jobs

    if args.jobs is None:
        return min(max_jobs(), default_jobs(device, max_examples, max_seconds))
    require(args.jobs <= max_jobs(), f"--jobs {args.jobs}: this machine can hold at most {max_jobs()} jobs "
                                     f"({JOBS_PER_CORE} per CPU core, {JOB_MEMORY_BYTES >> 30} GiB of available "
                                     "memory each)")
    return args.jobs


def _defaults(args) -> dict:
    return args.fuzz_defaults


def plan_from_args(args, device: str):
    """The run's ``RunPlan`` from the flags: the budgets (a time budget alone bounds the run by time; with neither,
    CUDA gets ``DEFAULT_GPU_SECONDS``, the CPU ``DEFAULT_MAX_EXAMPLES``), the domain, jobs, batches per example,
    the bulk, the memory budget and the contract's declared options set away from their defaults (``pins``)."""
    from kvfence.engine.budget import default_budget, parse_size
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.progress import UNBOUNDED_EXAMPLES

    defaults = _defaults(args)
    if args.resume:
        ignored = sorted(dest for dest, default in defaults.items()
                         if dest not in RESUME_FLAGS and getattr(args, dest) != default)
        require(not ignored, f"--resume only collects cases left in flight by runs that died; it would ignore "
                             f"{', '.join('--' + d.replace('_', '-') for d in ignored)}: drop them or run without "
                             "--resume")
    max_seconds = args.max_seconds
    if args.max_examples is None and max_seconds is None and device == "cuda":
        max_seconds = DEFAULT_GPU_SECONDS
    max_examples = args.max_examples or (UNBOUNDED_EXAMPLES if max_seconds is not None else DEFAULT_MAX_EXAMPLES)
    scale = args.scale or ("gpu" if device == "cuda" else "cpu")
    require(not (scale == "gpu" and device != "cuda"),
            "--scale gpu needs --device cuda: production-sized launches under the interpreter would take hours")
    jobs = _jobs(args, device, max_examples, max_seconds)
    cuda = device == "cuda"
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else default_budget(device, jobs)
    pins = declared_pins(args)  # the contract's own flags, given away from their defaults
    return RunPlan(
        contract=args.contract, kernel=args.kernel, sizing=args.sizing, device=device, mode=args.mode,
        layout=args.layout, domain=scale, pins=pins, seed=args.seed, max_examples=max_examples,
        max_seconds=max_seconds, shrink_seconds=args.shrink_seconds,
        batches_per_example=args.batches_per_example or (GPU_BATCHES_PER_EXAMPLE if cuda else 1),
        bulk_per_example=args.bulk_per_example if args.bulk_per_example is not None else (
            GPU_BULK_PER_EXAMPLE if cuda else 0),
        bulk_after=args.bulk_after if args.bulk_after is not None else (GPU_BULK_AFTER_S if cuda else 0.0),
        max_bytes=max_bytes, jobs=jobs, host_jobs=jobs, targeting=not args.no_target, keep_going=args.keep_going,
        isolate=not args.in_process, case_timeout=args.case_timeout, audit=False if args.no_audit else None,
        out=args.out, database=args.database, shard=args.shard, resume=args.resume)


def _program(args) -> str:
    """The name the user ran kvfence by (``kvfence`` or ``python -m kvfence``), from the parser's usage name."""
    parser = getattr(args, "_parser", None)
    return parser.prog.rsplit(" ", 1)[0] if parser is not None else "python -m kvfence"


def _outputs(args, json_path, **job):
    from kvfence.engine.fuzzrun import Outputs
    from kvfence.reports.render import write_reports
    from kvfence.reports.text import text_table

    return Outputs(json=json_path, quiet=args.quiet, program=_program(args), render=write_reports,
                   table=text_table, **job)


def contracts_of(args) -> list:
    """The contract a fuzz run is about (a ``--jobs`` child's plan was checked by its parent), and those of the
    journal slots a dead run left in ``--out`` (this run recovers them with their contracts' code), read as data."""
    from kvfence.engine.journal import contracts_in

    if args.plan is not None:
        return []
    return [args.contract or default_name(), *(contracts_in(args.out) if isinstance(args.out, str) else [])]


def cmd_fuzz(args) -> int:
    from kvfence.device import select
    from kvfence.engine import run as pipeline
    from kvfence.engine.fuzzrun import Run
    from kvfence.engine.jobs import read_job_file

    if args.plan is not None:  # a --jobs child: its plan is data its parent wrote (plug-ins checked there)
        plan, progress_file, stop_file = read_job_file(args.plan)
        select(plan.device, prepare=not plan.isolate)
        outputs = _outputs(args, None, progress_file=progress_file, stop_file=stop_file)
        return Run(plan, outputs, print, _stderr).run()
    json_path = _writable(args.json, "--json")
    _out_dir(args.out)
    from kvfence.engine.probe import check_plugins
    from kvfence.engine.registry import get

    check_plugins(get(args.contract), {"kernel": args.kernel, "sizing": args.sizing})  # their import cannot end us
    # Only the process that launches kernels imports torch: the supervisor and a --jobs parent do not.
    device = select(args.device, announce=_stderr, prepare=bool(args.in_process))
    plan = plan_from_args(args, device)
    pipeline.record(plan)  # the plan against the contract (its options, kernel, sizing): exit 2 before anything
    return Run(plan, _outputs(args, json_path), print, _stderr).run()


def _fuzz_command(args) -> int:
    """``fuzz``: ``cmd_fuzz``, then the ``--out`` lock it took is released however it ended."""
    import errno as errno_mod

    from kvfence.engine import interrupt, outlock
    from kvfence.engine.fuzzrun import FULL_DISK, output_failure

    interrupt.defer()  # a signal from now on is never lost: the run ends as interrupted, outputs written
    try:
        code = cmd_fuzz(args)
        signalled = interrupt.pending()  # e.g. while the outputs were being written: they were, in full
        if signalled and interrupt.only_after_outputs():
            # The summary, written before the signal, says the run was not interrupted: the exit status agrees.
            _stderr(f"kvfence: {signalled} came after the run's outputs were written: they are complete, and the "
                    "exit status is theirs")
            return code
        return interrupt.exit_code_for(signalled) if signalled else code
    except OSError as exc:
        # Storage that stopped taking writes mid-run (journal, case file): one line, never a traceback.
        # Other OSErrors are not the disk's doing and stay loud.
        if exc.filename is None or exc.errno not in {getattr(errno_mod, name, None) for name in FULL_DISK}:
            raise
        raise output_failure(exc.filename, exc) from None
    finally:
        outlock.release_all()


def add_run_flags(fz, contract: str, options: Sequence[Option]) -> None:
    """The flags that say what one fuzz run checks and how long (target, config, budgets, database, workers):
    ``fuzz``'s, and ``campaign``'s, which hands them to each shard's ``fuzz`` (kvfence.cli.campaign); then the
    flags ``contract`` declares (``options``, its ``Contract.options``)."""
    from kvfence.engine.jobs import FOLLOWER_MIN_LEFT_S

    _add_target_args(fz)
    _add_config_args(fz)
    _add_contract_arg(fz)
    fz.add_argument("--max-examples", type=_positive_int, default=None,
                    help=f"Hypothesis examples to generate (default: {DEFAULT_MAX_EXAMPLES} on the CPU; on CUDA no "
                         f"example budget, the run is bounded by --max-seconds)")
    fz.add_argument("--seed", type=_non_negative_int, default=None,
                    help="Hypothesis seed for a repeatable run (default: random)")
    fz.add_argument("--shrink-seconds", type=_seconds(False), default=60.0,
                    help="time budget for shrinking a failure (0: report the first failing case unshrunk)")
    fz.add_argument("--batches-per-example", type=_positive_int, default=None,
                    help=f"up to N cases of one config per Hypothesis example (config-major: one compile and "
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
                    help="config space: cpu (interpreter-sized) or gpu (production-sized: the draft kernel's max_bs "
                         "<= 256 in SGLang's capture buckets, ctx <= 131072, topk and steps <= 16, pages 1-128); "
                         "default gpu on CUDA, cpu on the CPU")
    fz.add_argument("--max-gpu-mem", default=None, metavar="SIZE",
                    help="device memory one config may take (e.g. 8G, 512M); larger draws are shrunk to fit; "
                         "default 60%% of free GPU memory split over the jobs (4G per job on the CPU)")
    fz.add_argument("--jobs", type=_positive_int, default=None,
                    help="fuzzing processes sharing the GPU(s), merged into one run (default on CUDA: the CPU cores "
                         f"less one, at most 16, and under an example budget one per {MIN_EXAMPLES_PER_JOB} examples; "
                         "1 on the CPU); at most 2 per CPU core and one per GiB of available memory; on CUDA job 0 "
                         "starts first and the others once it has checked an example")
    fz.add_argument("--max-seconds", type=_seconds(True), default=None,
                    help=f"the run's time budget, counted from the command's start (start-up, compiles and graph "
                         f"captures count in it): exploring stops once it is spent, after at least one example; a "
                         f"clean run then ends within the examples in flight plus its outputs (measured: 3.7 s past "
                         f"15 s on a loaded 2-core CPU, 6.6 s past 20 s with 15 jobs on an H100; --jobs followers "
                         f"start only while {FOLLOWER_MIN_LEFT_S:g} s are left); shrinking a "
                         f"failure has --shrink-seconds on top; default {DEFAULT_GPU_SECONDS:g} on CUDA when "
                         f"--max-examples is not given, none on the CPU; the summary's ended_by says which budget "
                         f"ended the run")
    fz.add_argument("--no-target", action="store_true",
                    help="skip Hypothesis's target phase on need/width (faster generation, less pressure on limits)")
    fz.add_argument("--keep-going", action="store_true",
                    help="after a failure is shrunk and saved, go on looking for other failures until --max-examples "
                         "or --max-seconds is spent; each distinct failure (finding kinds + config) gets a case file")
    fz.add_argument("--database", default=None,
                    help="Hypothesis example database: none, a directory, or redis://HOST:PORT/DB; its failures "
                         "are replayed first (default: OUT/.hypothesis)")
    _add_worker_args(fz)
    add_declared_options(fz, contract, options)
    fz.set_defaults(declared_options=tuple(options))


def add_parser(sub, contract: str, options: Sequence[Option]) -> None:
    """``fuzz`` with the flags ``contract`` declares (``options``; kvfence.cli.declared)."""
    fz = sub.add_parser("fuzz", help="fuzz the kernel against the oracle inside guarded buffers",
                        description="Fuzz the kernel against the oracle inside guarded buffers; a failure is "
                                    "shrunk and saved as a case file under --out/cases/.",
                        epilog=_exit_codes(one="findings (the shrunk case file and the reports are written)"))
    add_run_flags(fz, contract, options)
    fz.add_argument("--json", default=None, help="also write the JSON summary here (default: only --out/summary.json)")
    fz.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    fz.add_argument("--plan", default=None, help=argparse.SUPPRESS)  # a --jobs child's plan, written by its parent
    fz.add_argument("--out", default="reports/out",
                    help="folder for cases/, summary.json, report.md and report.html; an earlier run's case "
                         "files there are moved to cases/earlier/<time>/")
    fz.add_argument("--resume", action="store_true",
                    help="only collect cases left in flight by runs that died (reported as CRASH); no new fuzzing")
    fz.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                    help="fuzz only shard I of N (1-based): a disjoint part of the config space and seeds "
                         "(default: all of it); auto: the index of a Slurm job array task, auto/N: of a "
                         "Kubernetes Indexed Job of N completions (docs/campaigns.md)")
    fz.set_defaults(func=_fuzz_command, _parser=fz,
                    fuzz_defaults={a.dest: a.default for a in fz._actions if a.dest != "help"})
