"""``kvfence affected VERSION [SGLang's server flags, or the launch command]``: is this deployment affected?

A deployer knows the release and the flags they launch SGLang with, not kvfence's backend classes or
sizing formulas. This module reads those flags (SGLang's own names: ``--attention-backend``,
``--speculative-eagle-topk``, ``--speculative-num-steps``, ``--speculative-num-draft-tokens``,
``--context-length``, ``--cuda-graph-max-bs``, ``--disable-cuda-graph``, ``--page-size``, and for the DFlash
family ``--speculative-algorithm``, ``--speculative-dflash-block-size``, ``--speculative-dspark-block-size``; a
vLLM launch command is ``kvfence.release.affected_vllm``'s), takes the
release's shipped sizing of every contract the backend launches (a contract's own release tooling,
``kvfence.release.knowledge.ReleaseTool``; the sites other contracts list, ``kvfence.release.affected_sites``),
for the sites SGLang runs for that deployment (a CUDA-graph deployment's eager sites too), runs the release's
kernel on the longest admitted (or the minimal overflowing) launch, and answers one line per contract and site:
AFFECTED, NOT AFFECTED, NOT LAUNCHED or UNKNOWN, the severity, the condition over the request
lengths, what the kernel was seen to do (a line names damage only from a kind the contract declares observed,
``kvfence.engine.findings.observed``; arithmetic is stated as arithmetic), the release that fixes it or the flag
values that avoid it, and the case file: a ``kvfence.release.affected_verdict.Verdict``, where the severity
words (``SEVERITY_OF``), the exit code (``exit_code``: 1 affected, ``EXIT_UNKNOWN`` (3) when no line is and one is
unknown, an unknown release or a kernel kvfence cannot run, 0 otherwise) and the progress of a long run
(``Progress``) are.

The launch is then resolved as the release's own argument code resolves it (``resolve_deployment``,
``kvfence.release.launch_resolve`` on the facts ``kvfence.release.launch_args`` reads from the wheel): a launch
SGLang refuses at startup is ``BadInput`` naming the check's ``file:line``; SGLang's automatic choice of the
speculative flags, the draft tokens it sets for topk 1, the CUDA-graph batch default it computes from the GPU
(``--gpu``, kvfence's option) and TP size, the request limit it sets for speculative decoding and FA4's page on
SM100 are taken from the wheel. ``parse_deployment`` alone is kvfence's reading of the flags (SGLang 0.5.23's
defaults; ``AUTO_SPECULATIVE``, ``ASSUMED_CTX``, ``ASSUMED_MAX_BS`` of ``kvfence.release.deployment``), kept where a
release's argument code cannot be read, and said in ``assumed``. Each verdict says its basis (``Verdict.basis``,
``BASIS_*``); the default output is ``header`` and ``Verdict.short`` lines, ``Verdict.line`` the full one
(``--verbose``).
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.affected_verdict import BASIS_UNREAD, Verdict, exit_code, progress
from kvfence.release.deployment import ASSUMED_CTX, ASSUMED_MAX_BS, AUTO_SPECULATIVE, DFLASH_FAMILY, Deployment

#: SGLang's ``--attention-backend`` name -> the prefixes of its draft backend classes (SGLang 0.5.23
#: ``sglang/srt/speculative/draft_utils.py``: ``flashinfer`` builds FlashInfer's class for MHA models and
#: FlashInferMLA's for MLA models; ``tokenspeed_mla`` is the older name of ``cutedsl_mla``).
DRAFT_CLASSES = {
    "flashinfer": ("FlashInferMultiStep", "FlashInferMLAMultiStep"),
    "triton": ("TritonMultiStep",),
    "aiter": ("AiterMultiStep",),
    "fa3": ("FlashAttentionMultiStep", "FlashAttentionMultistep"),
    "flashmla": ("FlashMLAMultiStep",),
    "trtllm_mha": ("TRTLLMHAAttnMultiStep",),
    "trtllm_mla": ("TRTLLMMLAMultiStep",),
    "cutedsl_mla": ("CuteDslMLAMultiStep", "TokenspeedMLAMultiStep"),
    "tokenspeed_mla": ("CuteDslMLAMultiStep", "TokenspeedMLAMultiStep"),
}
def attention_backend_name(backend_class: str) -> str:
    """The ``--attention-backend`` name a deployer gives for a draft backend class (what the matrices print):
    of the names that build the class, the one its class name spells (``cutedsl_mla`` for CuteDslMLA...),
    with `` (MLA)`` where one name builds an MHA and an MLA class (``flashinfer``); the class itself when
    no name builds it."""
    names = [n for n, prefixes in DRAFT_CLASSES.items() if backend_class.startswith(prefixes)]
    if not names:
        return backend_class
    spelled = [n for n in names if n.replace("_", "") in backend_class.lower()]
    name = (spelled or names)[0]
    mla_of_two = len(DRAFT_CLASSES[name]) > 1 and "MLA" in backend_class and not name.endswith("mla")
    return f"{name} (MLA)" if mla_of_two else name


#: Other ``--attention-backend`` names SGLang accepts (none builds a draft backend class; which classes each
#: builds, and so which contracts' sites it runs, is read from the release's attention registry:
#: ``kvfence.release.affected_sites``).
OTHER_BACKENDS = ("torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa4",
                  "llada2_cfg_flashinfer", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "wave",
                  "intel_amx", "ascend", "intel_xpu", "cutlass_mla", "flashinfer_mla")
#: SGLang flags that give decode or the draft its own backend (0.5.23 ``server_args``): refused, not modelled.
SPLIT_BACKENDS = ("--decode-attention-backend", "--speculative-draft-attention-backend")
#: SGLang flags close in spelling to one kvfence reads, so not taken for its misspelling.
NEAR_FLAGS = ("--cuda-graph-bs", "--cuda-graph-bs-decode", "--disable-cuda-graph-padding",
              "--disable-decode-cuda-graph", "--prefill-attention-backend", "--mm-attention-backend", "--dp-size",
              "--ep-size", "--pp-size")
#: Words that mark a launch command among the arguments (its other flags, --model-path and so on, are not
#: kvfence's business); without one, an unknown flag is refused (a typo must not pass as a default).
LAUNCH_MARKERS = ("sglang.launch_server", "launch_server", "sglang")
#: ``--speculative-algorithm`` names kvfence models (SGLang 0.5.23 ``speculative/spec_info.py:32-45``; NEXTN is an
#: alias of EAGLE, ``speculative/spec_registry.py:183``). EAGLE and EAGLE3 run the EAGLE worker and its multi-step
#: draft backends; the DFlash family (DFLASH, DSPARK) runs one verify block of D tokens a step, steps and topk
#: forced to 1 (``arg_groups/speculative_hook.py:287`` ``_handle_dflash``, ``:666`` ``_handle_dspark``).
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "DFLASH", "DSPARK")
#: SGLang's other algorithms: refused in one line (kvfence does not model their workers).
OTHER_ALGORITHMS = ("STANDALONE", "NGRAM", "UNO", "FROZEN_KV_MTP")
#: The DFlash family's block when no flag gives it: DFLASH's is the draft checkpoint's ``block_size``, else 16
#: (``_handle_dflash``); DSPARK's gamma the checkpoint's, else ``DEFAULT_DSPARK_GAMMA`` = 7
#: (``speculative/dspark_components/dspark_config.py:21``), D = gamma + 1.
DFLASH_DEFAULT_D = 16
DSPARK_DEFAULT_GAMMA = 7


def _flag_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang flags", add_help=False, allow_abbrev=False)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=None)
    p.add_argument("--model-path", default=None)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-dflash-block-size", type=int, default=None)
    p.add_argument("--speculative-dspark-block-size", type=int, default=None)
    # SGLang's decode-context-parallel size: the field dcp_size, flag --dcp-size (arg_utils.py:208-210), alias
    # --decode-context-parallel-size (server_args.py:1018-1025 in 0.5.18).
    p.add_argument("--dcp-size", "--decode-context-parallel-size", dest="dcp_size", type=int, default=None)
    return p


#: The flags ``parse_deployment`` reads (for help texts and errors).
FLAGS = ("--attention-backend", "--speculative-eagle-topk", "--speculative-num-steps",
         "--speculative-num-draft-tokens", "--context-length", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode",
         "--disable-cuda-graph", "--page-size", "--max-running-requests", "--tp-size", "--model-path",
         "--speculative-algorithm", "--speculative-dflash-block-size", "--speculative-dspark-block-size",
         "--dcp-size")


class _Refuse(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(f"SGLang flags: {message}")


def parse_deployment(version: str, argv: Sequence[str]) -> Deployment:
    """The deployment of ``argv`` (SGLang's flags, or a whole launch command) on release ``version``."""
    from kvfence.release.wheels import check_version

    check_version(version)
    parser = _flag_parser()
    parser.__class__ = _Refuse
    try:
        args, rest = parser.parse_known_args(list(argv))
    except SystemExit:  # argparse's own exit on a malformed value: one line instead
        raise BadInput(f"SGLang flags: cannot read {' '.join(argv)!r}") from None
    launch = any(any(m in token for m in LAUNCH_MARKERS) for token in rest)
    unknown = [t for t in rest if t.startswith("-")]
    for token in unknown:  # a launch command's other flags are ignored, but not a misspelling of one kvfence reads
        name = token.split("=", 1)[0]
        if name in SPLIT_BACKENDS:
            raise BadInput(f"SGLang flags: {name} gives decode or the draft a backend of its own; kvfence does not "
                           "model split backends: ask with --attention-backend set to the one that runs the draft")
        close = [] if name in NEAR_FLAGS else difflib.get_close_matches(name, FLAGS, n=1, cutoff=0.85)
        if close:
            raise BadInput(f"SGLang flags: {token!r} is not a flag SGLang has; did you mean {close[0]}?")
    if rest and not launch:
        raise BadInput(f"SGLang flags: {(unknown or rest)[0]!r} is not one kvfence reads (it reads "
                       f"{', '.join(FLAGS)}; or pass the whole launch command, python -m sglang.launch_server ...)")
    backend = args.attention_backend
    require(backend is not None, "SGLang flags: name --attention-backend (SGLang picks one per GPU and model; "
                                 "kvfence needs the one you run)")
    known = sorted(DRAFT_CLASSES) + list(OTHER_BACKENDS)
    near = difflib.get_close_matches(backend, known, n=1)
    require(backend in known, f"--attention-backend {backend!r} is not one of SGLang's "
                              f"({'did you mean ' + near[0] + '? ' if near else ''}{', '.join(known)})")
    algorithm = (args.speculative_algorithm or "EAGLE").upper()
    if algorithm in OTHER_ALGORITHMS:
        raise BadInput(f"SGLang flags: --speculative-algorithm {algorithm}: kvfence models "
                       f"{', '.join(ALGORITHMS)} deployments, not {algorithm}'s worker")
    require(algorithm in ALGORITHMS, f"--speculative-algorithm {args.speculative_algorithm!r} is not one of SGLang's "
                                     f"({', '.join(ALGORITHMS + OTHER_ALGORITHMS)})")
    algorithm = "EAGLE" if algorithm == "NEXTN" else algorithm
    require(not args.speculative_adaptive, "SGLang flags: --speculative-adaptive changes the steps while serving; "
                                           "kvfence does not model it: ask with the steps you want answered")
    assumed: List[str] = []
    steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    if algorithm in DFLASH_FAMILY:
        steps, topk, tokens = _dflash_settings(algorithm, args, assumed)
    else:
        steps, topk, tokens = _eagle_settings(steps, topk, tokens, assumed)
    for name, value, top in (("--speculative-num-steps", steps, 64), ("--speculative-eagle-topk", topk, 64),
                             ("--speculative-num-draft-tokens", tokens, 4096)):
        require(1 <= value <= top, f"{name} {value}: must be 1..{top}")
    ctx = args.context_length
    if ctx is None:
        ctx = ASSUMED_CTX
        assumed.append(f"--context-length {ASSUMED_CTX}")
    require(steps < ctx <= 1 << 24, f"--context-length {ctx}: must exceed the steps ({steps}) and be <= 2^24")
    max_bs = args.cuda_graph_max_bs_decode or args.cuda_graph_max_bs
    if max_bs is None:
        max_bs = ASSUMED_MAX_BS
        if not args.disable_cuda_graph:
            assumed.append(f"--cuda-graph-max-bs {ASSUMED_MAX_BS}")
    for name, value in (("--cuda-graph-max-bs", max_bs), ("--max-running-requests", args.max_running_requests)):
        require(value is None or 1 <= value <= 4096, f"{name} {value}: must be 1..4096")
    require(args.page_size is None or 1 <= args.page_size <= 4096, f"--page-size {args.page_size}: must be 1..4096")
    require(args.tp_size is None or 1 <= args.tp_size <= 1024, f"--tp-size {args.tp_size}: must be 1..1024")
    require(args.dcp_size is None or 1 <= args.dcp_size <= 64, f"--dcp-size {args.dcp_size}: must be 1..64")
    arch, where = _model_arch(args.model_path)
    given = {"--speculative-num-steps": args.speculative_num_steps, "--speculative-eagle-topk":
             args.speculative_eagle_topk, "--speculative-num-draft-tokens": args.speculative_num_draft_tokens,
             "--cuda-graph-max-bs": args.cuda_graph_max_bs, "--cuda-graph-max-bs-decode": args.cuda_graph_max_bs_decode,
             "--max-running-requests": args.max_running_requests, "--model-path": args.model_path,
             "config.json": where}
    return Deployment(version, backend, topk, steps, tokens, ctx, max_bs, not args.disable_cuda_graph,
                      args.page_size, tuple(assumed), algorithm, given=given, tp_size=args.tp_size or 1,
                      model_arch=arch, dcp_size=args.dcp_size or 1)


def _model_arch(model_path: Optional[str]) -> Tuple[str, str]:
    """``(architectures[0], the config.json read)`` of a local ``--model-path`` folder, ``("", why not)`` else
    (``kvfence.release.affected_vllm.read_config``: read as JSON data, nothing downloaded)."""
    from kvfence.release.affected_vllm import read_config

    if not model_path or not Path(model_path).is_dir():
        return "", ("no --model-path" if not model_path else f"{model_path} is not a local folder")
    doc, where = read_config(model_path)
    if doc is None:
        return "", where
    archs = doc.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str) and len(archs[0]) <= 200):
        raise BadInput(f"{where}: no architectures list")
    return archs[0], where


