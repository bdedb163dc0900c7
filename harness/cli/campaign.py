"""``kvfence campaign``: the shards of a campaign on an engine (kvfence.campaign; docs/campaigns.md).

The shards come from ``fuzz``'s own flags plus ``--shards N`` (one target), or from ``--plan-file FILE`` (many
targets); each target is parsed by ``fuzz``'s parser and checked against its contract before any shard starts.
``--engine local`` runs them as processes on this host, ``--engine ray`` as Ray tasks (the extra ``kvfence[ray]``;
Ray is imported only then). ``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from kvfence.cli.common import (
    _exit_codes,
    _lock_out,
    _out_dir,
    _Parser,
    _positive_int,
    _seconds,
    _stderr,
    declared_options_of,
    declared_pins,
    parse_command_line,
)
from kvfence.cli.fuzz import add_run_flags
from kvfence.contract import Option
from kvfence.errors import BadInput, require

#: What ``--engine ray`` needs, and where it is missing the one line that says so.
RAY_MISSING = 'kvfence: --engine ray needs Ray: pip install "kvfence[ray]" (or run --engine local)'
#: Seconds a compute-sanitizer follow-up (``kvfence sweep --cases``) may take.
SANITIZER_TIMEOUT_S = 900.0
#: Why CRASH and HANG cases found under the interpreter get no compute-sanitizer follow-up.
CPU_CASES = ("found on the CPU (the Triton interpreter): compute-sanitizer checks CUDA launches; on a GPU host run "
             "kvfence sweep --cases OUT/cases")


def _fuzz_parser(argv: List[str]) -> argparse.ArgumentParser:
    """``fuzz``'s parser (``kvfence.cli.fuzz.add_parser``, the one ``kvfence fuzz`` uses) with the flags the
    contract ``argv`` names declares: every target's flags are parsed by it."""
    from kvfence.cli import fuzz

    parser = _Parser(prog="kvfence")
    contract, options = declared_options_of(["fuzz", *argv], ["fuzz"], True)
    fuzz.add_parser(parser.add_subparsers(dest="command", parser_class=_Parser), contract, options)
    return parser


def _check_target(argv: List[str]) -> argparse.Namespace:
    """A target's flags parsed as ``fuzz`` parses them, and checked against its contract (pins it takes, a sizing
    it knows, a kernel spec of the right shape): a bad target is one line before any shard runs."""
    from kvfence.engine import run as pipeline
    from kvfence.engine.plan import RunPlan

    args = parse_command_line(_fuzz_parser(argv), ["fuzz", *argv])
    pipeline.record(RunPlan(contract=args.contract, kernel=args.kernel, sizing=args.sizing, pins=declared_pins(args)))
    return args


def _command_line_target(args) -> dict:
    """The run flags given on the command line (away from their defaults), as a plan target."""
    return {dest.replace("_", "-"): value for dest, value in vars(args).items()
            if dest in args.run_flags and value != args.campaign_defaults.get(dest)}


def _gpus_per_shard(args, targets: List[dict]) -> float:
    """``--gpus-per-shard``, else 0 when every target runs on the CPU and 1 otherwise."""
    if args.gpus_per_shard is not None:
        return args.gpus_per_shard
    return 0.0 if all(t.get("device") == "cpu" for t in targets) else 1.0


def _progress(quiet: bool, total: int):
    done: List[dict] = []

    def on_row(row: dict) -> None:
        done.append(row)
        if quiet:
            return
        findings = sum(r["findings"] for r in done)
        _stderr(f"kvfence campaign: {len(done)}/{total} shards done, {findings} finding(s) so far; {row['shard']} "
                f"{row['status']} on {row['host']}" + (f" GPU {row['gpu']}" if row.get("gpu") else "") +
                f" ({row['examples']} examples, {row['wall_s']:.0f} s)" + (f": {row['note']}" if row['note'] else ""))

    return on_row


def _targets(args) -> List[dict]:
    from kvfence.campaign.shards import read_plan

    base = _command_line_target(args)
    if args.plan_file is None:
        return [base]
    return [dict(base, **target) for target in read_plan(args.plan_file)]


