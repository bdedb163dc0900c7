"""``python -m harness COMMAND``: the command line, one module for every subcommand.

Exit codes (``harness.errors``): 0 no finding, 1 findings, 2 bad input or unusable environment, always
as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

from harness.errors import EXIT_BAD_INPUT, EXIT_CLEAN, EXIT_FINDINGS, BadInput, require


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 (no usage dump)."""

    def error(self, message):
        raise BadInput(f"{self.prog}: {message}")


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, with a one-line error naming ``what`` it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "a non-negative integer")


def _seconds(minimum_exclusive: bool):
    """An argparse type: finite seconds, > 0 (``minimum_exclusive``) or >= 0; NaN and inf are refused."""

    def parse(text: str) -> float:
        import math

        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > 0 if minimum_exclusive else value >= 0)
        if not ok:
            what = "a positive" if minimum_exclusive else "a non-negative"
            raise argparse.ArgumentTypeError(f"expected {what} finite number of seconds, got {text!r}")
        return value

    return parse


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _probe_folder(folder: Path, what: str, path) -> None:
    """Create and remove a temp file in ``folder`` (or its nearest existing parent, where the folder
    would be created): the only check that holds for root, read-only mounts and /proc alike."""
    import tempfile

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvfence-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot write in {probe}: {exc.strerror or exc}") from None


def _writable(path: Optional[str], what: str) -> Optional[Path]:
    """Fail before any work if an output path cannot be written (its folder must exist)."""
    if path is None:
        return None
    p = Path(path)
    require(p.parent.is_dir() if str(p.parent) else True, f"{what} {path}: folder {p.parent} does not exist")
    require(not p.is_dir(), f"{what} {path} is a directory")
    require(not p.exists() or p.is_file(), f"{what} {path}: not a regular file")
    _probe_folder(p.parent if str(p.parent) else Path("."), what, path)
    return p


# -- fuzz ---------------------------------------------------------------------------------------------
def _add_worker_args(p: argparse.ArgumentParser) -> None:
    """Where cases run (harness.worker): a worker process that may crash or hang, or this process."""
    from harness.worker import DEFAULT_CASE_TIMEOUT

    p.add_argument("--case-timeout", type=_seconds(True), default=DEFAULT_CASE_TIMEOUT,
                   help="seconds a small case may run before it is a HANG (scaled up by the case's size)")
    p.add_argument("--in-process", action="store_true",
                   help="launch kernels in this process instead of a worker (debugging: a crash ends the run)")


def _add_target_args(p: argparse.ArgumentParser, *, sizing_default: Optional[str] = "safe") -> None:
    p.add_argument("--kernel", default="reference",
                   help="reference, reference-blocked, package.module:attr or path/file.py:attr")
    p.add_argument("--sizing", default=sizing_default,
                   help="eager, fixed, prefix (the seed's bug), safe, or module:attr / file.py:attr")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-audit", action="store_true",
                   help="CPU only: turn off the interpreter address audit (OOB_READ/OOB_WRITE; on by default)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="graph", choices=["graph", "eager"])
    p.add_argument("--layout", default="redzone", choices=["redzone", "production"])
    p.add_argument("--seq-len-limit", default="ctx", choices=["ctx", "ctx-steps"])
    for flag in ("--topk", "--num-steps", "--page-size", "--ctx", "--max-bs"):
        p.add_argument(flag, type=_positive_int, default=None, help="pin this config field (default: drawn)")


def _config_strategy(args):
    from strategies import DEFAULT_MAX_BS, DEFAULT_MAX_CTX, configs

    return configs(topk=args.topk, num_steps=args.num_steps, page_size=args.page_size, ctx=args.ctx,
                   max_bs=args.max_bs, sizing=args.sizing, layout=args.layout, mode=args.mode,
                   max_ctx=DEFAULT_MAX_CTX, max_max_bs=DEFAULT_MAX_BS)


