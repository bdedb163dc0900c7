"""``kvfence upstream fetch|matrix|sizing``: SGLang's own kernels from its wheels (the registered release cache,
kvfence.release.release_matrix; a contract's shipped sizing through kvfence.release.knowledge).

``add_parser(sub)`` adds ``upstream`` to ``sub`` (kvfence.cli.build_parser), each action with its handler as
its ``func``.
"""

from __future__ import annotations

import json
import os
import sys

from kvfence.cli.common import (
    _exit_codes,
    _lock_out,
    _non_negative_int,
    _out_dir,
    _Parser,
    _positive_int,
    _seconds,
    _stderr,
    _writable,
)
from kvfence.errors import EXIT_CLEAN, BadInput, printable, require
from kvfence.provenance import stamped
from kvfence.release.knowledge import shipped


def contracts_of(args) -> list:
    """The contracts an ``upstream`` command asks about (``sizing --contract``, ``matrix --contracts``): a plug-in's
    code runs behind the boundary (kvfence.engine.boundary)."""
    names = [getattr(args, "contract", None)] + (getattr(args, "contracts", None) or "").split(",")
    return [n.strip() for n in names if isinstance(n, str) and n.strip()]


def cmd_upstream(args) -> int:
    """``upstream fetch VERSION``: SGLang's kernels from its wheel into the registered release cache
    (``kvfence.release.knowledge.release_cache``)."""
    from kvfence.release.knowledge import release_cache

    cache = release_cache()
    entry = cache.fetch(args.version, wheel=args.wheel, offline=True if args.offline else None,
                           refresh=args.refresh, announce=_stderr)
    _stderr(f"kvfence: {cache.describe(entry)}")
    print(entry.module_path)
    return EXIT_CLEAN


def _terminal(lines) -> str:
    """Lines that quote a wheel's texts (file names, source), each control character shown escaped: a newline
    inside one line's text (a wheel's) is shown as ``\\n``, never as a line of its own."""
    return "\n".join(printable(line, None) for line in lines)


def _set_aside(out_dir) -> None:
    """``out_dir`` is this run's until the command returns (``kvfence.engine.outlock``: a second matrix into it
    is refused, rather than moving this one's live cells away), and an earlier matrix's report in it moves to
    ``out_dir/earlier/`` before this one writes."""
    from kvfence.engine.outdir import set_aside_earlier_report

    _lock_out(out_dir)
    moved = set_aside_earlier_report(out_dir)
    if moved:
        _stderr(f"kvfence: the earlier report in {out_dir} ({moved['count']} entries) moved to {moved['folder']}")


def cmd_upstream_sizing(args) -> int:
    """``upstream sizing VERSION [--contract C]``: the release's shipped sizing of a contract: its own release
    tooling's listing (``ReleaseTool.sizing_lines``), or its sites' widths (kvfence.release.contract_shipped_matrix)."""
    from kvfence.engine import registry
    from kvfence.release import contract_shipped_matrix as csm

    record = registry.get(args.contract or registry.default_name())
    knowledge = shipped(record.name)
    if knowledge.tool is not None:
        print(_terminal(knowledge.tool.sizing_lines(args.version, _stderr)))
        return EXIT_CLEAN
    require(knowledge.sites, f"contract {record.name} lists no shipped sites")
    lines = csm.sizing_lines(args.version, record, csm.load_record(args.version, record, announce=_stderr))
    print(_terminal(lines))
    return EXIT_CLEAN


def cmd_upstream_shipped_contracts(args, names, out_dir, json_path, offline: bool) -> int:
    """``upstream matrix --shipped --contracts C,...`` for plug-in contracts
    (kvfence.release.contract_shipped_matrix)."""
    from kvfence.device import select
    from kvfence.engine import registry
    from kvfence.release import contract_shipped_matrix as csm
    from kvfence.release import release_matrix as rm

    contracts = [registry.get(n) for n in names]
    for c in contracts:
        require(shipped(c.name).sites, f"contract {c.name} lists no shipped sites (upstream matrix --shipped needs "
                                       "them)")
    if offline:
        os.environ["KVFENCE_OFFLINE"] = "1"
    versions = rm.parse_versions(args.versions, rm.known_releases(offline, announce=_stderr), announce=_stderr)
    device = select(args.device, announce=_stderr)
    _set_aside(out_dir)
    doc = csm.run(contracts, versions, device=device, out=out_dir, progress=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stamped(doc), indent=1) + "\n"
    (out_dir / "shipped.json").write_text(text, encoding="utf-8")
    if json_path is not None:
        json_path.write_text(text, encoding="utf-8")
    report = out_dir / "report.md"
    report.write_text(csm.markdown(doc, out_dir), encoding="utf-8")
    print(csm.markdown(doc, out_dir), end="")
    print(f"kvfence upstream matrix --shipped: {len(versions)} release(s) x {len(contracts)} contract(s) in "
          f"{doc['elapsed_s']} s; report {report}")
    return doc["exit_code"]


