"""``kvfence repro FILE``: re-run one case file, of any contract, and print the diff (kvfence.engine.repro).

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

import sys

from kvfence.cli.common import _add_worker_args, _exit_codes, _stderr


def contracts_of(args) -> list:
    """The case file's contract, read as data (a file that cannot be read is the command's own one-line error)."""
    from kvfence.engine.casefile import contract_named

    return contract_named(_case_path(args.file))


def _case_path(path: str, announce=None) -> str:
    """``path``, or where a later run into its folder moved it (``kvfence.engine.outdir.moved_case``): a repro
    line a run printed keeps working after later runs."""
    from kvfence.engine.outdir import moved_case

    moved = moved_case(path)
    if moved is None:
        return path
    if announce is not None:
        announce(f"kvfence: {path} was moved to {moved} by a later run into that folder; replaying it")
    return str(moved)


def cmd_repro(args) -> int:
    from kvfence.engine import registry
    from kvfence.engine.casefile import load_case
    from kvfence.engine.probe import check_plugins
    from kvfence.engine.repro import run_repro

    args.file = _case_path(args.file, _stderr)

    record = registry.get(load_case(args.file).case.contract)  # a file that cannot be read: one line, first
    # The plug-ins named here are imported in a throwaway process first: their import cannot end this one.
    check_plugins(record, {"kernel": args.kernel, "sizing": args.sizing})
    return run_repro(args.file, device=args.device, kernel=args.kernel, sizing=args.sizing, mode=args.mode,
                     layout=args.layout, absorb=not args.no_absorb, verbose=args.verbose, out=sys.stdout,
                     announce=_stderr, trust_case=args.trust_case, in_process=args.in_process,
                     case_timeout=args.case_timeout)


def add_parser(sub) -> None:
    rp = sub.add_parser("repro", help="re-run one case file and print the diff (exit 1 if a finding reproduces)",
                        description="Re-run one case file and print the diff against the oracle.",
                        epilog=_exit_codes(zero="the case passes", one="a finding reproduces"))
    rp.add_argument("file", help="a case file, e.g. reports/out/cases/<hash>.json")
    rp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernel; auto: cuda when present")
    rp.add_argument("--kernel", default=None,
                    help="run another kernel on this case, does my fix work? (default: the case file's kernel)")
    rp.add_argument("--sizing", default=None,
                    help="run this case under another sizing policy (default: the case file's)")
    rp.add_argument("--mode", default=None, choices=["graph", "eager"],
                    help="run this case in another mode (default: the case file's)")
    rp.add_argument("--layout", default=None, choices=["redzone", "production"],
                    help="run it in another layout: redzone (a guard after every row) or production (rows "
                         "contiguous, as upstream; default: the case file's)")
    rp.add_argument("--no-absorb", action="store_true",
                    help="with --layout production: no tail guard, an overflow leaves the allocation (for "
                         "compute-sanitizer runs)")
    rp.add_argument("--verbose", action="store_true",
                    help="every element of each finding, from a re-run of the launch in this process")
    rp.add_argument("--trust-case", action="store_true",
                    help="import the kernel/sizing plug-ins the case file names "
                         "(never done without this or --kernel/--sizing)")
    _add_worker_args(rp)
    rp.set_defaults(func=cmd_repro)