def resolve_deployment(dep: Deployment, gpu: Optional[str], announce=None) -> Deployment:
    """``dep`` as release ``dep.version`` resolves it, read from its wheel (``kvfence.release.launch_resolve``);
    ``BadInput`` where SGLang refuses it. A release whose wheel is not found keeps kvfence's reading, said in
    ``assumed`` (its lines are UNKNOWN: ``assess_deployment``)."""
    from kvfence.release import launch_args, launch_resolve

    require(gpu is None or gpu in launch_resolve.GPUS,
            f"--gpu {gpu!r}: kvfence models {', '.join(launch_resolve.GPUS)} (memory, SM version)")
    try:
        facts = launch_args.load(dep.version, announce=announce)
    except BadInput as exc:
        facts = {"unread": [f"{key}: the wheel is not read ({exc})" for key in ("eagle", "graph", "fa4_page",
                                                                              "mla_archs")]}
    return launch_resolve.resolve(dep, facts, gpu)


def _eagle_settings(steps, topk, tokens, assumed: List[str]) -> Tuple[int, int, int]:
    """``(steps, topk, draft tokens)`` of an EAGLE deployment (see the module docstring for SGLang's defaults)."""
    if steps is None and topk is None:
        steps, topk, auto_tokens = AUTO_SPECULATIVE
        tokens = tokens if tokens is not None else auto_tokens
        assumed.append(f"{steps} steps, topk {topk} (SGLang's automatic choice for most models)")
    if steps is not None and topk is None:
        assumed.append("--speculative-eagle-topk 1 (not given; the release's own handling of it is not read)")
    steps = steps if steps is not None else AUTO_SPECULATIVE[0]
    topk = topk if topk is not None else 1
    if topk == 1 and tokens is not None and tokens != steps + 1:
        # SGLang overrides it (0.5.23 speculative_hook.py, _handle_eagle_family): say so, as its log does.
        assumed.append(f"{steps + 1} draft tokens, not {tokens}: SGLang sets steps + 1 when topk is 1")
        tokens = steps + 1
    if tokens is None:
        require(topk == 1, "SGLang flags: with --speculative-eagle-topk > 1 give --speculative-num-draft-tokens "
                           "(SGLang has no default for it there)")
        tokens = steps + 1
    return steps, topk, tokens


