"""``affected`` for the contracts whose release knowledge lists sites (``kvfence.release.knowledge.ShippedSite``):
the sites SGLang runs for one deployment, each one's class at the deployment's point, confirmed on the release's
kernel. It knows no contract by name.

Which sites run, as SGLang runs them:

* the backend classes the ``--attention-backend`` name builds are read from the release's attention registry
  (``@register_attention_backend``: ``fa4`` builds ``FlashAttentionBackend``, as ``fa3`` does); a release
  without one matches the site's own backend name;
* a site that runs only for ``topk <= 1`` (``ShippedSite.topk``) does not run for topk > 1: its guard's line;
* a CUDA-graph deployment runs its graph sites, and its eager sites too: a batch above the largest capture
  bucket runs eagerly (the graph runner's ``cuda_graph_bs <= self.max_bs``, read from the wheel);
* the page size is SGLang's for the backend when ``--page-size`` is not given or not one it runs with.

At the deployment's (ctx, page size, draft tokens) ``kvfence.release.contract_space.point`` gives the class over
every committed length the scheduler admits; an overflowing one is run on the release's kernel at the longest
admitted length and must show its class (``kvfence.release.contract_shipped_matrix.judge``): ``writes past its
row`` rests on an observed kind, ``width formula short`` is stated as arithmetic. A kernel kvfence cannot run
(absent, another ABI) with a site that overflows is UNKNOWN, with the arithmetic; with no site either, the path is
not in the release (NOT LAUNCHED), unless another site's code fills the same table there. A table the backend's
torch code fills (``ShippedSite.fill``) runs no kernel of the contract: its line rests on the width arithmetic, the
reader past the row being the attention kernel given the published length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

from kvfence.errors import BadInput
from kvfence.release.affected_verdict import (
    BASIS_ARITHMETIC,
    BASIS_NOT_RUN,
    BASIS_OBSERVED,
    BASIS_UNREAD,
    READER_ATTENTION,
    SEVERITY_OF,
    Verdict,
    fixed_in,
    step,
)
from kvfence.release.deployment import DFLASH_FAMILY, Deployment


def _classes(record: dict, backend: str) -> Optional[List[str]]:
    """The classes ``--attention-backend backend`` builds in this release (None: the release has no registry)."""
    names = record.get("registry", {}).get("names", {})
    if not names:
        return None
    found = names.get(backend)
    return list(found["classes"]) if found else []


def applies(dep: Deployment, record: dict, s: dict) -> Optional[str]:
    """Whether a site record runs in the deployment: None when not, else how it is reached ("" for always)."""
    site = s["site"]
    classes = _classes(record, dep.backend)
    if not (site["cls"] in classes if classes is not None else site["backend"] == dep.backend):
        return None
    if site["mode"] == "graph":
        return "" if dep.graphs else None
    if not dep.graphs:
        return ""
    where = record.get("eager_fallback", {}).get("source")
    return (f"reached by batches above the largest capture bucket ({dep.graph_flag} {dep.max_bs}), which SGLang "
            f"runs eagerly" + (f" ({where}: {record['eager_fallback']['text']})" if where else ""))


def page_of(dep: Deployment, site: dict) -> tuple:
    """``(page size, note)``: the deployment's page size for the site as SGLang runs it."""
    default = site.get("page_default") or 1
    if dep.page_size is None:
        return default, f"page {default} (SGLang's for {dep.backend} without --page-size)"
    if dep.page_size not in site["page_sizes"] and site.get("page_default"):
        return default, f"page {default} (SGLang changes --page-size {dep.page_size} to it for {dep.backend})"
    return dep.page_size, ""


def _tokens(dep: Deployment, site: dict) -> int:
    return dep.draft_tokens if site["forward_mode"] == "target_verify" else dep.topk


