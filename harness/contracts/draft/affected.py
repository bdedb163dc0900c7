"""``affected`` for the draft kernel (``DraftReleaseTool.deployment_verdicts``): a deployment's draft backend
classes, each under its release's shipped sizing (``kvfence.contracts.draft.shipped_matrix.search``), in its
mode and, for a CUDA-graph deployment, in eager mode too (a batch above the capture buckets runs eagerly); the
minimal overflowing launch run through the release's kernel, and the condition stated as the least total length
that overflows, in the context length where the threshold is linear in it. A line names damage only from what
the kernel was seen to do (``kvfence.engine.findings.observed``); a host check that rejects the launch is the
release's formula (arithmetic) and takes the server down.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.errors import BadInput
from kvfence.release.affected import DRAFT_CLASSES
from kvfence.release.affected_verdict import (
    BASIS_ARITHMETIC,
    BASIS_NOT_RUN,
    BASIS_OBSERVED,
    BASIS_UNREAD,
    SERVER_DOWN,
    SILENT,
    Verdict,
    fixed_in,
    step,
)
from kvfence.release.deployment import DFLASH_FAMILY, Deployment

#: What the deployment suffers, by class.
IMPACT = {SILENT: "another request's kv_indices are overwritten in the same launch: its draft attention reads "
                  "the wrong KV, silently",
          SERVER_DOWN: "the release's host check asserts before the launch: the server process raises"}


#: What reads past the row when the host check rejects the launch: nothing runs, the process raises.
READER_HOST_CHECK = "the release's host check, before the launch (not run by kvfence: its formula is read)"


def _draft_classes(dep: Deployment, record: dict) -> List[str]:
    """The release's draft classes the backend builds; of FlashInfer's MHA and MLA classes only the model's
    kind where the model's config.json was read (``Deployment.model_kind``)."""
    prefixes = DRAFT_CLASSES.get(dep.backend, ())
    found = sorted(b for b in record["backends"] if b.startswith(prefixes))
    if dep.model_kind and len(prefixes) > 1:
        found = [b for b in found if ("MLA" in b) == (dep.model_kind == "MLA")]
    return found


#: A running request has at most ``ctx - ADMITTED_MARGIN`` committed tokens: SGLang 0.5.23 bounds a request by
#: ``context_len - 1`` (``managers/tp_worker.py:568-571``) and its new tokens by ``max_req_len - input_len - 1``
#: (``managers/scheduler.py:2714``); docs/contract.md §9, "Reachability".
ADMITTED_MARGIN = 3


def _draft_witness(version: str, cls: str, dep: Deployment, ctx: int, admitted: bool = True,
                   mode: Optional[str] = None):
    from kvfence.contracts.draft import shipped_matrix as sm
    from kvfence.release import upstream

    spec = f"{upstream.SPEC_PREFIX}{version}:{cls}"
    domain = sm.WitnessSpace(ctx=ctx, num_steps=dep.num_steps, max_bs=_batches(dep, mode or dep.mode),
                       max_topk=max(dep.topk, 1),
                       max_len=ctx - ADMITTED_MARGIN if admitted else None)
    return sm.search(spec, mode or dep.mode, domain, topks=range(dep.topk, dep.topk + 1)), domain


def _linear(values: List[Tuple[int, int]]) -> Optional[Tuple[Fraction, Fraction]]:
    """``(a, b)`` with ``y = a * x + b`` through every ``(x, y)``, or None."""
    (x0, y0), (x1, y1) = values[0], values[1]
    a = Fraction(y1 - y0, x1 - x0)
    b = y0 - a * x0
    return (a, b) if all(a * x + b == y for x, y in values) else None


def _ctx_text(a: Fraction, b: Fraction) -> str:
    term = "ctx" if a == 1 else f"ctx/{a.denominator}" if a.numerator == 1 else f"{a}*ctx"
    return term + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")