def _dflash_settings(algorithm: str, args, assumed: List[str]) -> Tuple[int, int, int]:
    """``(steps, topk, draft tokens)`` of a DFlash-family deployment as SGLang 0.5.23 resolves them
    (``_handle_dflash``, ``_handle_dspark``): steps and topk 1 whatever the flags say; DFLASH's block from
    ``--speculative-dflash-block-size`` or ``--speculative-num-draft-tokens`` (equal when both are given),
    DSPARK's ``gamma + 1`` from ``--speculative-dspark-block-size`` (equal to the draft tokens when both are given);
    the draft checkpoint's block otherwise, which kvfence does not read: SGLang's fallback, said in ``assumed``."""
    for name, value in (("--speculative-num-steps", args.speculative_num_steps),
                        ("--speculative-eagle-topk", args.speculative_eagle_topk)):
        if value is not None and value != 1:
            assumed.append(f"{name} 1, not {value}: SGLang sets 1 for {algorithm}")
    tokens = args.speculative_num_draft_tokens
    if algorithm == "DFLASH":
        block = args.speculative_dflash_block_size
        require(block is None or block >= 1, f"--speculative-dflash-block-size {block}: must be positive")
        require(block is None or tokens is None or block == tokens,
                f"--speculative-num-draft-tokens {tokens} and --speculative-dflash-block-size {block} differ: "
                "SGLang refuses to start (for DFLASH they must match)")
        tokens = block if block is not None else tokens
        if tokens is None:
            tokens = DFLASH_DEFAULT_D
            assumed.append(f"{DFLASH_DEFAULT_D} draft tokens (SGLang takes the draft checkpoint's block_size, else "
                           f"{DFLASH_DEFAULT_D}: give --speculative-dflash-block-size)")
    else:
        gamma = args.speculative_dspark_block_size
        require(gamma is None or gamma >= 1, f"--speculative-dspark-block-size {gamma}: must be positive")
        require(gamma is None or tokens is None or tokens == gamma + 1,
                f"--speculative-num-draft-tokens {tokens} is not --speculative-dspark-block-size {gamma} + 1: SGLang "
                "refuses to start (DSPARK's draft tokens are gamma + 1)")
        if gamma is not None:
            tokens = gamma + 1
        elif tokens is None:
            tokens = DSPARK_DEFAULT_GAMMA + 1
            assumed.append(f"gamma {DSPARK_DEFAULT_GAMMA}, {tokens} draft tokens (SGLang takes the draft checkpoint's "
                           f"block size, else gamma {DSPARK_DEFAULT_GAMMA}: give --speculative-dspark-block-size)")
        require(tokens >= 2, f"--speculative-num-draft-tokens {tokens}: DSPARK needs at least 2 (gamma + 1)")
    return 1, 1, tokens