def _evidence(record: dict, s: dict, dep: Deployment) -> List[str]:
    out = []
    reg = record.get("registry", {}).get("names", {}).get(dep.backend)
    if reg:
        out.append(f"{reg['source']}: --attention-backend {dep.backend} builds {', '.join(reg['classes'])}")
    for key in ("width", "delta"):
        v = s.get(key, {})
        if v.get("source"):
            out.append(f"{v['source']}: {key} {v['text']}")
        elif "unreadable" in v:
            out.append(f"{v['unreadable']['source']}: {key} not read ({v['unreadable']['why']})")
    if s.get("guard", {}).get("source"):
        out.append(f"{s['guard']['source']}: {s['guard']['text']}")
    if s.get("fill"):
        out.append(f"{s['fill']['source']}: {s['fill']['text']} (torch fills the table, the copy sliced to the row)")
    adm = record["admission"]
    for key in ("max_req_len", "new_tokens_cap"):
        if key in adm:
            out.append(f"{adm[key]['source']}: {adm[key]['text']}")
    return out


def _avoid(s: dict, adm: dict, block_pages, dep: Deployment, page: int) -> List[str]:
    """Flag values that avoid the overflow, everything else kept: fewer draft tokens, another page size the
    backend runs with, a shorter context."""
    from kvfence.release import contract_space as sp

    def fits(p: int, ctx: int, d: int) -> bool:
        return sp.point(s, adm, block_pages, p, ctx, d)["first_length"] is None

    out = []
    site = s["site"]
    if site["forward_mode"] == "target_verify":
        d_ok = next((d for d in range(dep.draft_tokens - 1, 0, -1) if fits(page, dep.ctx, d)), None)
        if dep.algorithm in DFLASH_FAMILY:  # steps and topk are 1 there: the block is the flag
            if d_ok is not None and (dep.algorithm == "DFLASH" or d_ok >= 2):
                out.append(f"--speculative-dflash-block-size {d_ok}" if dep.algorithm == "DFLASH" else
                           f"--speculative-dspark-block-size {d_ok - 1} ({d_ok} draft tokens)")
        elif d_ok is not None and dep.topk == 1 and d_ok >= 2:
            out.append(f"--speculative-num-steps {d_ok - 1} ({d_ok} draft tokens)")
        elif d_ok is not None and dep.topk > 1:
            out.append(f"--speculative-num-draft-tokens {d_ok}")
    others = [p for p in site["page_sizes"] if p != page and fits(p, dep.ctx, _tokens(dep, site))]
    if others:
        out.append(f"--page-size {others[0]}")
    ctx_ok = next((c for c in range(dep.ctx - 1, max(dep.ctx - 4096, 1), -1)
                   if c > (adm.get("minus") or 0) and fits(page, c, _tokens(dep, site))), None)
    if ctx_ok is not None:
        out.append(f"--context-length {ctx_ok}")
    if site.get("topk") == "1" and dep.topk == 1 and dep.algorithm not in DFLASH_FAMILY:
        out.append("--speculative-eagle-topk 2 or more (this path runs for topk 1 only)")
    return out


def site_verdict(contract, dep: Deployment, record: dict, s: dict, reach: str, kernel: str,
                 refused: Optional[BadInput], releases: List[str], out: Path, device: str, announce) -> Verdict:
    from kvfence.release import contract_shipped_matrix as csm

    site = s["site"]
    label = csm.site_name(site)
    if site["backend"] != dep.backend:  # another name that builds the same class (fa4: FlashAttentionBackend)
        label = f"{site['cls']} {label.split(' ', 1)[1]}, which --attention-backend {dep.backend} builds"
    v = Verdict(contract.name, "not affected", site=label, reach=reach, evidence=_evidence(record, s, dep))
    v = _site_status(contract, dep, record, s, v, kernel, refused, releases, out, device, announce)
    v.basis = v.basis or {"not launched": BASIS_NOT_RUN, "unknown": BASIS_UNREAD}.get(v.status, BASIS_ARITHMETIC)
    return v