def _out_dir(path: str) -> Path:
    """``--out``: must be a folder or not exist yet (created only once all input has been validated)."""
    p = Path(path)
    require(not p.exists() or p.is_dir(), f"--out {path}: exists and is not a directory")
    _probe_folder(p, "--out", path)
    return p


#: What ``fuzz --resume`` uses; any other flag set away from its default is refused (it would be ignored).
_RESUME_FLAGS = {"out", "device", "json", "quiet", "resume", "in_process", "case_timeout"}


def _check_resume_flags(args) -> None:
    ignored = sorted(dest for dest, default in args.fuzz_defaults.items()
                     if dest not in _RESUME_FLAGS and getattr(args, dest) != default)
    require(not ignored, f"--resume only collects cases left in flight by runs that died; it would ignore "
                         f"{', '.join('--' + d.replace('_', '-') for d in ignored)}: drop them or run without --resume")


def _make_session(args, device: str):
    """The checking session: a worker process (default; crashes and hangs become findings) or, with
    ``--in-process``, this process itself (for debugging the harness)."""
    audit = False if args.no_audit else None
    if args.in_process:
        from harness.session import Session

        return Session(device, args.kernel, audit=audit)
    from harness.worker import RemoteSession

    return RemoteSession(device, args.kernel, audit=audit, case_timeout=args.case_timeout)


def cmd_fuzz(args) -> int:
    from harness.device import select
    from harness.targets import resolve_sizing

    if args.resume:
        _check_resume_flags(args)
    json_path = _writable(args.json, "--json")
    out_dir = _out_dir(args.out)
    resolve_sizing(args.sizing)  # unknown policy: exit 2 before anything runs
    device = select(args.device, announce=_stderr)

    from strategies import case_runs, cases

    if args.batches_per_example > 1:
        strategy = case_runs(_config_strategy(args), kernel=args.kernel, seq_len_limit=args.seq_len_limit,
                             max_batches=args.batches_per_example)
    else:
        strategy = cases(_config_strategy(args), kernel=args.kernel, seq_len_limit=args.seq_len_limit)
    # Validate the strategy's arguments now (BadInput), not inside Hypothesis.
    strategy.validate()
    from harness.case import Config

    # The smallest config the pinned fields allow must be valid (e.g. int32 offsets) and allocatable
    # (which also calls the sizing policy: a bool, non-int or huge width is refused now), or nothing could run.
    Config(topk=args.topk or 1, num_steps=args.num_steps or 1, page_size=args.page_size or 1,
           ctx=args.ctx or (args.num_steps or 1) + 1, max_bs=args.max_bs or 1, sizing=args.sizing,
           layout=args.layout, mode=args.mode).check_size()
    previous = _previous_summary(out_dir) if args.resume else None
    # Resolves the kernel: BadInput first. The address audit is on by default on the CPU.
    session = None if args.resume else _make_session(args, device)
    try:
        return _fuzz_run(args, device, strategy, session, out_dir, json_path, previous)
    finally:
        if hasattr(session, "close"):
            session.close()


def _previous_summary(out_dir: Path) -> Optional[dict]:
    """``--resume`` adds to the folder's summary.json: it must be readable (or absent) before any work."""
    from harness.casefile import parse_json_file
    from reports.summary import validate

    where = out_dir / "summary.json"
    if not where.exists():
        return None
    try:
        return validate(parse_json_file(where, "summary"), str(where))
    except BadInput as exc:
        raise BadInput(f"--resume adds to {where}, which cannot be read: {exc}") from None


