"""``python -m harness COMMAND``: the command line, one module for every subcommand.

Exit codes (``harness.errors``): 0 no finding, 1 findings, 2 bad input or unusable environment, always
as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
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


def _shard(text: str):
    """An argparse type: ``--shard I/N`` (harness.campaign.parse_shard), one-line error otherwise."""
    from harness.campaign import parse_shard

    try:
        return parse_shard(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--shard ")) from None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _writable(path: Optional[str], what: str) -> Optional[Path]:
    """Fail before any work if an output path cannot be written (its folder must exist)."""
    if path is None:
        return None
    p = Path(path)
    require(p.parent.is_dir() if str(p.parent) else True, f"{what} {path}: folder {p.parent} does not exist")
    require(not p.is_dir(), f"{what} {path} is a directory")
    return p


# -- fuzz ---------------------------------------------------------------------------------------------
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
    return p


def cmd_fuzz(args) -> int:
    from harness.device import select
    from harness.targets import resolve_sizing

    json_path = _writable(args.json, "--json")
    resolve_sizing(args.sizing)  # unknown policy: exit 2 before anything runs
    device = select(args.device, announce=_stderr)

    from harness.fuzz import fuzz
    from harness.session import Session
    from strategies import case_runs, cases

    from harness import campaign

    # --shard: this host's part of the config space (harness.campaign); validated here, before work.
    config_strategy, shard_info = _config_strategy(args), None
    if args.shard is not None:
        config_strategy, shard_info = campaign.shard_configs(
            args.shard, lambda **pins: _config_strategy(argparse.Namespace(**{**vars(args), **pins})),
            {name: getattr(args, name) for name in campaign.CELL_FIELDS})
    if args.batches_per_example > 1:
        strategy = case_runs(config_strategy, kernel=args.kernel, seq_len_limit=args.seq_len_limit,
                             max_batches=args.batches_per_example)
    else:
        strategy = cases(config_strategy, kernel=args.kernel, seq_len_limit=args.seq_len_limit)
    # Validate the strategy's arguments now (BadInput), not inside Hypothesis.
    strategy.validate()
    from harness.case import Config

    # The smallest config the pinned fields allow must be valid (e.g. int32 offsets), or nothing could run.
    Config(topk=args.topk or 1, num_steps=args.num_steps or 1, page_size=args.page_size or 1,
           ctx=args.ctx or (args.num_steps or 1) + 1, max_bs=args.max_bs or 1, sizing=args.sizing,
           layout=args.layout, mode=args.mode)
    out_dir = _out_dir(args.out)
    db_spec = campaign.parse_database(campaign.default_database(out_dir) if args.database is None else args.database)
    # Resolves the kernel: BadInput first. The address audit is on by default on the CPU.
    session = None if args.resume else Session(device, args.kernel, audit=False if args.no_audit else None)
    # The example database: an unreachable Redis is exit 2 here, before any case runs.
    database = None if args.resume else campaign.open_database(db_spec)
    db_key = campaign.database_key(kernel=args.kernel, sizing=args.sizing, domain=campaign.fuzz_domain(args))
    campaign_block = campaign.summary_block(db_spec, db_key if database is not None else None, shard_info,
                                            campaign.shard_seed(args.seed, args.shard),
                                            campaign.stored_failures(database, db_key))
    out_dir.mkdir(parents=True, exist_ok=True)

    from harness.fuzz import FuzzResult
    from harness.journal import Journal, recover

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
        with Journal(out_dir, device=device) as journal:
            try:
                result = fuzz(session, strategy, max_examples=args.max_examples,
                              seed=campaign_block["hypothesis_seed"], database=database, database_key=db_key,
                              shrink_seconds=args.shrink_seconds, journal=journal, targeting=not args.no_target,
                              progress=progress.update if progress else None,
                              progress_every_s=progress.every_s if progress else 2.0)
            finally:
                if progress:
                    progress.close()
        if campaign_block["stored_failures_at_start"]:
            print(f"kvfence fuzz: replaying {campaign_block['stored_failures_at_start']} stored failure(s) "
                  f"from {db_spec.display} first")
        print(f"kvfence fuzz: {result.examples} cases checked in {result.elapsed_s:.1f}s "
              f"({result.cases_per_s:.1f} cases/s) on {device}, kernel {args.kernel}, sizing {args.sizing}, "
              f"mode {args.mode}, layout {args.layout}")
    return _fuzz_outputs(args, device, result, crashes, out_dir, json_path,
                         campaign_block=None if args.resume else campaign_block)


def _fuzz_outputs(args, device: str, result, crashes, out_dir: Path, json_path: Optional[Path],
                  campaign_block: Optional[dict] = None) -> int:
    """The fuzz run's outputs: case file, summary table, summary.json (and --json), report.md/html."""
    from harness import casefile
    from reports import summary as summary_mod
    from reports.render import write_reports

    case_path = None
    if result.findings:
        from harness.fuzz import format_failure

        extras = {"hypothesis": result.hypothesis or {"unavailable": "the final replay did not run"},
                  "fuzz": {"seed": args.seed, "seq_len_limit": args.seq_len_limit, "max_examples": args.max_examples}}
        case_path = str(casefile.write_case(result.case, result.findings, out_dir=out_dir, device=device,
                                            source="fuzz", extras=extras))
        print(format_failure(result.case, result.findings, limit=20))
        if result.shrink_cut:
            print(f"(shrinking stopped after --shrink-seconds {args.shrink_seconds:g}; the case may not be minimal)")
    elif not crashes:
        print("no findings")
    run = {"device": device, "kernel": args.kernel, "sizing": args.sizing, "mode": args.mode, "layout": args.layout,
           "seq_len_limit": args.seq_len_limit, "seed": args.seed, "resume": bool(args.resume)}
    if campaign_block is not None:
        run["campaign"] = campaign_block  # database, its key, the shard (harness.campaign)
    doc = summary_mod.build(result, run=run, case_path=case_path, crashes=crashes, versions=casefile.versions())
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
    return EXIT_FINDINGS if doc["findings"] else EXIT_CLEAN


