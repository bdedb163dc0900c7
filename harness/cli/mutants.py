"""``kvfence mutants``: the mutation self-test (kvfence.selftest.mutants), or both verifiers compared
(kvfence.contracts.draft.compare).

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvfence.cli.common import _exit_codes, _positive_int, _non_negative_int, _stderr, _writable
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require
from kvfence.provenance import stamped


def cmd_mutants(args) -> int:
    """The mutation self-test (kvfence.selftest.mutants): exit 0 when every mutant is caught on its domain in
    enough seeds, scale mutants stay unreachable on the CPU domain, and the reference is clean."""
    from kvfence.contracts.draft.budget import default_budget, parse_size
    from kvfence.device import select
    from kvfence.selftest.mutants import format_table, run_all, verdict_text

    from kvfence import contract as registry

    # A contract whose mutants are planted patches of its kernel (the page-table builders); the draft family's
    # are the files of kernels/draft/mutants/, run below.
    if args.contract is not None and registry.get(args.contract).planted_from_patches:
        return _mutants_contract(args)
    if args.verifiers == "both":
        return _mutants_both_verifiers(args)
    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else default_budget(device)
    seeds = range(args.seed, args.seed + args.seeds)
    partial = {}

    def progress(r):
        # Called after every seed; the finished mutant is printed, and with --json every result so far
        # is kept in JSON.partial, so a self-test cut short by a time limit still leaves its numbers.
        if json_path is not None:
            partial[f"{r.name}@{r.ran_on}"] = r.to_dict()
            casefile.atomic_write_text(Path(str(json_path) + ".partial"), json.dumps(partial, indent=1) + "\n")
        if not args.quiet and len(r.seeds) == len(seeds):
            _stderr(f"kvfence: {r.name} ({r.ran_on} domain): {verdict_text(r)} ({r.seconds:.1f}s)")

    from kvfence.engine import casefile

    names = args.only or None
    if args.contract is not None:  # the draft family's files that break this contract (their CONTRACT)
        from kvfence.selftest.mutants import discover

        names = [m.name for m in discover(names=names) if m.contract == args.contract]
    report = run_all(device, max_examples=args.max_examples, seeds=seeds, names=names,
                     audit=False if args.no_audit else None, progress=progress, max_bytes=max_bytes,
                     verifier=args.verifiers)
    print(format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(stamped(report.to_dict()), indent=2) + "\n")
    return EXIT_CLEAN if report.passed else EXIT_FINDINGS


def _mutants_both_verifiers(args) -> int:
    """``mutants --verifiers both`` (kvfence.contracts.draft.compare): the device verifier and the oracle path on the same
    cases of every mutant, planted bad write and the reference; exit 1 on any disagreement."""
    from kvfence.engine import casefile
    from kvfence.contracts.draft import compare
    from kvfence.contracts.draft.budget import parse_size
    from kvfence.device import select

    require(args.seeds == 1, "--seeds applies to the mutation self-test; --verifiers both draws --max-examples "
                             "cases per target from --seed")
    require(not args.no_audit, "--no-audit: with --verifiers both the audit only guards host memory and is not compared")
    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else None

    def progress(report, row):
        # After every target: with --json the rows so far are kept in JSON.partial (a time limit keeps them).
        if json_path is not None:
            casefile.atomic_write_text(Path(str(json_path) + ".partial"), json.dumps(report.to_dict(), indent=1) + "\n")
        if not args.quiet:
            _stderr(f"kvfence: {row.target.name} ({row.target.domain} domain): {compare.row_verdict(row)}, "
                    f"{row.cases} cases, {row.dirty} dirty ({row.seconds:.1f}s)")

    report = compare.run(device, max_examples=args.max_examples or compare.DEFAULT_EXAMPLES, seed=args.seed,
                         names=args.only or None, max_bytes=max_bytes, progress=progress)
    print(compare.format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(stamped(report.to_dict()), indent=2) + "\n")
    return EXIT_CLEAN if report.passed else EXIT_FINDINGS


def _mutants_contract(args) -> int:
    """``--contract NAME``: the self-test of a contract's planted mutants (``Contract.mutants``), fuzzed by the
    engine every run uses (kvfence.selftest.mutants.contract_self_test)."""
    from kvfence import contract as registry
    from kvfence.device import select
    from kvfence.selftest.mutants import contract_self_test

    record = registry.get(args.contract)
    json_path = _writable(args.json, "--json")
    if args.only:
        for name in args.only:
            record.mutant(name)  # unknown: exit 2 now
    device = select(args.device, announce=_stderr)

    def save(doc: dict) -> None:  # after every row: a run cut short (timeout, Ctrl-C) keeps what it finished
        if json_path is not None:
            staging = json_path.with_name(json_path.name + ".tmp")
            staging.write_text(json.dumps(stamped(doc), indent=1) + "\n", encoding="utf-8")
            os.replace(staging, json_path)

    report = contract_self_test(record, device, seeds=range(args.seed, args.seed + args.seeds),
                       max_examples=args.max_examples or 200, names=args.only,
                       progress=None if args.quiet else _stderr, on_row=save)
    for row in report["rows"]:
        times = sorted(r["search_s"] for r in row["runs"] if r.get("search_s") is not None)
        median = f"{times[len(times) // 2]:.2f} s" if times else "-"
        what = "detected" if row["detects"] else "clean"
        print(f"{row['name']:<40} {what} in {row['good']}/{row['seeds']} seeds; median search {median}; "
              f"kinds {sorted({k for r in row['runs'] for k in r['kinds']})}")
    print("PASSED" if report["passed"] else "FAILED")
    save(report)
    return EXIT_CLEAN if report["passed"] else EXIT_FINDINGS


def add_parser(sub) -> None:
    mu = sub.add_parser("mutants", help="mutation self-test: every kernels/draft/mutants/ bug must be detected",
                        description="Fuzz every bug in kernels/draft/mutants/ under a fixed budget and several seeds, with "
                                    "unpinned draws from the domain it belongs to (cpu or gpu), then the reference "
                                    "kernel (safe sizing) over the same domains, which must stay clean.",
                        epilog=_exit_codes(zero="every mutant detected in >= 95% of the seeds on its domain, scale "
                                                "mutants unreachable on the CPU domain, the reference clean "
                                                "(--verifiers both: every case agrees, every planted write seen)",
                                           one="a mutant missed too often, or a finding on the reference "
                                               "(--verifiers both: a disagreement, or a target never dirty)"))
    mu.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernels; auto: cuda when present")
    mu.add_argument("--max-examples", type=_positive_int, default=None,
                    help="example budget per mutant and seed (default: 60 on the CPU domain, 100 on the GPU "
                         "domain; with --verifiers both, configs per target, each a run of batches, default 8)")
    mu.add_argument("--seed", type=_non_negative_int, default=0, help="first Hypothesis seed (default 0)")
    mu.add_argument("--seeds", type=_positive_int, default=1,
                    help="run each mutant under this many seeds (seed, seed+1, ...) and report its detection rate; "
                         "a mutant passes when detected in >= 95%% of them")
    mu.add_argument("--max-gpu-mem", default=None, metavar="SIZE", help="memory budget per config (as for fuzz)")
    mu.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these mutants, by file stem (default: every mutant); with --verifiers both "
                         "also 'reference' or a planted write of kernels/draft/planted.py")
    mu.add_argument("--verifiers", default="auto", choices=["auto", "oracle", "device", "both"],
                    help="the verifier of the self-test's sessions (auto: device on CUDA, oracle on the CPU); "
                         "both: instead of the self-test, judge every mutant, planted bad write and the reference "
                         "on both paths, same cases, and compare verdicts, counters and findings (exit 1 on any "
                         "disagreement)")
    mu.add_argument("--json", default=None, help="write the results here (default: not written)")
    mu.add_argument("--no-audit", action="store_true", help="CPU only: turn off the interpreter address audit")
    mu.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    from kvfence import contract as registry

    mu.add_argument("--contract", default=None, choices=registry.names(),
                    help="self-test this contract's planted mutants (docs/contract.md §9); default, draft or "
                         "window-rail: the draft family's, kernels/draft/mutants/")
    mu.set_defaults(func=cmd_mutants)
