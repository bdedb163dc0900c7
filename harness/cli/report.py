"""``kvfence report``: re-render a run folder's reports, or merge run folders (kvfence.reports).

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

from pathlib import Path

from kvfence.cli.common import _exit_codes, _lock_out, _out_dir, _stderr
from kvfence.engine.fuzzrun import output_errors as _output_errors
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require


def contracts_of(args) -> list:
    """The contracts of the runs a report renders (their summaries' and case files' ``contract``, read as data)."""
    from kvfence.engine.casefile import contract_named

    folders = [args.dir] if args.dir is not None else list(args.merge or [])
    return [name for folder in folders for path in sorted(Path(folder).glob("summary.json")) +
            sorted(Path(folder).glob("cases/*.json")) for name in contract_named(path)]


def cmd_report(args) -> int:
    from kvfence.engine.casefile import parse_json_file
    from kvfence.engine.summary import validate
    from kvfence.reports.render import write_reports

    require((args.dir is None) != (args.merge is None), "report: name one run folder DIR, or --merge DIR... --out OUT")
    if args.merge is not None:
        from kvfence.engine import outlock
        from kvfence.reports.merge import merge

        out = _out_dir(args.out)
        try:  # the --out lock of fuzz, taken once every input is validated: no run and no merge write over it
            doc = merge([Path(d) for d in args.merge], out, before_writing=lambda: _lock_out(out))
            with _output_errors(out / "report.md", doc):
                written = write_reports(doc, out)
        finally:
            outlock.release_all()
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
    return EXIT_FINDINGS if doc["findings"] else EXIT_CLEAN


def add_parser(sub) -> None:
    rr = sub.add_parser("report", help="re-render report.md and report.html from DIR/summary.json, or merge runs",
                        epilog=_exit_codes(zero="reports written; the run (or the merged runs) has no finding",
                                           one="reports written; the run (or the merged runs) has findings",
                                           two="bad input, e.g. no valid DIR/summary.json (one line on stderr)"))
    rr.add_argument("dir", nargs="?", default=None, help="a fuzz --out folder holding summary.json")
    rr.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                    help="merge these fuzz --out folders (hosts, shards, nights) into one report; identical "
                         "failing cases are kept once (default: off)")
    rr.add_argument("--out", default="reports/out/merged", help="folder of the merged report")
    rr.set_defaults(func=cmd_report)