def cmd_upstream_shipped(args, name: str, out_dir, offline: bool, json_path=None) -> int:
    """``upstream matrix --shipped`` of a contract with release tooling of its own (``ReleaseTool.shipped_matrix``):
    each release's backends under their own sizing."""
    from kvfence.device import select
    from kvfence.release import release_matrix as rm

    versions = rm.parse_versions(args.versions, rm.known_releases(offline, announce=_stderr), announce=_stderr)
    device = select(args.device, announce=_stderr)
    # The --shipped-* flags by name, for the contract's tooling to read (kvfence names none of them here).
    options = {dest.removeprefix("shipped_"): value for dest, value in vars(args).items()
               if dest.startswith("shipped_")}
    _set_aside(out_dir)
    tool = shipped(name).tool
    assert tool is not None  # called for the contracts that have one (cmd_upstream)
    doc, text = tool.shipped_matrix(versions, options, device=device, offline=offline, out=out_dir,
                                    progress=sys.stderr)
    if json_path is not None:
        json_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(text, end="")
    print(f"kvfence upstream matrix --shipped: {len(versions)} release(s) of {name} in {doc['elapsed_s']} s")
    return doc["exit_code"]


def cmd_upstream_matrix(args) -> int:
    """``upstream matrix``: ``_matrix``, then the ``--out`` lock it took is released however it ended."""
    from kvfence.engine import outlock

    try:
        return _matrix(args)
    finally:
        outlock.release_all()