def _site_status(contract, dep: Deployment, record: dict, s: dict, v: Verdict, kernel: str,
                 refused: Optional[BadInput], releases: List[str], out: Path, device: str, announce) -> Verdict:
    from kvfence.release import contract_shipped_matrix as csm
    from kvfence.release import contract_space as sp
    from kvfence.release.knowledge import shipped

    site = s["site"]
    knowledge = shipped(contract.name)
    if site["mode"] == "eager" and dep.graphs and dep.eager_note:
        v.status, v.condition, v.reach = "not launched", dep.eager_note, ""
        return v
    if site.get("topk") == "1" and dep.topk > 1:
        guard = s.get("guard", {})
        v.status = "not launched"
        v.condition = ("this path runs for topk <= 1 only" + (f" ({guard['source']}: {guard['text']})"
                                                              if guard.get("source") else ""))
        return v
    if "absent" in s:
        v.status, v.condition = "not launched", s["absent"]
        return v
    unread = [(k, s[k]["unreadable"]) for k in ("width", "delta") if "unreadable" in s[k]]
    if unread:
        key, u = unread[0]
        if refused is not None:
            v.status = "not launched"
            v.condition = (f"this release has neither the contract's kernel ({refused}) nor the site's {key} "
                           f"({u['text']!r}: {u['why']}): the path is not in it")
        else:
            v.status, v.condition = "unknown", f"the site's {key} is not read: {u['why']}: {u['text']} ({u['source']})"
        return v
    page, page_note = page_of(dep, site)
    tokens = _tokens(dep, site)
    pt = sp.point(s, record["admission"], knowledge.block_pages, page, dep.ctx, tokens)
    adm_text = (f"the scheduler admits up to ctx - {record['admission']['minus']} = {pt['admitted']}"
                if "minus" in record["admission"] else
                f"the admission bound is not read in this release: lengths up to ctx = {pt['admitted']} assumed")
    top = pt["at_admitted"]
    space = sp.page_space(s, record["admission"], knowledge.block_pages, page)  # width and overflow: any model's
    where = f"W = {space['width']} = {top['width']} pages at ctx {dep.ctx}" + (f", {page_note}" if page_note else "")
    if pt["first_length"] is None:
        v.condition = (f"every admitted length fits: the longest ({top['length']} + {top['delta']} tokens) needs "
                       f"{top['need']} pages of {page} tokens, its row holds {top['width']} ({where}; {adm_text})")
        return v
    first = pt["at_first"]
    base = (f"a request whose committed length reaches {pt['first_length']} ({adm_text}) needs {first['need']} pages "
            f"of {page} tokens with the {first['delta']} the launch adds, its row holds {first['width']} ({where})")
    if site.get("fill"):  # no kernel of the contract fills this table: the width arithmetic decides (h62b)
        return _filled(contract, dep, record, s, v, base, page, tokens, releases, announce)
    if refused is not None:  # the class rests on the kernel's block arithmetic: not stated for a kernel not run
        v.status = "unknown"
        v.condition = (f"{base}: the width formula is short (arithmetic); over every context at page {page} it "
                       f"overflows when {space['overflow']}; what this release's kernel writes past the row is not "
                       f"known, kvfence cannot run it: {refused}")
        return v
    top = pt["at_admitted"]
    step(f"{contract.name} {csm.site_name(site)}: running sglang=={dep.version}'s kernel at ctx {dep.ctx}, page "
         f"{page}, length {top['length']} + {top['delta']}")
    point = {"ctx": dep.ctx, "page_size": page, "d": tokens, "length": top["length"], "delta": top["delta"],
             "width": top["width"], "need": top["need"]}
    launch, findings = csm.run_witness(contract, dep.version, kernel, site, point, device)
    kinds = sorted({f.kind.value for f in findings})
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed

    v.seen = [k for k in kinds if observed(contract, k)]
    v.arithmetic = [k for k in kinds if not observed(contract, k)]
    v.case_file = str(write_case(launch, findings, out_dir=out / dep.version / contract.name, device=device,
                                 source="affected"))
    # The class rests on the kernel's reach: the declared model first, else the first the kernel confirms.
    tried = [(m, sp.point(s, record["admission"], m, page, dep.ctx, tokens)["class"])
             for m in sp.models(knowledge.block_pages)]
    model, cls = next(((m, c) for m, c in tried if csm.judge(contract, c, kinds) is None), tried[0])
    why = csm.judge(contract, cls, kinds)
    if why:
        v.condition = f"{base}; but the release's kernel does not confirm an overflow there: {why}"
        v.status = "unknown"
        return v
    space = sp.page_space(s, record["admission"], model, page)
    cond = space["classes"].get(cls, {}).get("condition", "")
    past = top["need"] - top["width"] if model[0] == "length" else None
    v.condition = (f"{base}: {cls}"
                   + (f", {past if past is not None else top['past']} page(s) past the row at the longest length"
                      if cls == sp.PAST else
                      ": the kernel keeps to its row, and the attention kernel given the length reads past it "
                      "(arithmetic)" if cls == sp.SHORT else "")
                   + (f"; over every context at page {page}: {cond}" if cond else ""))
    v.severity = SEVERITY_OF.get(cls, "")
    v.impact = dict(knowledge.severity).get(cls, "")
    v.status = "affected"
    v.basis = BASIS_OBSERVED if v.seen and cls == sp.PAST else BASIS_ARITHMETIC
    if cls == sp.SHORT:
        v.condition += "; the release's kernel kept to its row on the longest admitted launch (no write past it)"
        v.reader = READER_ATTENTION

    _fixes(contract, dep, record, s, v, page, tokens, releases, announce)
    return v