def _draft_condition(version: str, cls: str, dep: Deployment, case, mode: str, key: int = 0) -> str:
    """The least total length that overflows (the witness's), as a formula in the context length when the
    threshold is linear in it, and what it needs of the lengths."""
    requests, total = case.batch.raw_bs, sum(case.batch.seq_lens)
    at_wall = max(case.batch.seq_lens) > dep.ctx - dep.num_steps
    points: List[Tuple[int, int]] = []
    for ctx in (dep.ctx, 2 * dep.ctx, 4 * dep.ctx):
        silent = _draft_witness(version, cls, dep, ctx, mode=mode)[0][key]
        if silent is None or silent.batch.raw_bs != requests:
            points = []
            break
        points.append((ctx, sum(silent.batch.seq_lens)))
    fit = _linear(points) if points else None
    least = f"{_ctx_text(*fit)} ({total} at ctx {dep.ctx})" if fit else f"{total} (at ctx {dep.ctx})"
    bucket = f", padded to capture bucket {case.launch().num_seqs}" if mode == "graph" else ""
    if at_wall:
        return (f"a launch whose lengths add up to at least {least} writes past its row, with a request within "
                f"{dep.num_steps} tokens of the context length (the least such launch: {requests} request"
                f"{'s' if requests > 1 else ''}{bucket}); the scheduler admits lengths up to ctx - {ADMITTED_MARGIN} "
                "(docs/contract.md §9, Reachability)")
    return (f"a launch whose lengths add up to at least {least} writes past its row, at ordinary lengths (every "
            f"request below ctx - {dep.num_steps}); the least such launch has {requests} request"
            f"{'s' if requests > 1 else ''}{bucket}")


def _evidence(record: dict, cls: str, mode: str) -> List[str]:
    b = record["backends"][cls]
    out = [f"{b['file']}:{b['line']}: class {cls}"]
    site = b.get(mode) or {}
    if site.get("source"):
        out.append(f"{site['source']}: {mode} width {site.get('formula_text', site.get('formula', ''))} = "
                   f"{site.get('formula', '')}")
    if (site.get("call_site") or {}).get("source"):
        out.append(f"{site['call_site']['source']}: {site['call_site']['text']}")
    check = b.get("host_check") or {}
    if check.get("source"):
        out.append(f"{check['source']}: host check {check.get('formula', check.get('text', ''))}")
    return out


def draft_verdict(dep: Deployment, releases: List[str], out: Path, device: str) -> List[Verdict]:
    from kvfence.contracts.draft import release_kernels, shipped_sizing
    from kvfence.contracts.draft import shipped_matrix as sm
    from kvfence.release import upstream

    name = "draft decode kv_indices"
    if dep.algorithm in DFLASH_FAMILY:  # its worker builds no multi-step draft backend (the kernel's launchers)
        return [Verdict(name, "not launched", basis=BASIS_NOT_RUN, condition=(
            f"--speculative-algorithm {dep.algorithm} runs the DFlash family's worker, which builds no multi-step "
            "draft backend (SGLang 0.5.23: speculative/spec_info.py:323-338; the kernel's launchers are built by "
            "speculative/draft_utils.py's DraftBackendFactory for the EAGLE workers, eagle_worker_v2.py:396)"))]
    step(f"{name}: reading sglang=={dep.version}'s draft backends")
    try:
        release_kernels.fetch(dep.version, announce=lambda m: None)
    except upstream.Refused as exc:  # a release without the kernel (or of an ABI kvfence does not know)
        status = "not launched" if exc.status == upstream.NO_KERNEL else "unknown"
        return [Verdict(name, status, condition=str(exc), basis=BASIS_NOT_RUN if status == "not launched" else
                        BASIS_UNREAD)]
    record = shipped_sizing.load_record(dep.version)  # a corrupt entry: BadInput, one line, exit 2
    classes = _draft_classes(dep, record)
    if not classes:
        return [Verdict(name, "not launched", basis=BASIS_NOT_RUN,
                        condition=f"the {dep.backend} backend of {dep.version} does not launch "
                                  "generate_draft_decode_kv_indices")]
    runs = sm.Runs(device)
    verdicts: List[Verdict] = []
    modes = ["graph", "eager"] if dep.graphs else ["eager"]
    for cls in classes:
        by_mode = {mode: _class_verdict(dep, record, cls, mode, releases, out, device, runs, name) for mode in modes}
        if dep.graphs and by_mode["graph"].status == "affected" and _eager_clean(dep, record, cls, runs):
            by_mode["graph"].avoid.insert(0, "--disable-cuda-graph (its eager path fits)")
        verdicts += by_mode.values()
    for v in verdicts:
        v.basis = v.basis or {"not launched": BASIS_NOT_RUN, "unknown": BASIS_UNREAD}.get(v.status, BASIS_ARITHMETIC)
    return verdicts