def cmd_campaign(args) -> int:
    from kvfence.campaign import outcome
    from kvfence.campaign.shards import build_shards

    out = _out_dir(args.out)
    require(args.engine == "ray" or (args.address is None and args.max_retries is None),
            "--address and --max-retries are for --engine ray")
    targets = _targets(args)
    seed = args.seed if args.seed is not None else random.randrange(2**31)  # recorded: the campaign is repeatable
    database = args.database or str((out / ".hypothesis").resolve())
    specs = build_shards(targets, default_shards=args.shards, seed=seed, database=database, parse=_check_target,
                         timeout=args.shard_timeout, gpus=_gpus_per_shard(args, targets),
                         planned=args.plan_file is not None)
    engine = _ray_engine() if args.engine == "ray" else None
    _lock_out(out)
    earlier = outcome.set_aside_earlier(out)
    on_row = _progress(args.quiet, len(specs))
    start = time.perf_counter()
    if not args.quiet:
        _stderr(f"kvfence campaign: {len(specs)} shard(s) of {len(targets)} target(s), seed {seed}, engine "
                f"{args.engine}, database {database}")
    if engine is None:
        rows, interrupted, follow_ups = _run_local(args, specs, out, on_row)
    else:
        rows, interrupted, follow_ups = _run_ray(engine, args, specs, out, on_row)
    doc = follow_ups(outcome.merged_shards(out, rows))
    run = {"engine": args.engine, "address": args.address, "seed": seed, "database": database,
           "shards": len(specs), "targets": len(targets), "wall_s": round(time.perf_counter() - start, 3),
           "interrupted": interrupted, "sanitizer": doc.pop("_sanitizer") if doc else _no_follow_ups([])}
    doc = outcome.write(out, doc, rows, run, earlier)
    _report(doc, out, run)
    if interrupted:
        return 128 + {"SIGINT": 2, "SIGTERM": 15}.get(interrupted, 2)
    return outcome.exit_code(doc)


def _no_follow_ups(cases: list, why: str = "") -> dict:
    return {"cases": len(cases), "status": "skipped" if cases else "none",
            "why": (why or CPU_CASES) if cases else "", "results": []}


def _report(doc: dict, out: Path, run: dict) -> None:
    statuses: Dict[str, int] = {}
    for r in doc["shards"]:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    print(f"kvfence campaign: {len(doc['shards'])} shard(s) ({', '.join(f'{n} {s}' for s, n in statuses.items())}), "
          f"{doc['examples']} examples, {len(doc['findings'])} finding(s) in {len(doc['cases'])} case file(s), "
          f"{run['wall_s']:.1f} s: {out / 'summary.json'}")
    for path in doc["cases"]:
        print(f"  kvfence repro {path}")
    for line in doc["shard_problems"]:
        _stderr(f"kvfence campaign: {line}")
    sanitizer = run["sanitizer"]
    if sanitizer["cases"] and sanitizer["status"] == "skipped":
        _stderr(f"kvfence campaign: compute-sanitizer follow-ups skipped for {sanitizer['cases']} CRASH/HANG "
                f"case(s): {sanitizer['why']}")


def _run_local(args, specs, out: Path, on_row):
    from kvfence.campaign import outcome
    from kvfence.campaign.local import gpu_slots, run_local
    from kvfence.device import usable_cores
    from kvfence.engine.jobs import visible_gpus

    gpus = visible_gpus() if specs[0].gpus > 0 else []
    slots = gpu_slots(gpus, specs[0].gpus)
    parallel = args.parallel or (len(slots) if slots else usable_cores())
    rows, interrupted = run_local(specs, out, parallel=parallel, slots=slots, on_row=on_row)

    def follow_ups(doc):
        cases, on_cpu = outcome.follow_up_cases(doc)
        if doc is not None:
            doc["_sanitizer"] = _local_follow_ups(cases, out, interrupted) if cases else _no_follow_ups(on_cpu)
        return doc

    return rows, interrupted, follow_ups


def _local_follow_ups(cases: List[Path], out: Path, interrupted) -> dict:
    from kvfence.campaign.task import run_command

    if not cases or interrupted:
        return _no_follow_ups(cases, "the campaign was interrupted" if cases else "")
    results = [run_command(cmd, out / "sanitizer" / name, SANITIZER_TIMEOUT_S)
               for name, cmd in _sweep_commands(cases, out)]
    return {"cases": len(cases), "status": "ran", "why": "", "results": results}


def _sweep_commands(cases: List[Path], out: Path) -> List[tuple]:
    """``kvfence sweep --cases FOLDER`` for each case, FOLDER holding that case alone (``OUT/sanitizer/<hash>/in``)."""
    commands = []
    for case in cases:
        folder = out / "sanitizer" / case.stem / "in"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / case.name).write_bytes(case.read_bytes())
        commands.append((case.stem, [sys.executable, "-m", "kvfence", "sweep", "--cases", str(folder.resolve()),
                                     "--tools", "memcheck", "--timeout", f"{SANITIZER_TIMEOUT_S / 2:g}"]))
    return commands


def _ray_engine():
    try:
        from kvfence.campaign import ray_engine
    except ImportError as exc:
        if getattr(exc, "name", "") and exc.name.split(".")[0] == "ray":
            raise BadInput(RAY_MISSING.removeprefix("kvfence: ")) from None
        raise
    return ray_engine


