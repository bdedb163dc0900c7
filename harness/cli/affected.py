"""``kvfence affected VERSION [SGLang flags | the launch command]``: one line per contract, in SGLang's words
(kvfence.release.affected).

``add_parser(sub)`` adds ``affected`` to ``sub`` (kvfence.cli.build_parser), with its handler as its ``func``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kvfence.cli.common import _out_dir, _stderr
from kvfence.errors import EXIT_BAD_INPUT, EXIT_CLEAN, EXIT_FINDINGS, printable

#: ``affected``'s options that no SGLang or vLLM server flag shares (``--device`` and ``--json``-like names may be).
OWN_OPTIONS = ("--offline", "--kv-cache-group", "--project", "--gpu", "--verbose")


def cmd_affected(args) -> int:
    from kvfence.device import select
    from kvfence.errors import BadInput
    from kvfence.release import affected, affected_verdict, affected_vllm

    # kvfence's own options that neither SGLang nor vLLM has: inside the launch command they would be read as one
    # of its flags and ignored (an --offline there would not stop a download).
    misplaced = [t for t in args.sglang_flags if t.split("=", 1)[0] in OWN_OPTIONS]
    if misplaced:
        raise BadInput(f"{misplaced[0].split('=', 1)[0]} is kvfence's option, not the server's: put it before the "
                       f"release (kvfence affected {misplaced[0]} {args.version} ...)")
    vllm = args.project == "vllm" or (args.project == "auto" and affected_vllm.is_vllm_command(args.sglang_flags))
    dep: Any  # a vLLM or an SGLang deployment, as vllm says
    if vllm:
        dep = affected_vllm.parse_vllm(args.version, args.sglang_flags, args.kv_cache_group or ())
    elif args.kv_cache_group:
        raise BadInput("--kv-cache-group describes a vLLM deployment's KV-cache group (vllm serve ..., or --project "
                       "vllm)")
    else:
        dep = affected.parse_deployment(args.version, args.sglang_flags)
    if vllm and args.gpu:
        raise BadInput("--gpu is read for SGLang deployments (SGLang's graph defaults and FA4's page depend on it)")
    out_dir = _out_dir(args.out)
    if args.offline:
        os.environ["KVFENCE_OFFLINE"] = "1"
    if not vllm:  # the launch as the release's own argument code resolves it (a refusal: one line, exit 2)
        dep = affected.resolve_deployment(dep, args.gpu, announce=_stderr)
    device = select(args.device, announce=_stderr)
    if vllm:
        verdicts = affected_vllm.assess(dep, out=out_dir, device=device, announce=_stderr)
    else:
        verdicts = affected.assess_deployment(dep, out=out_dir, device=device, offline=args.offline,
                                              announce=_stderr)
    if args.json:
        doc = affected_vllm.deployment_json(dep, verdicts) if vllm else affected.deployment_json(dep, verdicts)
        print(json.dumps(doc, indent=1))
    elif args.verbose or vllm:
        for v in verdicts:
            print(printable(v.line(dep), None))
    else:
        print(printable(affected.header(dep), None))
        for v in verdicts:
            print(printable(v.short(), None))
    return affected_verdict.exit_code(verdicts)


def add_parser(sub) -> None:
    from kvfence.release.affected import FLAGS
    from kvfence.release.affected_verdict import EXIT_UNKNOWN
    from kvfence.release.affected_vllm import FLAGS as VLLM_FLAGS

    p = sub.add_parser(
        "affected", help="is this SGLang or vLLM deployment affected? one line per contract, from its own flags",
        description="Is an SGLang deployment affected? Give the release and SGLang's own server flags "
                    f"({', '.join(FLAGS)}), or the whole launch command after the release. A vLLM launch command "
                    "(vllm serve MODEL ..., python -m vllm.entrypoints...; or vLLM's flags with --project vllm) is "
                    f"read for vLLM's flags ({', '.join(VLLM_FLAGS)}) and the model's config.json where it is on "
                    "this host, and answered by the contracts that know vLLM's releases. kvfence answers one "
                    "line per backend site and contract the deployment runs (a CUDA-graph deployment runs its eager "
                    "sites too: batches above the capture buckets run eagerly): AFFECTED, NOT AFFECTED, NOT "
                    "LAUNCHED or UNKNOWN, the condition over the request lengths (and over every context), the "
                    "severity, what the release's kernel showed on the longest admitted launch, the release that "
                    "fixes it or the flag values that avoid it, and the case file (`kvfence repro FILE` replays "
                    "it). A line that names damage rests on what the release's kernel was seen to do; arithmetic "
                    "decided before the launch is stated as arithmetic. kvfence's options go before the release.",
        epilog="exit codes:\n"  # the numbers, the others' style (kvfence.cli.common._exit_codes) plus the fourth
               f"  {EXIT_CLEAN}  no line is AFFECTED or UNKNOWN\n"
               f"  {EXIT_FINDINGS}  a line is AFFECTED (it says how)\n"
               f"  {EXIT_BAD_INPUT}  bad input (one line): a malformed release or flag, an unknown backend,\n"
               "     a corrupt cache entry\n"
               f"  {EXIT_UNKNOWN}  no line is AFFECTED and one is UNKNOWN: a release kvfence cannot find,\n"
               "     a kernel it cannot run, a width it cannot read, a vLLM model whose\n"
               "     cache groups it cannot tell")
    p.add_argument("version", help="the SGLang (or vLLM) release, e.g. 0.5.10 (0.34.0 for vllm serve ...)")
    p.add_argument("sglang_flags", nargs=argparse.REMAINDER, metavar="SGLANG FLAGS",
                   help="e.g. --attention-backend flashinfer --speculative-eagle-topk 4 --speculative-num-steps 3 "
                        "--speculative-num-draft-tokens 8, or --speculative-algorithm DFLASH "
                        "--speculative-dflash-block-size 16, or: python -m sglang.launch_server ..., or: vllm serve "
                        "MODEL --block-size 16 --max-model-len 4096 --speculative-config '{...}'")
    p.add_argument("--project", default="auto", choices=("auto", "sglang", "vllm"),
                   help="whose release and flags: auto reads a vLLM launch command (vllm serve, vllm.entrypoints) "
                        "as vLLM's, anything else as SGLang's")
    p.add_argument("--kv-cache-group", action="append", metavar="BLOCK_SIZE:BLOCKS",
                   help="vLLM: a KV-cache group of the model's own (a cache type neither the flags nor vLLM's spec "
                        "classes say) whose rows hold BLOCKS blocks of BLOCK_SIZE tokens and take the slot mapping; "
                        "repeatable")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the release's kernel runs on the witness (default: CUDA when present)")
    p.add_argument("--out", default="reports/out/affected", help="folder for the case files")
    p.add_argument("--offline", action="store_true", help="never download (also KVFENCE_OFFLINE=1): cache only")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="the GPU SGLang runs on (H100, H200, H20, B200, GB200, A100-80GB, A100-40GB, L40S): SGLang "
                        "computes the CUDA-graph batch default from its memory and FA4's page from its SM version "
                        "(default: H100, said in the assumed values)")
    p.add_argument("--verbose", action="store_true",
                   help="print each line in full (the condition, what the kernel showed, every avoidance, the "
                        "values assumed) instead of the short lines")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (the deployment, each line's fields with the wheel's file:line "
                        "evidence, the exit code) instead of the lines")
    p.set_defaults(func=cmd_affected)
