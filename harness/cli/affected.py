"""``kvfence affected VERSION [SGLang flags | the launch command]``: one line per contract, in SGLang's words
(kvfence.release.affected).

``add_parser(sub)`` adds ``affected`` to ``sub`` (kvfence.cli.build_parser), with its handler as its ``func``.
"""

from __future__ import annotations

import argparse
import os

from kvfence.cli.common import _exit_codes, _out_dir, _stderr
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, printable


def cmd_affected(args) -> int:
    from kvfence.device import select
    from kvfence.release import affected

    dep = affected.parse_deployment(args.version, args.sglang_flags)
    out_dir = _out_dir(args.out)
    if args.offline:
        os.environ["KVFENCE_OFFLINE"] = "1"
    device = select(args.device, announce=_stderr)
    verdicts = affected.assess_deployment(dep, out=out_dir, device=device, offline=args.offline, announce=_stderr)
    for v in verdicts:
        print(printable(v.line(dep), None))
    return EXIT_FINDINGS if any(v.status == "affected" for v in verdicts) else EXIT_CLEAN


def add_parser(sub) -> None:
    from kvfence.release.affected import FLAGS

    p = sub.add_parser(
        "affected", help="is this SGLang deployment affected? one line per contract, from SGLang's own flags",
        description="Is an SGLang deployment affected? Give the release and SGLang's own server flags "
                    f"({', '.join(FLAGS)}), or the whole launch command after the release; kvfence answers one "
                    "line per contract the backend launches: affected or not, under which condition, since which "
                    "release it is fixed, and the minimal case file (`kvfence repro FILE` replays it). The "
                    "release's kernel runs on that case: an overflow the kernel does not show is 'unknown'.",
        epilog=_exit_codes(zero="no contract is affected", one="a contract is affected (its line says how)",
                           two="bad input (unknown release or backend, an unknown or malformed flag; one line)"))
    p.add_argument("version", help="the SGLang release, e.g. 0.5.10")
    p.add_argument("sglang_flags", nargs=argparse.REMAINDER, metavar="SGLANG FLAGS",
                   help="e.g. --attention-backend flashinfer --speculative-eagle-topk 4 --speculative-num-steps 3 "
                        "--speculative-num-draft-tokens 8, or: python -m sglang.launch_server ...")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the release's kernel runs on the witness (default: CUDA when present)")
    p.add_argument("--out", default="reports/out/affected", help="folder for the case files")
    p.add_argument("--offline", action="store_true", help="never download (also KVFENCE_OFFLINE=1): cache only")
    p.set_defaults(func=cmd_affected)