def _fixes(contract, dep: Deployment, record: dict, s: dict, v: Verdict, page: int, tokens: int,
           releases: List[str], announce) -> None:
    """``v``'s fixing release (read from every later release's record) and the flags that avoid it."""
    from kvfence.release import contract_shipped_matrix as csm
    from kvfence.release import contract_space as sp
    from kvfence.release.knowledge import shipped

    site, knowledge = s["site"], shipped(contract.name)

    def overflows(version: str) -> Optional[bool]:
        try:
            later = csm.load_record(version, contract, announce=announce)
        except BadInput:
            return None
        same = [x for x in later["sites"] if x["site"] == site]
        if not same or "absent" in same[0] or applies(dep, later, same[0]) is None:
            return False
        if any("unreadable" in same[0][k] for k in ("width", "delta")):
            return None
        return sp.point(same[0], later["admission"], knowledge.block_pages, page, dep.ctx,
                        tokens)["first_length"] is not None

    step(f"{contract.name} {csm.site_name(site)}: the releases after {dep.version}")
    v.fixed_in, v.fixed_text = fixed_in(dep.version, releases, overflows)
    v.avoid = _eager_clean(dep, record, s, knowledge.block_pages, page) + _avoid(s, record["admission"],
                                                                                 knowledge.block_pages, dep, page)


def _eager_clean(dep: Deployment, record: dict, s: dict, block_pages, page: int) -> List[str]:
    """``--disable-cuda-graph`` for a graph site whose eager counterpart (the same class and forward mode) is
    clean at the deployment's point, or not in the release."""
    from kvfence.release import contract_space as sp
    from kvfence.release.contract_shipped_matrix import site_name

    site = s["site"]
    if site["mode"] != "graph":
        return []
    same = [x for x in record["sites"] if x["site"]["mode"] == "eager" and x["site"]["cls"] == site["cls"]
            and x["site"]["forward_mode"] == site["forward_mode"]]
    if not same:
        return []
    eager = same[0]
    if "absent" not in eager:
        if any("unreadable" in eager[k] for k in ("width", "delta")):
            return []
        eager_page = page_of(dep, eager["site"])[0]
        if sp.point(eager, record["admission"], block_pages, eager_page, dep.ctx,
                    _tokens(dep, eager["site"]))["first_length"] is not None:
            return []
    return ["--disable-cuda-graph (its eager path fits: "
            + ("not in this release" if "absent" in eager else site_name(eager["site"])) + ")"]


