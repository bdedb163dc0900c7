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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


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


def _progress_line(result) -> None:
    rate = result.examples / result.elapsed_s if result.elapsed_s else 0.0
    _stderr(f"kvfence: {result.examples} examples, {len(result.findings)} findings, {rate:.1f} cases/s, "
            f"{result.elapsed_s:.0f}s, max need/width {result.max_utilisation:.2f}")


def cmd_fuzz(args) -> int:
    from harness.device import select
    from harness.targets import resolve_sizing

    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    resolve_sizing(args.sizing)  # unknown policy: exit 2 before anything runs

    from harness.fuzz import fuzz
    from harness.session import Session
    from strategies import cases

    strategy = cases(_config_strategy(args), kernel=args.kernel, seq_len_limit=args.seq_len_limit)
    # Validate the strategy's arguments now (BadInput), not inside Hypothesis.
    strategy.validate()
    session = Session(device, args.kernel)
    result = fuzz(session, strategy, max_examples=args.max_examples, seed=args.seed,
                  shrink_seconds=args.shrink_seconds, progress=None if args.quiet else _progress_line)
    print(f"kvfence fuzz: {result.examples} examples in {result.elapsed_s:.1f}s "
          f"({result.cases_per_s:.1f} cases/s) on {device}, kernel {args.kernel}, sizing {args.sizing}, "
          f"mode {args.mode}, layout {args.layout}")
    if result.findings:
        from harness.fuzz import format_failure

        print(format_failure(result.case, result.findings, limit=20))
        if result.shrink_cut:
            print(f"(shrinking stopped after --shrink-seconds {args.shrink_seconds:g}; the case may not be minimal)")
    else:
        print("no findings")
    if json_path is not None:
        summary = {
            "examples": result.examples,
            "launches": result.launches,
            "elapsed_s": round(result.elapsed_s, 3),
            "cases_per_s": round(result.cases_per_s, 3),
            "device": device,
            "kernel": args.kernel,
            "sizing": args.sizing,
            "mode": args.mode,
            "layout": args.layout,
            "seq_len_limit": args.seq_len_limit,
            "seed": args.seed,
            "max_need_over_width": round(result.max_utilisation, 4),
            "findings": [dict(f.to_dict(), case=_case_dict(result.case)) for f in result.findings],
        }
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    return EXIT_FINDINGS if result.findings else EXIT_CLEAN


def _case_dict(case) -> dict:
    return {"config": case.config.to_dict(), "batch": case.batch.to_dict(), "kernel": case.kernel,
            "canary_seed": case.canary_seed}


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
    fz.set_defaults(func=cmd_fuzz)
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