def _fuzz_run(args, device: str, strategy, session, out_dir: Path, json_path: Optional[Path], previous) -> int:
    from harness.fuzz import FuzzResult, fuzz
    from harness.interrupt import exit_code_for, signals_interrupt
    from harness.journal import Journal, recover

    out_dir.mkdir(parents=True, exist_ok=True)

    crashes = recover(out_dir)  # cases in flight when an earlier run's process died: CRASH findings
    for crash in crashes:
        _stderr(f"kvfence: CRASH: a run died launching a case: {crash.path}")
    if args.resume:
        result = FuzzResult()
        print(f"kvfence fuzz --resume: {len(crashes)} crashed case(s) recovered from {out_dir}")
    else:
        from harness.progress import Progress

        # With several batches per example the bar counts cases against the most there can be.
        progress = None if args.quiet else Progress(args.max_examples * args.batches_per_example)
        # SIGINT/SIGTERM end fuzz() cleanly (harness.interrupt); the journal slot closes as on any exit.
        with Journal(out_dir, device=device) as journal, signals_interrupt():
            try:
                result = fuzz(session, strategy, max_examples=args.max_examples, seed=args.seed,
                              shrink_seconds=args.shrink_seconds, journal=journal, targeting=not args.no_target,
                              progress=progress.update if progress else None,
                              progress_every_s=progress.every_s if progress else 2.0)
            finally:
                if progress:
                    progress.close()
        if result.interrupted:
            _stderr(f"kvfence: {result.interrupted}: run stopped; writing what was checked")
        print(f"kvfence fuzz: {result.examples} cases checked in {result.elapsed_s:.1f}s "
              f"({result.cases_per_s:.1f} cases/s) on {device}, kernel {args.kernel}, sizing {args.sizing}, "
              f"mode {args.mode}, layout {args.layout}")
    code = _fuzz_outputs(args, device, result, crashes, out_dir, json_path, previous=previous,
                         worker=getattr(session, "stats", None) if not args.in_process else None)
    return exit_code_for(result.interrupted) if result.interrupted else code


def _fuzz_outputs(args, device: str, result, crashes, out_dir: Path, json_path: Optional[Path], *,
                  previous: Optional[dict] = None, worker: Optional[dict] = None) -> int:
    """The fuzz run's outputs: case file, summary table, summary.json (and --json), report.md/html."""
    from harness import casefile
    from reports import summary as summary_mod
    from reports.render import write_reports

    case_path = None
    if result.findings:
        from harness.fuzz import format_failure

        extras = {"hypothesis": result.hypothesis or {"unavailable": "the final replay did not run"},
                  "fuzz": {"seed": args.seed, "seq_len_limit": args.seq_len_limit, "max_examples": args.max_examples}}
        if result.interrupted:
            extras["interrupted"] = {"signal": result.interrupted, "shrunk": False,
                                     "note": "the run was stopped before shrinking finished: the case may not be minimal"}
        case_path = str(casefile.write_case(result.case, result.findings, out_dir=out_dir, device=device,
                                            source="fuzz", extras=extras))
        print(format_failure(result.case, result.findings, limit=20))
        if result.shrink_cut:
            print(f"(shrinking stopped after --shrink-seconds {args.shrink_seconds:g}; the case may not be minimal)")
        if result.interrupted:
            print(f"(interrupted by {result.interrupted} before shrinking finished; the case may not be minimal)")
    elif not crashes:
        print("no findings")
    run = {"device": device, "kernel": args.kernel, "sizing": args.sizing, "mode": args.mode, "layout": args.layout,
           "seq_len_limit": args.seq_len_limit, "seed": args.seed, "resume": bool(args.resume),
           "interrupted": result.interrupted}
    if worker is not None:
        run["worker"] = dict(worker)
    doc = summary_mod.build(result, run=run, case_path=case_path, crashes=crashes, versions=casefile.versions())
    new_findings = bool(doc["findings"])
    if previous is not None:  # --resume adds to the folder's results (README: "Resuming into a folder")
        doc = summary_mod.merge(previous, doc)
    text = json.dumps(doc, indent=1) + "\n"
    casefile.atomic_write_text(out_dir / "summary.json", text)
    if json_path is not None:
        casefile.atomic_write_text(json_path, text)
    written = write_reports(doc, out_dir)
    print()
    print(summary_mod.text_table(doc))
    print(f"\nreports: {out_dir / 'summary.json'}, {written['md']}, {written['html']}")
    if written["plot_skipped"]:
        _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
    return EXIT_FINDINGS if new_findings else EXIT_CLEAN


