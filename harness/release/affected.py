"""``kvfence affected VERSION [SGLang's server flags, or the launch command]``: is this deployment affected?

A deployer knows the release and the flags they launch SGLang with, not kvfence's backend classes or
sizing formulas. This module reads those flags (SGLang's own names: ``--attention-backend``,
``--speculative-eagle-topk``, ``--speculative-num-steps``, ``--speculative-num-draft-tokens``,
``--context-length``, ``--cuda-graph-max-bs``, ``--disable-cuda-graph``, ``--page-size``), takes the
release's shipped sizing of every contract the backend launches (the draft contract,
kvfence.release.shipped_matrix; the plug-in contracts' sites, kvfence.release.contract_shipped_matrix)
for that one deployment, runs the release's kernel on the minimal overflowing launch (the verdict rests on
what the kernel did, not only on the arithmetic), and answers one line per contract: affected or not,
under which condition, since which release it is fixed, and the case file that replays it.

Defaults are SGLang's where SGLang has one kvfence can state: without topk and steps, SGLang 0.5.23 picks
(steps, topk, draft tokens) = (3, 1, 4) for most models (``sglang/srt/arg_groups/speculative_hook.py``,
``_auto_choose_speculative_params``; Llama and Grok get (5, 4, 8)), and with topk 1 the draft tokens are
steps + 1. The context length and the largest capture bucket default to the model and the GPU in SGLang;
kvfence assumes ``ASSUMED_CTX`` and ``ASSUMED_MAX_BS`` and says so in the line. With topk 1 SGLang sets the
draft tokens to steps + 1 whatever the flag says (``_handle_eagle_family``), and so does kvfence.
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from kvfence.errors import BadInput, require

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


#: Other ``--attention-backend`` names SGLang accepts: known, and none of them launches a contract's kernel
#: kvfence models (the line says so rather than refusing the name).
OTHER_BACKENDS = ("torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa4",
                  "llada2_cfg_flashinfer", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "wave",
                  "intel_amx", "ascend", "intel_xpu", "cutlass_mla", "flashinfer_mla")
#: SGLang's automatic (steps, topk, draft tokens) for most models (see the module docstring).
AUTO_SPECULATIVE = (3, 1, 4)
ASSUMED_CTX = 4096
ASSUMED_MAX_BS = 8
#: SGLang flags that give decode or the draft its own backend (0.5.23 ``server_args``): refused, not modelled.
SPLIT_BACKENDS = ("--decode-attention-backend", "--speculative-draft-attention-backend")
#: SGLang flags close in spelling to one kvfence reads, so not taken for its misspelling.
NEAR_FLAGS = ("--cuda-graph-bs", "--disable-cuda-graph-padding", "--prefill-attention-backend",
              "--mm-attention-backend")
#: Words that mark a launch command among the arguments (its other flags, --model-path and so on, are not
#: kvfence's business); without one, an unknown flag is refused (a typo must not pass as a default).
LAUNCH_MARKERS = ("sglang.launch_server", "launch_server", "sglang")


@dataclass(frozen=True)
class Deployment:
    """One SGLang deployment as its flags describe it; ``assumed`` lists what kvfence filled in."""

    version: str
    backend: str
    topk: int
    num_steps: int
    draft_tokens: int
    ctx: int
    max_bs: int
    graphs: bool
    page_size: Optional[int]
    assumed: Tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        return "graph" if self.graphs else "eager"

    def describe(self) -> str:
        return (f"sglang {self.version}, {self.backend}, {'CUDA graphs' if self.graphs else 'no CUDA graphs'}, "
                f"topk {self.topk}, {self.num_steps} steps, {self.draft_tokens} draft tokens, ctx {self.ctx}"
                + (f", page {self.page_size}" if self.page_size else ""))


def _flag_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang flags", add_help=False, allow_abbrev=False)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--page-size", type=int, default=None)
    return p


#: The flags ``parse_deployment`` reads (for help texts and errors).
FLAGS = ("--attention-backend", "--speculative-eagle-topk", "--speculative-num-steps",
         "--speculative-num-draft-tokens", "--context-length", "--cuda-graph-max-bs", "--disable-cuda-graph",
         "--page-size")


class _Refuse(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(f"SGLang flags: {message}")


def parse_deployment(version: str, argv: Sequence[str]) -> Deployment:
    """The deployment of ``argv`` (SGLang's flags, or a whole launch command) on release ``version``."""
    from kvfence.release import upstream

    upstream.check_version(version)
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
    require(backend in DRAFT_CLASSES or backend in OTHER_BACKENDS,
            f"--attention-backend {backend!r} is not one of SGLang's ({', '.join(sorted(DRAFT_CLASSES) + list(OTHER_BACKENDS))})")
    assumed = []
    steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    if steps is None and topk is None:
        steps, topk, auto_tokens = AUTO_SPECULATIVE
        tokens = tokens if tokens is not None else auto_tokens
        assumed.append(f"{steps} steps, topk {topk} (SGLang's automatic choice for most models)")
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
    for name, value, top in (("--speculative-num-steps", steps, 64), ("--speculative-eagle-topk", topk, 64),
                             ("--speculative-num-draft-tokens", tokens, 4096)):
        require(1 <= value <= top, f"{name} {value}: must be 1..{top}")
    ctx = args.context_length
    if ctx is None:
        ctx = ASSUMED_CTX
        assumed.append(f"--context-length {ASSUMED_CTX}")
    require(steps < ctx <= 1 << 24, f"--context-length {ctx}: must exceed the steps ({steps}) and be <= 2^24")
    max_bs = args.cuda_graph_max_bs
    if max_bs is None:
        max_bs = ASSUMED_MAX_BS
        assumed.append(f"--cuda-graph-max-bs {ASSUMED_MAX_BS}")
    require(1 <= max_bs <= 4096, f"--cuda-graph-max-bs {max_bs}: must be 1..4096")
    require(args.page_size is None or 1 <= args.page_size <= 4096, f"--page-size {args.page_size}: must be 1..4096")
    return Deployment(version, backend, topk, steps, tokens, ctx, max_bs, not args.disable_cuda_graph,
                      args.page_size, tuple(assumed))


#: Kinds kvfence's arithmetic reports before the kernel runs: not damage the kernel showed.
ARITHMETIC_KINDS = ("SIZING_VIOLATION",)


@dataclass
class Verdict:
    """One contract's answer for a deployment."""

    contract: str
    status: str              # affected | not affected | unknown | not launched
    condition: str = ""
    seen: List[str] = field(default_factory=list)   # the kinds the release's kernel showed on the witness
    fixed_in: Optional[str] = None
    fixed_text: str = ""
    case_file: str = ""
    site: str = ""

    def line(self, dep: Deployment) -> str:
        parts = [f"{dep.describe()}: {self.contract}{f' ({self.site})' if self.site else ''}: {self.status.upper()}"]
        if self.condition:
            parts.append(self.condition)
        damage = [k for k in self.seen if k not in ARITHMETIC_KINDS]
        if damage:
            parts.append("the release's kernel showed " + ", ".join(damage))
        if self.fixed_text:
            parts.append(self.fixed_text)
        if self.case_file:
            parts.append(f"case: {self.case_file}")
        if dep.assumed:
            parts.append("assumed: " + "; ".join(dep.assumed))
        return "; ".join(parts)


def _later(version: str, releases: List[str]) -> List[str]:
    from kvfence.release.release_matrix import version_key

    return [v for v in releases if version_key(v) > version_key(version)]


def _fixed(version: str, releases: List[str], overflows: Callable[[str], Optional[bool]]) -> Tuple[Optional[str], str]:
    """The first release after ``version`` from which no later one overflows (``overflows(v)``: True,
    False, or None when unknown there)."""
    later = _later(version, releases)
    if not later:
        return None, f"not fixed: {version} is the newest release kvfence knows"
    states = [(v, overflows(v)) for v in later]
    fixed = None
    for v, state in states:
        if state is False and fixed is None:
            fixed = v
        elif state is not False:
            fixed = None
    if fixed is not None:
        return fixed, f"fixed in {fixed} (clean in every release after it up to {later[-1]})"
    last = states[-1]
    return None, (f"not fixed up to {last[0]}" if last[1] else f"unknown in {last[0]} (its sizing is not readable)")


# -- the draft contract -----------------------------------------------------------------------------------
def _draft_classes(dep: Deployment, record: dict) -> List[str]:
    prefixes = DRAFT_CLASSES.get(dep.backend, ())
    return sorted(b for b in record["backends"] if b.startswith(prefixes))


#: A running request has at most ``ctx - ADMITTED_MARGIN`` committed tokens: SGLang 0.5.23 bounds a request by
#: ``context_len - 1`` (``managers/tp_worker.py:568-571``) and its new tokens by ``max_req_len - input_len - 1``
#: (``managers/scheduler.py:2714``); docs/contract.md §9, "Reachability".
ADMITTED_MARGIN = 3


def _draft_witness(version: str, cls: str, dep: Deployment, ctx: int, admitted: bool = True):
    from kvfence.release import upstream
    from kvfence.release import shipped_matrix as sm

    spec = f"{upstream.SPEC_PREFIX}{version}:{cls}"
    domain = sm.Domain(ctx=ctx, num_steps=dep.num_steps, max_bs=dep.max_bs, max_topk=max(dep.topk, 1),
                       max_len=ctx - ADMITTED_MARGIN if admitted else None)
    return sm.search(spec, dep.mode, domain, topks=range(dep.topk, dep.topk + 1)), domain


def _linear(values: List[Tuple[int, int]]) -> Optional[Tuple[Fraction, Fraction]]:
    """``(a, b)`` with ``y = a * x + b`` through every ``(x, y)``, or None."""
    (x0, y0), (x1, y1) = values[0], values[1]
    a = Fraction(y1 - y0, x1 - x0)
    b = y0 - a * x0
    return (a, b) if all(a * x + b == y for x, y in values) else None


def _ctx_text(a: Fraction, b: Fraction) -> str:
    term = "ctx" if a == 1 else f"ctx/{a.denominator}" if a.numerator == 1 else f"{a}*ctx"
    return term + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")


def _draft_condition(version: str, cls: str, dep: Deployment, case) -> str:
    """The witness's condition, as a formula in the context length when the threshold is linear in it."""
    requests, total = case.batch.raw_bs, sum(case.batch.seq_lens)
    at_wall = max(case.batch.seq_lens) > dep.ctx - dep.num_steps
    points = []
    for ctx in (dep.ctx, 2 * dep.ctx, 4 * dep.ctx):
        (silent, _, _), _ = _draft_witness(version, cls, dep, ctx)
        if silent is None or silent.batch.raw_bs != requests:
            points = []
            break
        points.append((ctx, sum(silent.batch.seq_lens)))
    fit = _linear(points) if points else None
    mean = (f"whose lengths add up to at least {_ctx_text(*fit)} ({total} at ctx {dep.ctx}"
            + (f"; {_ctx_text(fit[0] / requests, fit[1] / requests)} each on average)" if requests > 1 else ")")
            if fit else f"whose lengths add up to at least {total} (at ctx {dep.ctx})")
    launch = f"a launch of {requests} request{'s' if requests > 1 else ''}" + (
        f" (capture bucket {case.launch().num_seqs})" if dep.graphs else "")
    where = (f"; it needs requests within {dep.num_steps} tokens of the context length, which the scheduler "
             f"admits up to ctx - {ADMITTED_MARGIN} (docs/contract.md §9, Reachability)") if at_wall else ""
    return f"{launch} {mean} writes past its row{where}"


def draft_verdict(dep: Deployment, releases: List[str], out: Path, device: str) -> List[Verdict]:
    from kvfence.release import shipped_sizing
    from kvfence.engine.casefile import write_case
    from kvfence.release import shipped_matrix as sm

    name = "draft decode kv_indices"
    try:
        record = shipped_sizing.load_record(dep.version)
    except BadInput as exc:
        return [Verdict(name, "unknown", condition=str(exc))]
    classes = _draft_classes(dep, record)
    if not classes:
        return [Verdict(name, "not launched", condition=f"the {dep.backend} backend of {dep.version} does not "
                                                        "launch generate_draft_decode_kv_indices")]
    runs = sm.Runs(device)
    verdicts = []
    for cls in classes:
        v = Verdict(name, "not affected", site=cls + (
            (", MLA models" if "MLA" in cls else ", MHA models") if dep.backend == "flashinfer" else ""))
        state, text = shipped_sizing.site_state(record["backends"][cls][dep.mode])
        if state != "ok":
            v.status = "not launched" if state == "absent" else "unknown"
            v.condition = text or f"no {dep.mode}-mode buffer"
            verdicts.append(v)
            continue
        replay = record["backends"][cls][dep.mode].get("replay")
        if replay:  # graph mode whose replays never run the kernel (kvfence.release.shipped)
            v.status, v.condition = "not launched", replay
            verdicts.append(v)
            continue
        refuses = (record["backends"][cls].get("refuses") or {}).get("refuses") == "topk > 1"
        if refuses and dep.topk > 1:
            v.status, v.condition = "not launched", "its constructor refuses topk > 1 (the server does not start)"
            verdicts.append(v)
            continue
        (silent, caught, wrong), _ = _draft_witness(dep.version, cls, dep, dep.ctx)
        if silent is not None:
            findings = runs.findings(silent)
            kinds = sorted({f.kind.value for f in findings})
            damage = [k for k in kinds if k not in ARITHMETIC_KINDS]
            v.status = "affected" if damage else "unknown"
            v.condition = _draft_condition(dep.version, cls, dep, silent) if damage else (
                "the arithmetic says a launch overflows its row, the release's kernel showed no damage")
            v.seen = kinds
            v.case_file = str(write_case(silent, findings, out_dir=out / dep.version / f"{cls}-{dep.mode}",
                                         device=device, source="affected"))
        elif _draft_witness(dep.version, cls, dep, dep.ctx, admitted=False)[0][0] is not None:
            v.condition = (f"its row overflows only for requests longer than ctx - {ADMITTED_MARGIN} tokens, which "
                           "SGLang's scheduler does not admit (docs/contract.md §9, Reachability: 0.5.23's bound)")
        elif caught is not None:
            v.condition = "an overflowing launch is refused by the release's host check (the server raises)"
        elif wrong is not None:
            v.condition = "but its host check refuses some launches that fit"
        else:
            v.condition = (f"no launch of up to {dep.max_bs} requests of admitted lengths overflows its row")

        def overflows(version: str, cls: str = cls) -> Optional[bool]:
            try:
                later = shipped_sizing.load_record(version)
            except BadInput:
                return None
            names = _draft_classes(dep, later)
            if not names:
                return False  # the backend no longer launches the kernel
            states = [shipped_sizing.site_state(later["backends"][n][dep.mode])[0] for n in names]
            if "unreadable" in states:
                return None
            return any(_draft_witness(version, n, dep, dep.ctx)[0][0] is not None
                       for n, s in zip(names, states) if s == "ok" and not later["backends"][n][dep.mode].get("replay"))

        if v.status == "affected":
            v.fixed_in, v.fixed_text = _fixed(dep.version, releases, overflows)
        verdicts.append(v)
    return verdicts


# -- the plug-in contracts ---------------------------------------------------------------------------------
def _site_for(dep: Deployment, s: dict) -> Optional[dict]:
    """The site record ``s`` restricted to the deployment's page size (None when the backend never runs it)."""
    site = s["site"]
    if site["backend"] != dep.backend or site["mode"] != dep.mode:
        return None
    pages = list(site["page_sizes"])
    if dep.page_size is not None:
        if dep.page_size not in pages:
            return None
        pages = [dep.page_size]
    return {**s, "site": {**site, "page_sizes": pages}}


def _tokens(dep: Deployment, s: dict) -> int:
    return dep.draft_tokens if s["site"]["forward_mode"] == "target_verify" else dep.topk


def contract_verdicts(dep: Deployment, releases: List[str], out: Path, device: str,
                      announce: Callable[[str], None]) -> List[Verdict]:
    from kvfence import contract as registry
    from kvfence.release import contract_shipped as cs
    from kvfence.release import contract_shipped_matrix as csm

    verdicts = []
    for name in registry.names():
        contract = registry.get(name)
        if not any(s.backend == dep.backend and s.mode == dep.mode for s in contract.shipped_sites):
            continue
        try:
            record = csm.load_record(dep.version, contract, announce=announce)
            kernel = f"sglang=={dep.version}"
            contract.resolve(kernel)
        except BadInput as exc:
            verdicts.append(Verdict(name, "unknown", condition=str(exc)))
            continue
        for s in record["sites"]:
            if s["site"]["backend"] != dep.backend or s["site"]["mode"] != dep.mode:
                continue
            site = _site_for(dep, s)
            if site is None:
                verdicts.append(Verdict(name, "not launched", site=csm.site_name(s["site"]), condition=(
                    f"the backend runs with page sizes {', '.join(map(str, s['site']['page_sizes']))}, not "
                    f"{dep.page_size}")))
                continue
            domain = {"contexts": (dep.ctx,), "draft_tokens": (_tokens(dep, s),)}
            cell = csm.settle_cell(contract, dep.version, kernel, site, record["admission"], device, out, **domain)
            v = Verdict(name, "not affected", site=csm.site_name(s["site"]))
            a = cell["assessment"]
            if a["status"] == "fits" and a.get("fits_at"):
                p = a["fits_at"]
                v.condition = (f"the longest launch ({p['length']} + {p['delta']} tokens) needs {p['need']} pages, its "
                               f"row holds {p['width']}; {a['reach']}")
            if a["status"] == "absent":
                continue
            if a["status"] == "unreadable":
                v.status, v.condition = "unknown", f"unreadable: {a['why']}"
            elif a["status"] == "overflows":
                p = a["witness"]
                damaged = cell["status"] not in ("error",)
                v.status = "affected" if damaged else "unknown"
                v.condition = (f"a request of committed length {p['length']} (+{p['delta']} in the launch) needs "
                               f"{p['need']} pages of {p['page_size']} tokens, its row holds {p['width']}: "
                               f"{cell['status']}; {a['reach']}")
                v.seen, v.case_file = cell.get("kinds", []), cell.get("case_file", "")
            elif cell["status"] == "findings on a fitting launch":
                v.status, v.condition = "affected", cell["why"]
                v.seen, v.case_file = cell.get("kinds", []), cell.get("case_file", "")

            def overflows(version: str, s=s) -> Optional[bool]:
                try:
                    later = csm.load_record(version, contract, announce=announce)
                except BadInput:
                    return None
                same = [x for x in later["sites"] if x["site"] == s["site"]]
                if not same or _site_for(dep, same[0]) is None:
                    return False
                state = cs.assess(_site_for(dep, same[0]), later["admission"], **domain)["status"]
                return None if state == "unreadable" else state == "overflows"

            if v.status == "affected":
                v.fixed_in, v.fixed_text = _fixed(dep.version, releases, overflows)
            verdicts.append(v)
    return verdicts


def assess_deployment(dep: Deployment, *, out: Path, device: str, offline: bool,
                      announce: Callable[[str], None]) -> List[Verdict]:
    """Every contract's verdict for ``dep`` (the draft contract first)."""
    from kvfence.release.release_matrix import known_releases

    releases = known_releases(offline, announce=announce)
    return draft_verdict(dep, releases, out, device) + contract_verdicts(dep, releases, out, device, announce)