# -- repro / report -------------------------------------------------------------------------------------
def cmd_repro(args) -> int:
    from harness.repro import run_repro

    return run_repro(args.file, device=args.device, kernel=args.kernel, sizing=args.sizing, mode=args.mode,
                     layout=args.layout, absorb=not args.no_absorb, verbose=args.verbose, out=sys.stdout,
                     announce=_stderr)


def cmd_report(args) -> int:
    from harness.casefile import parse_json_file
    from reports.render import write_reports
    from reports.summary import validate

    require((args.dir is None) != (args.merge is None), "report: name one run folder DIR, or --merge DIR... --out OUT")
    if args.merge is not None:
        from reports.merge import merge

        out = Path(args.out)
        doc = merge([Path(d) for d in args.merge], out)
        written = write_reports(doc, out)
        print(f"kvfence report --merge: {len(args.merge)} runs, {doc['examples']} examples, "
              f"{len(doc['cases'])} distinct failing case(s) ({doc['merged']['duplicate_cases']} duplicate(s) "
              f"dropped): {out / 'summary.json'}, {written['md']}, {written['html']}")
        if written["plot_skipped"]:
            _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
        return EXIT_FINDINGS if doc["findings"] else EXIT_CLEAN
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
    fz.add_argument("--shrink-seconds", type=float, default=60.0, help="time budget for shrinking a failure")
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
    fz.add_argument("--database", default=None,
                    help="Hypothesis example database: none, a directory, or redis://HOST:PORT/DB; failures stored "
                         "there are replayed first (default: OUT/.hypothesis)")
    fz.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                    help="fuzz only shard I of N (1-based): a disjoint part of the config space and seeds")
    fz.set_defaults(func=cmd_fuzz)

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
    rp.set_defaults(func=cmd_repro)

    rr = sub.add_parser("report", help="re-render report.md and report.html from DIR/summary.json, or merge runs")
    rr.add_argument("dir", nargs="?", default=None, help="a fuzz --out folder holding summary.json")
    rr.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                    help="merge these fuzz --out folders (hosts, shards) into one report, identical cases once")
    rr.add_argument("--out", default="reports/merged", help="folder of the merged report (default reports/merged)")
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
    except KeyboardInterrupt:
        _stderr("kvfence: interrupted")
        return 130
