"""``kvfence mutants``: the mutation self-test of one contract's planted bugs, or every contract's
(kvfence.selftest.mutants); with ``--verifiers both``, the contract's own comparison of its checker's two paths
(found under the entry-point group ``kvfence.verifier_comparisons``: the draft kernel's device verifier against its
oracle path).

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional

from kvfence.cli.common import _exit_codes, _non_negative_int, _positive_int, _stderr, _writable
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require
from kvfence.provenance import stamped

COMPARISONS = "kvfence.verifier_comparisons"
#: What a module registered under ``COMPARISONS`` provides (docs/contract-api.md, "Entry-point groups").
COMPARISON_MEMBERS = ("DEFAULT_EXAMPLES", "run", "row_verdict", "format_table")


def _save(json_path, doc: dict) -> None:
    """After every row: a run cut short (a time limit, Ctrl-C) keeps what it finished."""
    if json_path is not None:
        staging = json_path.with_name(json_path.name + ".tmp")
        staging.write_text(json.dumps(stamped(doc), indent=1) + "\n", encoding="utf-8")
        os.replace(staging, json_path)


def contracts_of(args) -> list:
    return [args.contract] if args.contract else []


def cmd_mutants(args) -> int:
    """Exit 0 when every mutant is caught on its domain in enough seeds, scale mutants stay unreachable on the CPU
    domain, and the references are clean."""
    from kvfence.device import select
    from kvfence.engine import registry
    from kvfence.engine.budget import parse_size
    from kvfence.selftest.mutants import format_table, self_test

    if args.verifiers == "both":
        return _both_verifiers(args)
    names = [args.contract] if args.contract else [n for n in registry.names()
                                                   if registry.builtin(n) and registry.get(n).mutants]
    records = [registry.get(n) for n in names]
    if args.only:
        require(len(records) == 1, "--only names mutants of one contract: give --contract")
    json_path = _writable(args.json, "--json")
    device = select(args.device, announce=_stderr)
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else None
    reports: Dict[str, dict] = {}

    def doc(partial: Optional[dict] = None) -> dict:
        every = dict(reports, **({partial["contract"]: partial} if partial else {}))
        return {"passed": partial is None and all(r["passed"] for r in every.values()), "contracts": every}

    for record in records:
        report = self_test(record, device, seeds=range(args.seed, args.seed + args.seeds),
                           max_examples=args.max_examples, names=args.only, max_bytes=max_bytes,
                           audit=False if args.no_audit else None,
                           on_row=lambda partial: _save(json_path, doc(partial)),
                           progress=None if args.quiet else _stderr)
        reports[record.name] = report
        print(format_table(report))
        _save(json_path, doc())
    return EXIT_CLEAN if doc()["passed"] else EXIT_FINDINGS


def _both_verifiers(args) -> int:
    """``mutants --verifiers both``: the contract's comparison of its own checker's two paths on the same cases of
    every mutant and the reference (exit 1 on any disagreement)."""
    from importlib import import_module
    from importlib.metadata import entry_points

    from kvfence.device import select
    from kvfence.engine import casefile
    from kvfence.engine.budget import parse_size
    from kvfence.engine.registry import default_name

    contract = args.contract or default_name()
    found = [ep for ep in entry_points(group=COMPARISONS) if ep.name == contract]
    require(bool(found), f"--verifiers both: contract {contract} has one checking path (no comparison is "
                         f"registered under {COMPARISONS})")
    compare = import_module(found[0].value)
    missing = [member for member in COMPARISON_MEMBERS if not hasattr(compare, member)]
    require(not missing, f"--verifiers both: {found[0].value} (registered under {COMPARISONS}) lacks "
                         f"{', '.join(missing)}")
    require(args.seeds == 1, "--seeds applies to the mutation self-test; --verifiers both draws --max-examples "
                             "cases per target from --seed")
    require(not args.no_audit, "--no-audit: with --verifiers both the audit only guards host memory and is not "
                               "compared")
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


def add_parser(sub) -> None:
    from kvfence.engine import registry

    mu = sub.add_parser("mutants", help="mutation self-test: every contract's planted bugs must be detected",
                        description="Fuzz every planted bug of a contract (default: of every kvfence contract) under "
                                    "a fixed budget and several seeds, with unpinned draws from the domain it belongs "
                                    "to (cpu or gpu), then the reference kernel (safe sizing) over the same domains, "
                                    "which must stay clean.",
                        epilog=_exit_codes(zero="every mutant detected in >= 95% of the seeds on its domain, scale "
                                                "mutants unreachable on the CPU domain, the references clean "
                                                "(--verifiers both: every case agrees, every planted write seen)",
                                           one="a mutant missed too often, or a finding on a reference "
                                               "(--verifiers both: a disagreement, or a target never dirty)"))
    mu.add_argument("--contract", default=None, choices=registry.names(),
                    help="self-test this contract's planted mutants (default: every kvfence contract's, one after "
                         "another)")
    mu.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernels; auto: cuda when present")
    mu.add_argument("--max-examples", type=_positive_int, default=None,
                    help="example budget per mutant and seed (default: the contract's, per domain: 60 on the CPU "
                         "domain, 16 on the GPU domain, the draft kernel's 150; with --verifiers both, configs per "
                         "target, each a run of batches, default 8)")
    mu.add_argument("--seed", type=_non_negative_int, default=0, help="first Hypothesis seed (default 0)")
    mu.add_argument("--seeds", type=_positive_int, default=1,
                    help="run each mutant under this many seeds (seed, seed+1, ...) and report its detection rate; "
                         "a mutant passes when detected in >= 95%% of them")
    mu.add_argument("--max-gpu-mem", default=None, metavar="SIZE", help="memory budget per config (as for fuzz)")
    mu.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these mutants of --contract (default: every mutant); with --verifiers both "
                         "also 'reference' or a planted write of the contract's comparison")
    mu.add_argument("--verifiers", default="auto", choices=["auto", "both"],
                    help="auto: the self-test, each case checked as fuzz checks it; both: instead, the contract's own "
                         "comparison of its two checking paths on the same cases (exit 1 on any disagreement)")
    mu.add_argument("--json", default=None, help="write the results here (default: not written)")
    mu.add_argument("--no-audit", action="store_true", help="CPU only: turn off the interpreter address audit")
    mu.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    mu.set_defaults(func=cmd_mutants)