# -- repro / report -------------------------------------------------------------------------------------
def cmd_repro(args) -> int:
    from harness.repro import run_repro

    return run_repro(args.file, device=args.device, kernel=args.kernel, sizing=args.sizing, mode=args.mode,
                     layout=args.layout, absorb=not args.no_absorb, verbose=args.verbose, out=sys.stdout,
                     announce=_stderr, trust_case=args.trust_case, in_process=args.in_process,
                     case_timeout=args.case_timeout)


def cmd_report(args) -> int:
    from harness.casefile import parse_json_file
    from reports.render import write_reports
    from reports.summary import validate

    folder = Path(args.dir)
    require(folder.is_dir(), f"report {args.dir}: no such directory")
    where = folder / "summary.json"
    doc = validate(parse_json_file(where, "summary"), str(where))
    written = write_reports(doc, folder)
    print(f"kvfence report: {written['md']}, {written['html']}")
    if written["plot_skipped"]:
        _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
    return EXIT_CLEAN


# -- mutants ------------------------------------------------------------------------------------------
def cmd_mutants(args) -> int:
    """The mutation self-test (harness.mutants): exit 0 when every mutant is caught and the reference is clean."""
    from harness.device import select
    from harness.mutants import format_table, run_all

    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    progress = None if args.quiet else (lambda r: _stderr(f"kvfence: {r.name}: "
                                                          f"{'detected' if r.detected else 'not detected'} "
                                                          f"({r.seconds:.1f}s)"))
    report = run_all(device, max_examples=args.max_examples, seed=args.seed, names=args.only or None,
                     audit=False if args.no_audit else None, progress=progress)
    print(format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return EXIT_CLEAN if report.passed else EXIT_FINDINGS


# -- sweep -------------------------------------------------------------------------------------------
def cmd_sweep(args) -> int:
    """The nightly job (harness.sweep): canary fuzzing, then compute-sanitizer on the cases it found."""
    from harness import sanitizer
    from harness.sweep import run_sweep

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    require(tools and all(t in sanitizer.TOOLS for t in tools),
            f"--tools {args.tools!r}: choose from {', '.join(sanitizer.TOOLS)}")
    require(args.cases is None or args.max_examples is None, "--cases and --max-examples exclude each other")
    from harness.targets import resolve_sizing

    resolve_sizing(args.sizing)

    def strategy():
        from strategies import cases, configs

        return cases(configs(sizing=args.sizing, mode=args.mode, layout=args.layout), seq_len_limit="ctx")

    return run_sweep(tools=tools, cases_dir=args.cases, max_examples=args.max_examples or 500, jobs=args.jobs,
                     strategy_factory=strategy, out_dir=_out_dir(args.out), seed=args.seed,
                     max_failing=args.max_failing, sample=args.sample, timeout=args.timeout, announce=_stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness", description="kvfence: differential fuzzing and memory-safety "
                     "harness for the EAGLE draft-decode kv-indices kernel")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    fz = sub.add_parser("fuzz", help="fuzz the kernel against the oracle inside guarded buffers")
    _add_target_args(fz)
    _add_config_args(fz)
    fz.add_argument("--max-examples", type=_positive_int, default=100)
    fz.add_argument("--seed", type=_non_negative_int, default=None, help="Hypothesis seed (deterministic run)")
    fz.add_argument("--shrink-seconds", type=_seconds(False), default=60.0, help="time budget for shrinking a failure")
    fz.add_argument("--json", default=None, help="write a JSON summary here")
    fz.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    fz.add_argument("--batches-per-example", type=_positive_int, default=1,
                    help="up to N batches of one config per Hypothesis example (GPU throughput mode)")
    fz.add_argument("--no-target", action="store_true",
                    help="skip Hypothesis's target phase on need/width (faster generation, less pressure on limits)")
    fz.add_argument("--out", default="reports/out",
                    help="folder for cases/, summary.json, report.md and report.html (default reports/out)")
    fz.add_argument("--resume", action="store_true",
                    help="only collect cases left in flight by runs that died (reported as CRASH); no new fuzzing")
    _add_worker_args(fz)
    fz.set_defaults(func=cmd_fuzz, fuzz_defaults={a.dest: a.default for a in fz._actions if a.dest != "help"})

    rp = sub.add_parser("repro", help="re-run one case file and print the diff (exit 1 if a finding reproduces)")
    rp.add_argument("file", help="a case file, e.g. reports/out/cases/<hash>.json")
    rp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    rp.add_argument("--kernel", default=None, help="run another kernel on this case (does my fix work?)")
    rp.add_argument("--sizing", default=None, help="run this case under another sizing policy")
    rp.add_argument("--mode", default=None, choices=["graph", "eager"], help="run this case in another mode")
    rp.add_argument("--layout", default=None, choices=["redzone", "production"], help="run it in another layout")
    rp.add_argument("--no-absorb", action="store_true",
                    help="guards of MIN_GUARD only: an overflow leaves the allocation (for compute-sanitizer runs)")
    rp.add_argument("--verbose", action="store_true", help="every element of each finding and each program's segment")
    rp.add_argument("--trust-case", action="store_true",
                    help="import the kernel/sizing plug-ins the case file names (never done without this or --kernel/--sizing)")
    _add_worker_args(rp)
    rp.set_defaults(func=cmd_repro)

    rr = sub.add_parser("report", help="re-render report.md and report.html from DIR/summary.json")
    rr.add_argument("dir", help="a fuzz --out folder holding summary.json")
    rr.set_defaults(func=cmd_report)

    mu = sub.add_parser("mutants", help="mutation self-test: every kernels/mutants/ bug must be detected")
    mu.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    mu.add_argument("--max-examples", type=_positive_int, default=30, help="example budget per mutant")
    mu.add_argument("--seed", type=_non_negative_int, default=0, help="Hypothesis seed (default 0)")
    mu.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants (file stems)")
    mu.add_argument("--json", default=None, help="write the results here")
    mu.add_argument("--no-audit", action="store_true", help="CPU only: turn off the interpreter address audit")
    mu.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    mu.set_defaults(func=cmd_mutants)

    sw = sub.add_parser("sweep", help="nightly: canary fuzzing, then compute-sanitizer on failing and sampled cases")
    sw.add_argument("--tools", default=",".join(("memcheck", "initcheck", "racecheck", "synccheck")),
                    help="comma-separated: memcheck,initcheck,racecheck,synccheck")
    sw.add_argument("--cases", default=None, help="re-run the case files in this folder instead of fuzzing")
    sw.add_argument("--max-examples", type=_positive_int, default=None, help="canary examples (default 500)")
    sw.add_argument("--jobs", type=_positive_int, default=1, help="sanitizer processes at a time")
    sw.add_argument("--sizing", default="prefix", help="sizing policy of the canary phase (default prefix)")
    sw.add_argument("--mode", default="eager", choices=["graph", "eager"],
                    help="eager: caching allocator off under the tools (memcheck sees overflows); graph: on")
    sw.add_argument("--layout", default="redzone", choices=["redzone", "production"], help="canary-phase layout")
    sw.add_argument("--max-failing", type=_positive_int, default=12, help="failing cases sent to the tools")
    sw.add_argument("--sample", type=_non_negative_int, default=3, help="passing cases sent to the tools")
    sw.add_argument("--timeout", type=float, default=300.0, help="seconds per sanitizer process")
    sw.add_argument("--seed", type=_non_negative_int, default=None)
    sw.add_argument("--out", default="reports/out", help="folder for sweep.json, sweep.html, cases/ and logs")
    sw.set_defaults(func=cmd_sweep)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except BadInput as exc:
        _stderr(f"kvfence: error: {exc}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # harness.interrupt.Interrupted carries SIGTERM's 143
        _stderr("kvfence: interrupted")
        return getattr(exc, "exit_code", 130)