def _eager_clean(dep: Deployment, record: dict, cls: str, runs) -> bool:
    """Whether the class's eager mode overflows no launch of up to ``max_running`` requests (or is not in the
    release): what ``--disable-cuda-graph`` runs. Its own verdict may say "not launched" only because no batch
    reaches it by size."""
    import dataclasses

    from kvfence.contracts.draft import shipped_sizing

    state, _ = shipped_sizing.site_state(record["backends"][cls]["eager"])
    if state == "absent":
        return True
    if state != "ok":
        return False
    eager = dataclasses.replace(dep, graphs=False, max_bs=dep.max_running or dep.max_bs)
    (silent, caught, _), _ = _draft_witness(dep.version, cls, eager, dep.ctx, mode="eager")
    return silent is None and caught is None


def _not_run(dep: Deployment, record: dict, cls: str, mode: str) -> Optional[Tuple[str, str]]:
    """``(status, condition)`` of a mode the deployment does not run (or kvfence cannot read), else None."""
    from kvfence.contracts.draft import shipped_sizing

    if dep.graphs and mode == "eager" and dep.eager_note:
        return "not launched", dep.eager_note
    state, text = shipped_sizing.site_state(record["backends"][cls][mode])
    if state != "ok":
        return ("not launched" if state == "absent" else "unknown"), text or f"no {mode}-mode buffer"
    replay = record["backends"][cls][mode].get("replay")
    if replay:  # graph mode whose replays never run the kernel (kvfence.contracts.draft.shipped_wheel)
        return "not launched", replay
    refuses = (record["backends"][cls].get("refuses") or {}).get("refuses") == "topk > 1"
    if refuses and dep.topk > 1:
        return "not launched", "its constructor refuses topk > 1 (the server does not start)"
    return None


def _class_verdict(dep, record, cls, mode, releases, out, device, runs, name) -> Verdict:
    label = cls + ((", MLA models" if "MLA" in cls else ", MHA models") if dep.backend == "flashinfer" else "")
    v = Verdict(name, "not affected", site=f"{label}, {mode}" if dep.graphs else label,
                evidence=_evidence(record, cls, mode))
    if dep.graphs and mode == "eager":
        v.reach = (f"reached by batches above the largest capture bucket ({dep.graph_flag} {dep.max_bs}), which "
                   "SGLang runs eagerly")
    skipped = _not_run(dep, record, cls, mode)
    if skipped:
        v.status, v.condition = skipped
        v.reach = "" if dep.eager_note and mode == "eager" else v.reach
        return v
    step(f"{name} {cls} {mode}: searching the launches of up to {_batches(dep, mode)} requests")
    (silent, caught, wrong), _ = _draft_witness(dep.version, cls, dep, dep.ctx, mode=mode)
    if silent is not None:
        _silent(dep, record, cls, mode, silent, v, runs, out, device, name)
    elif caught is not None:
        _caught(dep, record, cls, mode, caught, v, runs, out, device)
    elif _draft_witness(dep.version, cls, dep, dep.ctx, admitted=False, mode=mode)[0][0] is not None:
        v.condition = (f"its row overflows only for requests longer than ctx - {ADMITTED_MARGIN} tokens, which "
                       "SGLang's scheduler does not admit (docs/contract.md §9, Reachability: 0.5.23's bound)")
    elif wrong is not None:
        v.condition = "but its host check refuses some launches that fit"
    else:
        v.condition = f"no launch of up to {_batches(dep, mode)} requests of admitted lengths overflows its row"
    if v.status == "affected":
        step(f"{name} {cls} {mode}: the releases after {dep.version}")
        v.fixed_in, v.fixed_text = fixed_in(dep.version, releases, _later_overflows(dep, mode))
    return v


def _batches(dep: Deployment, mode: str) -> int:
    """The most requests a launch of ``mode`` holds: the graph's largest batch, else the request limit."""
    return dep.max_bs if mode == "graph" else (dep.max_running or dep.max_bs)