def _matrix(args) -> int:
    """Fuzz every release x sizing x contract cell (kvfence.release.release_matrix), or with ``--shipped``
    assess each release's own sizing."""
    from kvfence.device import select
    from kvfence.engine import registry
    from kvfence.engine.budget import parse_size
    from kvfence.release import release_matrix as rm
    from kvfence.release.matrix_report import headline, write
    from kvfence.release.wheels import offline_by_env

    json_path = _writable(args.json, "--json")
    out_dir = _out_dir(args.out)
    if args.shipped:
        offline = bool(args.offline) or offline_by_env()

        # A contract that lists its shipped sites (the page-table builders) shares one table per contract; one
        # with release tooling of its own (the draft kernel's backends, read per class) writes its own. Both
        # kinds asked: each tool's tables under OUT/<contract>, the sites' under OUT/contracts.
        names = rm.split_list(args.contracts or registry.default_name(), "--contracts")
        for name in names:
            registry.get(name)  # an unknown name: one line, before anything runs
        tools = [n for n in names if shipped(n).tool is not None]
        with_sites = [n for n in names if shipped(n).tool is None]
        alone = len(tools) == 1 and not with_sites
        codes = [cmd_upstream_shipped(args, n, out_dir if alone else out_dir / n, offline,
                                      json_path if alone else None) for n in tools]
        if with_sites:
            codes.append(cmd_upstream_shipped_contracts(args, with_sites, out_dir if not tools else
                                                        out_dir / "contracts", json_path, offline))
        return max(codes)
    contracts = rm.check_contracts(rm.split_list(args.contracts or registry.default_name(), "--contracts"))
    sizings = rm.check_sizings(rm.split_list(args.sizing, "--sizing"), contracts)
    max_gpu_mem = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else None
    offline = bool(args.offline) or offline_by_env()
    versions = rm.parse_versions(args.versions, rm.known_releases(offline, announce=_stderr), announce=_stderr)
    if args.fetch_only:  # fill the cache for an offline host (e.g. a GPU machine without network)
        releases = [rm.prepare(v, offline, _stderr) for v in versions]
        for r in releases:
            print(f"{r.version}: {r.status or 'testable'}: {r.reason or f'{r.source_path} {r.abis}'}")
        failed = [r for r in releases if r.status in ("error", "not-cached")]
        if failed:
            raise BadInput(f"{len(failed)} of {len(releases)} release(s) not in the cache: "
                           f"{failed[0].version}: {failed[0].reason}")
        return EXIT_CLEAN
    device = select(args.device, announce=_stderr)
    jobs = args.jobs or (max(1, min(8, (os.cpu_count() or 2) // 2)) if device == "cuda" else 1)
    if max_gpu_mem is None and device == "cuda":
        from kvfence.engine.budget import default_budget

        max_gpu_mem = default_budget(device, jobs)  # cells share the GPU: each gets its part
    settings = rm.Settings(device=device, max_examples=args.max_examples, seed=args.seed,
                           shrink_seconds=args.shrink_seconds, cell_timeout=args.cell_timeout, max_gpu_mem=max_gpu_mem)
    _set_aside(out_dir)  # a busy --out is refused before anything is announced
    _stderr(f"kvfence: upstream matrix: {len(versions)} release(s) x {len(sizings)} sizing(s) x "
            f"{len(contracts)} contract(s) on {device}, {args.max_examples} examples per cell, {jobs} cell(s) at once")
    doc, interrupted = rm.run(versions=versions, sizings=sizings, contracts=contracts, settings=settings,
                              offline=offline, out=out_dir, json_path=json_path, jobs=jobs, progress=sys.stderr,
                              write=write)
    print(f"kvfence upstream matrix: {headline(doc)}; report {out_dir / 'report.md'}")
    if interrupted:
        from kvfence.engine.interrupt import exit_code_for

        return exit_code_for(interrupted)
    return doc["exit_code"]


def add_parser(sub) -> None:
    up = sub.add_parser("upstream", help="SGLang's own kernels, extracted from its PyPI wheel (--kernel sglang==V)",
                        description="SGLang's own kernels, extracted from its PyPI wheel without installing or "
                                    "importing SGLang; fuzz them with --kernel sglang==VERSION.",
                        epilog=_exit_codes(one=None))
    up_sub = up.add_subparsers(dest="upstream_command", metavar="ACTION", parser_class=_Parser)
    up_sub.required = True
    uf = up_sub.add_parser("fetch", help="download the sglang==VERSION wheel (no install), extract its kernels "
                           "into the cache ($KVFENCE_CACHE or ~/.cache/kvfence) and print the module's path",
                           description="Download the sglang==VERSION wheel (no install), extract its kernels into "
                                       "the cache ($KVFENCE_CACHE or ~/.cache/kvfence) and print the module's path.",
                           epilog=_exit_codes(zero="extracted (or already cached)", one=None))
    uf.add_argument("version", help="a release, e.g. 0.5.23")
    uf.add_argument("--wheel", default=None, help="extract from this wheel file instead of downloading")
    uf.add_argument("--offline", action="store_true", help="never download (also KVFENCE_OFFLINE=1): cache only")
    uf.add_argument("--refresh", action="store_true", help="extract again even if the cache has this release")
    uf.set_defaults(func=cmd_upstream)
    um = up_sub.add_parser(
        "matrix", help="fuzz every release of a version range under every sizing and contract: a table of which "
                       "release is safe under which sizing",
        description="Fuzz SGLang's kernel of every release in --versions under every --sizing and --contracts, "
                    "one cell each, with the same example budget and seed; each cell is its own fuzz process, so "
                    "a crash or hang is that cell's result. Writes report.md, report.html and, per failing cell, "
                    "case files under OUT/<version>/<sizing>-<contract>/cases/. Cell statuses: clean, findings "
                    "(with kinds), not applicable (no such kernel or contract), ABI unsupported, error, not cached.",
        epilog=_exit_codes(zero="every applicable cell of a correct sizing (safe; window-fixed for the rail) is "
                                "clean; findings under prefix, fixed or window-no-topk are expected and only reported",
                           one="a correct-sizing cell has findings (a bug in that release) or could not be checked "
                               "(error: refused, crashed outside a case, or past --cell-timeout)",
                           two="bad input (unknown version, empty range, unknown sizing or contract, nothing "
                               "cached offline; one line on stderr)"))
    um.add_argument("--versions", required=True,
                    help="required: releases, as A..B (inclusive, post releases included, pre-releases only when "
                         "named), a version, or a comma list of both, e.g. 0.4.0..0.5.23 or 0.4.8,0.5.1..0.5.23; "
                         "expanded against the releases the package index lists and the cache has (no default)")
    um.add_argument("--sizing", default="prefix,fixed,safe",
                    help="comma list of named sizings of the contracts (a table contract's: safe, context, ...)")
    um.add_argument("--contracts", default=None,
                    help="comma list of registered contracts (default: the default contract; kvfence check-contract "
                         "--list names them): each cell fuzzes the release's own kernel under the contract's named "
                         "sizings; "
                         "one a release lacks is a not-applicable cell. With --shipped: a contract with release "
                         "tooling of its own writes its tables to OUT/<contract>, those with shipped sites one table "
                         "per contract (a column per backend x mode x forward mode) to OUT/contracts (and --json); "
                         "alone, each writes to OUT")
    um.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernels in CUDA graphs; auto: cuda when present")
    um.add_argument("--max-examples", type=_positive_int, default=50, help="Hypothesis examples per cell")
    um.add_argument("--seed", type=_non_negative_int, default=0, help="Hypothesis seed of every cell")
    um.add_argument("--shrink-seconds", type=_seconds(False), default=10.0, help="shrink budget of a failing cell")
    um.add_argument("--cell-timeout", type=_seconds(True), default=600.0,
                    help="seconds a cell's fuzz may run before it is killed (an error cell)")
    um.add_argument("--jobs", type=_positive_int, default=None,
                    help="cells fuzzed at once (default: 1 on the CPU; half the CPU cores, at most 8, on CUDA)")
    um.add_argument("--max-gpu-mem", default=None, metavar="SIZE",
                    help="device memory per cell (default: 60%% of free GPU memory split over --jobs)")
    um.add_argument("--offline", action="store_true",
                    help="never download (also KVFENCE_OFFLINE=1): releases not in the cache are 'not cached' cells")
    um.add_argument("--json", default=None, help="also write every cell here (default: only OUT/matrix.json)")
    um.add_argument("--fetch-only", action="store_true",
                    help="only fetch the releases into the cache and print what each is (testable, no kernel, ABI "
                         "unsupported): prepares a cache for an offline host; fuzzes nothing, exit 0 or 2")
    um.add_argument("--out", default="reports/out/upstream-matrix",
                    help="folder for report.md, report.html, matrix.json and each cell's fuzz output")
    um.add_argument("--shipped", action="store_true",
                    help="instead of builtin sizings: each release's backends under their own shipped sizing "
                         "(sglang==VERSION:BACKEND), one column per backend x mode; exit 1 on a silent overflow")
    um.add_argument("--shipped-ctx", type=_positive_int, default=64, help="--shipped: the context length (ctx)")
    um.add_argument("--shipped-steps", type=_positive_int, default=3, help="--shipped: speculative num_steps")
    um.add_argument("--shipped-max-bs", type=_positive_int, default=4, help="--shipped: largest capture bucket")
    um.add_argument("--shipped-max-topk", type=_positive_int, default=4, help="--shipped: largest topk searched")
    um.add_argument("--shipped-lengths", choices=["all", "ordinary"], default="all",
                    help="--shipped: request lengths searched: all (up to ctx) or ordinary (up to ctx - num_steps, "
                         "a deployment whose requests never come within num_steps of the context length)")
    um.set_defaults(func=cmd_upstream_matrix)
    us = up_sub.add_parser(
        "sizing", help="print how sglang==VERSION sizes the draft kernel's buffer, per backend (read, never run)",
        description="Print, per draft backend of sglang==VERSION (every class that launches the kernel, and its "
                    "subclasses), the graph-mode and eager-mode row widths as formulas, what the CUDA-graph runner "
                    "passes as max_bs, the host check, a topk > 1 refusal, and the source lines they came from.",
        epilog=_exit_codes(zero="printed", one=None))
    us.add_argument("version", help="a release, e.g. 0.5.23 (fetched into the cache unless offline)")
    us.add_argument("--contract", default=None,
                    help="a contract with shipped sizing (e.g. flashmla-page-table): its backends' table widths and "
                         "the tokens each adds to the lengths, with their lines (default: the default contract)")
    us.set_defaults(func=cmd_upstream_sizing)