def contract_verdicts(dep: Deployment, releases: List[str], out: Path, device: str,
                      announce: Callable[[str], None]) -> List[Verdict]:
    """The verdicts of every contract whose release knowledge lists sites, for the sites the deployment runs.
    A corrupt cache entry or an unreadable wheel is ``BadInput`` (exit 2); a kernel the release lacks or kvfence
    cannot run is the line's business."""
    from kvfence.engine import kernels, registry
    from kvfence.release import contract_shipped_matrix as csm
    from kvfence.release.knowledge import shipped
    from kvfence.release.upstream import Refused

    verdicts = []
    for name in registry.names():
        if not shipped(name).sites:
            continue
        contract = registry.get(name)
        step(f"{name}: reading sglang=={dep.version}'s sites")
        record = csm.load_record(dep.version, contract, announce=announce)
        running = [(s, reach) for s in record["sites"] for reach in [applies(dep, record, s)] if reach is not None]
        if not running:
            continue
        kernel, refused = f"sglang=={dep.version}", None
        try:
            kernels.resolve(contract, kernel)
        except Refused as exc:
            refused = exc
        for s, reach in _filling(running, refused):
            verdicts.append(site_verdict(contract, dep, record, s, reach, kernel,
                                         None if s["site"].get("fill") else refused, releases, out, device, announce))
    return verdicts


def _table(site: dict) -> tuple:
    return site["cls"], site["mode"], site["forward_mode"]


def _not_in(s: dict, refused) -> bool:
    """Whether no code of this site fills its table in the release: the site's class or torch fill is absent, or
    neither the contract's kernel nor the site's width and delta are in it."""
    return "absent" in s or (not s["site"].get("fill") and refused is not None
                             and any("unreadable" in s[k] for k in ("width", "delta")))


def _filling(running: list, refused) -> list:
    """The running sites to answer: a torch-filled site the release lacks gives no line (it fills that table
    otherwise), nor does a site not in the release whose table another site's code fills; NOT LAUNCHED is kept
    only where no code fills the table."""
    filled = {_table(s["site"]) for s, _ in running if not _not_in(s, refused)}
    return [(s, reach) for s, reach in running
            if not (_not_in(s, refused) and (s["site"].get("fill") or _table(s["site"]) in filled))]


def _filled(contract, dep: Deployment, record: dict, s: dict, v: Verdict, base: str, page: int, tokens: int,
            releases: List[str], announce) -> Verdict:
    """The verdict of a table the backend's torch code fills (``ShippedSite.fill``): its copy is sliced to the row,
    so the overflow is the width formula's, stated as arithmetic: the attention kernel given the published length
    reads past the row. No kernel is run."""
    from kvfence.release import contract_shipped_matrix as csm
    from kvfence.release import contract_space as sp
    from kvfence.release.knowledge import shipped

    site = s["site"]
    knowledge = shipped(contract.name)
    v.status, v.severity = "affected", SEVERITY_OF[sp.SHORT]
    v.impact = dict(knowledge.severity).get(sp.SHORT, "")
    v.basis, v.reader = BASIS_ARITHMETIC, "the attention kernel reading the published length through the row"
    v.condition = (f"{base}: {sp.SHORT}: torch fills the table, its copy sliced to the row ({s['fill']['source']}), "
                   "and the attention kernel given the length reads past it (arithmetic; no kernel of the contract "
                   "runs here)")

    def overflows(version: str) -> Optional[bool]:
        """Whether the same table overflows in ``version``, whatever fills it there."""
        try:
            later = csm.load_record(version, contract, announce=announce)
        except BadInput:
            return None
        same = [x for x in later["sites"] if _table(x["site"]) == _table(site) and "absent" not in x
                and applies(dep, later, x) is not None]
        read = [x for x in same if not any("unreadable" in x[k] for k in ("width", "delta"))]
        if not read:
            return None if same else False
        return any(sp.point(x, later["admission"], ("row", None), page, dep.ctx, tokens)["first_length"] is not None
                   for x in read)

    step(f"{contract.name} {csm.site_name(site)}: the releases after {dep.version}")
    v.fixed_in, v.fixed_text = fixed_in(dep.version, releases, overflows)
    v.avoid = _avoid(s, record["admission"], knowledge.block_pages, dep, page)
    return v