def _silent(dep, record, cls, mode, silent, v: Verdict, runs, out, device, name) -> None:
    from kvfence.contracts.draft.record import DRAFT, launch_of
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed

    step(f"{name} {cls} {mode}: running sglang=={dep.version}'s kernel on the least overflowing launch")
    findings = runs.findings(silent)
    kinds = sorted({f.kind.value for f in findings})
    v.seen = [k for k in kinds if observed(DRAFT, k)]
    v.arithmetic = [k for k in kinds if not observed(DRAFT, k)]
    damage = [k for k in v.seen if k in ("GUARD_OVERWRITE", "STRAY_WRITE")]
    v.case_file = str(write_case(launch_of(silent), findings, out_dir=out / dep.version / f"{cls}-{mode}",
                                 device=device, source="affected"))
    if damage:
        v.status, v.severity, v.impact, v.basis = "affected", SILENT, IMPACT[SILENT], BASIS_OBSERVED
        v.condition = _draft_condition(dep.version, cls, dep, silent, mode)
        if max(silent.batch.seq_lens) > dep.ctx - dep.num_steps and dep.num_steps > ADMITTED_MARGIN:
            v.avoid = _fewer_steps(dep, cls, mode)
    else:
        v.status = "unknown"
        v.condition = (f"the arithmetic says a launch overflows its row, the release's kernel showed "
                       f"{', '.join(v.seen) or 'nothing'} past it")


def _caught(dep, record, cls, mode, caught, v: Verdict, runs, out, device) -> None:
    """A launch that would overflow is rejected by the release's host check: the server process raises. The
    condition is the least launch that does it, its case file replays the check (no kernel runs)."""
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.casefile import write_case

    v.status, v.severity, v.impact, v.basis = "affected", SERVER_DOWN, IMPACT[SERVER_DOWN], BASIS_ARITHMETIC
    v.reader = READER_HOST_CHECK
    check = (record["backends"][cls].get("host_check") or {})
    where = f" ({check['source']})" if check.get("source") else ""
    rejected = f"would overflow its row and is rejected by the release's host check{where}"
    v.condition = (_draft_condition(dep.version, cls, dep, caught, mode, key=1).replace("writes past its row", rejected)
                   + ": the assertion fires before the launch (arithmetic: the check's formula, read from the wheel, "
                     "no kernel runs)")
    v.arithmetic = ["HOST_CHECK_FIRED"]
    findings = runs.findings(caught)
    v.case_file = str(write_case(launch_of(caught), findings, out_dir=out / dep.version / f"{cls}-{mode}",
                                 device=device, source="affected"))
    if max(caught.batch.seq_lens) > dep.ctx - dep.num_steps and dep.num_steps > ADMITTED_MARGIN:
        v.avoid = _fewer_steps(dep, cls, mode)


def _later_overflows(dep: Deployment, mode: str):
    from kvfence.contracts.draft import shipped_sizing

    def overflows(version: str) -> Optional[bool]:
        try:
            later = shipped_sizing.load_record(version)
        except BadInput:
            return None
        names = _draft_classes(dep, later)
        if not names:
            return False  # the backend no longer launches the kernel
        states = [shipped_sizing.site_state(later["backends"][n][mode])[0] for n in names]
        if "unreadable" in states:
            return None
        return any(sum(x is not None for x in _draft_witness(version, n, dep, dep.ctx, mode=mode)[0][:2]) > 0
                   for n, s in zip(names, states) if s == "ok" and not later["backends"][n][mode].get("replay"))

    return overflows


def _fewer_steps(dep: Deployment, cls: str, mode: str) -> List[str]:
    """``--speculative-num-steps 3`` when the overflow needs a request within ``num_steps`` of the context
    length and, searched again with 3 steps, no admitted launch overflows."""
    import dataclasses

    fewer = dataclasses.replace(dep, num_steps=ADMITTED_MARGIN,
                                draft_tokens=ADMITTED_MARGIN + 1 if dep.topk == 1 else dep.draft_tokens)
    step(f"draft {cls} {mode}: searching again with --speculative-num-steps {ADMITTED_MARGIN}")
    (silent, caught, _), _ = _draft_witness(dep.version, cls, fewer, dep.ctx, mode=mode)
    return [] if silent is not None or caught is not None else [
        f"--speculative-num-steps {ADMITTED_MARGIN} (no admitted request is then within num_steps of the context)"]