def header(dep: Deployment) -> str:
    """The default output's first line: the deployment as resolved, and how many values were assumed."""
    n = len(dep.assumed)
    return dep.describe() + (f" ({n} value{'s' if n > 1 else ''} assumed: --verbose lists them)" if n else "")


def deployment_json(dep: Deployment, verdicts: List[Verdict]) -> dict:
    return {"deployment": {"version": dep.version, "backend": dep.backend, "topk": dep.topk,
                           "num_steps": dep.num_steps, "draft_tokens": dep.draft_tokens, "ctx": dep.ctx,
                           "max_bs": dep.max_bs, "graphs": dep.graphs, "page_size": dep.page_size,
                           "algorithm": dep.algorithm, "dcp_size": dep.dcp_size, "assumed": list(dep.assumed),
                           "gpu": dep.gpu,
                           "tp_size": dep.tp_size, "graph_max_bs": dep.graph_cap, "max_running": dep.max_running,
                           "eager_not_reached": dep.eager_note, "model_arch": dep.model_arch,
                           "model_kind": dep.model_kind},
            "verdicts": [v.to_json() for v in verdicts], "exit_code": exit_code(verdicts)}


def assess_deployment(dep: Deployment, *, out: Path, device: str, offline: bool,
                      announce: Callable[[str], None]) -> List[Verdict]:
    """Every contract's verdict for ``dep``: those with release tooling of their own first (``ReleaseTool``),
    then those whose knowledge lists sites (``kvfence.release.affected_sites``). A release kvfence cannot find
    is one UNKNOWN line."""
    from kvfence.release.affected_sites import contract_verdicts
    from kvfence.release.knowledge import shipped, with_tool
    from kvfence.release.release_matrix import known_releases

    with progress(announce) as shown:
        shown.step("listing the releases")
        releases = known_releases(offline, announce=announce)
        if dep.version not in releases:
            newest = releases[-1] if releases else "none"
            return [Verdict("sglang", "unknown", basis=BASIS_UNREAD, condition=(
                f"sglang {dep.version} is not a release kvfence finds (the package index, the cache"
                + (", KVFENCE_WHEEL_DIR" if os.environ.get("KVFENCE_WHEEL_DIR") else "")
                + f"; the newest it knows is {newest}): nothing of it can be read"))]
        own: List[Verdict] = []
        for name in with_tool():
            shown.step(f"{name}: the release's backends")
            tool = shipped(name).tool
            assert tool is not None  # with_tool lists the contracts that have one
            own += tool.deployment_verdicts(dep, releases, out, device)
        return own + contract_verdicts(dep, releases, out, device, announce)