def _run_ray(engine, args, specs, out: Path, on_row):
    from kvfence.campaign import outcome

    owned = engine.connect(args.address or "auto")
    try:
        engine.check_resources(specs, args.cpus_per_shard)
        rows, interrupted = engine.run_ray(specs, out, cpus=args.cpus_per_shard,
                                           retries=3 if args.max_retries is None else args.max_retries, on_row=on_row)
    except BaseException:
        engine.disconnect(owned)
        raise

    def follow_ups(doc):
        try:
            cases, on_cpu = outcome.follow_up_cases(doc)
            if doc is not None:
                if not cases:
                    doc["_sanitizer"] = _no_follow_ups(on_cpu)
                elif not interrupted:
                    results = engine.run_follow_ups(_sweep_commands(cases, out), out, gpus=1.0,
                                                    cpus=args.cpus_per_shard, timeout_s=SANITIZER_TIMEOUT_S)
                    doc["_sanitizer"] = {"cases": len(cases), "status": "ran", "why": "", "results": results}
                else:
                    doc["_sanitizer"] = _no_follow_ups(cases, "the campaign was interrupted" if cases else "")
            return doc
        finally:
            engine.disconnect(owned)

    return rows, interrupted, follow_ups


def add_parser(sub, contract: str, options: Sequence[Option]) -> None:
    """``campaign`` with the flags ``contract`` declares (``options``), handed to each shard's ``fuzz``."""
    from kvfence.campaign.shards import DEFAULT_SHARD_TIMEOUT_S, SHARD_STARTUP_S

    cp = sub.add_parser(
        "campaign", help="run a campaign's shards (fuzz --shard I/N each) on this host or on a Ray cluster, merged",
        description="Run the shards of a campaign -- contract x kernel x sizing x seed block x budget, from fuzz's "
                    "flags and --shards N, or from --plan-file FILE -- each as its own 'kvfence fuzz --shard I/N' "
                    "process "
                    "under a timeout, on this host (--engine local) or as Ray tasks (--engine ray, pip install "
                    "\"kvfence[ray]\"), sharing one example database; merged into one --out folder (summary.json "
                    "with a shards table, cases/, report.md, report.html). docs/campaigns.md.",
        epilog=_exit_codes(one="findings, or a shard that ended without a result (lost, timed out, died, bad input: "
                               "named on stderr and in summary.json's shard_problems); the outputs are written",
                           two="bad input, a bad target in the plan, no Ray for --engine ray, no cluster at "
                               "--address (one line on stderr)") + "\n  130  interrupted (Ctrl-C): what finished is "
                                                                   "merged and written")
    before = {a.dest for a in cp._actions}
    add_run_flags(cp, contract, options)
    run_flags = {a.dest for a in cp._actions} - before
    cp.add_argument("--shards", type=_positive_int, default=1,
                    help="shards of the target (fuzz --shard I/N for I in 1..N; a plan's target may set its own)")
    cp.add_argument("--plan-file", default=None, metavar="FILE",
                    help="a JSON plan of many targets: {\"defaults\": {...}, \"targets\": [{\"contract\": ..., "
                         "\"shards\": N, ...}]} of fuzz flags (docs/campaigns.md); the command line's flags apply "
                         "to every target (default: one target, from the command line)")
    cp.add_argument("--engine", choices=["local", "ray"], default="local",
                    help="local: processes on this host, one GPU each; ray: one Ray task per shard")
    cp.add_argument("--address", default=None,
                    help="--engine ray: auto (the running cluster, RAY_ADDRESS), local (start one on this machine), "
                         "ray://HOST:10001 (Ray Client) or HOST:PORT (default: auto)")
    cp.add_argument("--gpus-per-shard", type=_seconds(False), default=None, metavar="G",
                    help="GPUs a shard holds; a fraction packs shards on a card, e.g. 0.5: two a card (default: 0 "
                         "when every target runs --device cpu, else 1)")
    cp.add_argument("--cpus-per-shard", type=_seconds(True), default=1.0, metavar="C",
                    help="--engine ray: CPUs a shard's task holds")
    cp.add_argument("--parallel", type=_positive_int, default=None,
                    help="--engine local: shards at a time (default: one per GPU slot, or the usable CPU cores)")
    cp.add_argument("--shard-timeout", type=_seconds(True), default=None, metavar="SECONDS",
                    help=f"seconds a shard may run before it is stopped (status timeout; default: its --max-seconds "
                         f"+ --shrink-seconds + {SHARD_STARTUP_S:g}, or {DEFAULT_SHARD_TIMEOUT_S:g} without a time "
                         "budget)")
    cp.add_argument("--max-retries", type=int, default=None,
                    help="--engine ray: times a shard whose worker or node was lost is run again (never a shard "
                         "that found something, crashed or hung; default: 3)")
    cp.add_argument("--out", default="reports/out/campaign",
                    help="folder of the merged run: summary.json (with shards), cases/, reports, shards/<shard>/")
    cp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    cp.set_defaults(func=cmd_campaign, run_flags=run_flags,
                    campaign_defaults={a.dest: a.default for a in cp._actions if a.dest != "help"})
