"""``affected`` for the request-row writer (``RowsTool.deployment_verdicts``, docs/contract.md §10): an EAGLE,
EAGLE3, DFLASH or DSPARK deployment's rows against its decode step's reservation, both read from the release's
wheel (``release_read``) at the deployment's algorithm, draft tokens ``D``, steps, topk, page size and context
length, and the release's own kernel (``sglang==VERSION``) run on the wall case under the release's sizing
(``sglang==VERSION:ALGORITHM``): request 0 committed at the longest length the scheduler admits, in pool row 0,
request 1 in pool row 1, its neighbour in production's contiguous table.

The line states the arithmetic (the row, the reservation, the positions past the row: ``ROW_RESERVED_PAST_WIDTH``
is decided before the launch), names damage only from kinds the kernel was seen to do
(``kvfence.engine.findings.observed``), and says the condition: the page size (SGLang's for the backend when
``--page-size`` is not given), the context length and ``D`` (and for EAGLE the steps and topk). Every
deployment whose release has the algorithm's decode preparation gets a line: AFFECTED where the release's kernel
showed the spill or the release's own host check fires, UNKNOWN where kvfence cannot read the sizing or run or
confirm the kernel. Under decode context parallelism (``--dcp-size`` above 1) the step's end is aligned to the
allocator's page ``page_size * dcp_size`` (read from the wheel, ``release_read.alloc_page``), which SGLang 0.5.18's
row headroom does not hold (sglang#35424, fixed in 0.5.19). An EAGLE deployment on a release without
``eagle_prepare_for_decode`` (before 0.5.15: the decode step reserves its rows elsewhere, code kvfence does not
read) gets no line; a DFlash-family one gets NOT LAUNCHED there when the release has no DFlash decode preparation.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.contracts.req_to_token.case import MAX_CTX, MAX_SETTING, align
from kvfence.errors import BadInput
from kvfence.release.affected_verdict import (
    BASIS_ARITHMETIC,
    BASIS_OBSERVED,
    SERVER_DOWN,
    SILENT,
    Verdict,
    fixed_in,
    step,
)
from kvfence.release.deployment import DFLASH_FAMILY, Deployment

NAME = "req-to-token"
#: What the deployment suffers, by class.
IMPACT = {SILENT: "the step's slots past the row land at the head of the next pool row (production's contiguous "
                  "req_to_token), over another request's earlier tokens: its attention reads the wrong KV, silently",
          SERVER_DOWN: "the release's host check raises before the launch: the server process fails"}
#: Kinds that are damage of this kernel when the kernel shows them.
DAMAGE = ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH")
#: Page sizes tried as a way out (SGLang's backends run with these).
OTHER_PAGES = (16, 32, 64)
#: The algorithms the line answers: the decode preparation each runs (``release_read.path_of``'s names).
PREPARATION = {"EAGLE": "eagle", "EAGLE3": "eagle", "DFLASH": "dflash", "DSPARK": "dflash"}
#: What kvfence does not run that acts on the row: the release's writer (its kernel, run on the wall case) and
#: the host check that reads the row width before the launch.
WRITER = "the release's request-row writer (alloc_for_spec_decode's kernel)"
#: SGLang 0.5.23's page size per ``--attention-backend`` (``arg_groups/overrides.py``: ``_mla_backend_page_
#: constraints`` :1144-1199 changes it for these backends whatever ``--page-size`` says when not one they run
#: with; ``_page_size_default`` :1341-1362 takes 1 on CUDA otherwise): backend -> (page sizes it runs, the page
#: SGLang changes any other to).
FORCED_PAGES = {"flashmla": ((64,), 64), "trtllm_mla": ((32, 64), 64), "cutedsl_mla": ((32, 64), 64),
                "tokenspeed_mla": ((32, 64), 64), "trtllm_mha": ((16, 32, 64, 128), 64), "hpc_ops": ((64,), 64)}


def page_of(dep: Deployment) -> Tuple[int, str]:
    """``(page size, note)``: the page size SGLang 0.5.23 runs the deployment with."""
    given = dep.page_size
    if dep.backend in FORCED_PAGES:
        runs, forced = FORCED_PAGES[dep.backend]
        if given not in runs:
            said = f"--page-size {given}" if given is not None else "no --page-size"
            return forced, f"SGLang runs {dep.backend} with it, {said}: arg_groups/overrides.py:1144-1199"
        return given, ""
    note = ""
    if dep.backend == "fa4":
        note = ("; on SM100 GPUs SGLang runs fa4 with page 128 for MHA models (arg_groups/overrides.py:1274-1296): "
                "ask with --page-size 128 there")
    if given is None:
        return 1, f"SGLang's default without --page-size: arg_groups/overrides.py:1341-1362{note}"
    return given, note.lstrip("; ")


def _reading(version: str, dep: Deployment, page: int, D: Optional[int] = None, steps: Optional[int] = None,
             topk: Optional[int] = None, dcp: Optional[int] = None):
    """``(doc, row headroom, reservation, host checks)`` of the release at the deployment's config, any of ``D``,
    steps, topk, DCP given instead (``Unreadable`` / ``BadInput`` when not read, also when its allocator under DCP
    does not page at ``page * dcp``)."""
    from kvfence.contracts.req_to_token import release_read as rr

    doc = rr.load(version)
    dcp = dep.dcp_size if dcp is None else dcp
    config = rr.Config(dep.algorithm, dep.draft_tokens if D is None else D, dep.num_steps if steps is None else steps,
                       dep.topk if topk is None else topk, page, dcp)
    unit = rr.alloc_page(doc, config)
    if unit.value != page * dcp:
        raise rr.Unreadable(f"the allocator pages at {unit.value}, not page x DCP = {page * dcp}")
    return doc, rr.row_width_extra(doc, config), rr.reservation(doc, config), rr.host_checks(doc, config)


def _past(ctx: int, K: int, extra: int, reserve: int, page: int) -> int:
    """Positions a request committed at the admitted wall ``ctx - K`` writes past a row of ``ctx + extra``."""
    return align(ctx - K + reserve, page) - (ctx + extra)


def _witness_ctx(ctx: int, page: int) -> int:
    """A context the case model holds with the same remainder modulo the page (the spill depends on nothing else
    of the context: the row is ``ctx + headroom``, the step's end the page-aligned ``ctx - K + reserve``)."""
    return ctx if ctx <= MAX_CTX else ctx - page * -(-(ctx - MAX_CTX) // page)


def _witness(dep: Deployment, page: int, K: int, reserve: int, device: str):
    """The release's kernel on the wall case under the release's sizing: ``(launch, findings)``."""
    from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.launch import bind

    ctx = _witness_ctx(dep.ctx, page * dep.dcp_size)
    wall = ctx - K
    case = REQ_TO_TOKEN.from_json({
        "ctx": ctx, "page_size": page, "draft_tokens": dep.draft_tokens, "steps": dep.num_steps, "topk": dep.topk,
        "reserve": reserve, "committed": [wall, ctx // 2], "allocated": [wall, ctx // 2], "req_pool_indices": [0, 1],
        "pool_rows": 2, "seed": 0, "dcp_size": dep.dcp_size})
    launch = bind(REQ_TO_TOKEN, case, f"sglang=={dep.version}:{dep.algorithm}", f"sglang=={dep.version}", "eager",
                  "production")
    return launch, TableChecker(REQ_TO_TOKEN, device).check(launch)


def _overflows(version: str, dep: Deployment, page: int, **setting) -> Optional[bool]:
    """Whether the release's step at the deployment's config (``setting`` changed) passes the row or fires its
    host check (None: not read)."""
    try:
        doc, extra, reserve, checks = _reading(version, dep, page, **setting)
    except BadInput:
        return None
    unit = page * setting.get("dcp", dep.dcp_size)
    past = _past(dep.ctx, doc["admission"].get("minus") or 0, extra.value, reserve.value, unit) > 0
    return past  # a check that runs fires only where the step passes the row


def _avoid(dep: Deployment, page: int) -> List[str]:
    """Flag values that avoid the spill, the rest kept: another page size, fewer draft tokens (the DFlash family's
    block), fewer steps or topk 1 (EAGLE)."""
    out = []
    for p in OTHER_PAGES:
        if p == page or (dep.backend in FORCED_PAGES and p not in FORCED_PAGES[dep.backend][0]):
            continue
        if _overflows(dep.version, dep, p) is False:
            out.append(f"--page-size {p} (the row then widens to hold the reservation)")
            break
    if dep.dcp_size > 1 and _overflows(dep.version, dep, page, dcp=1) is False:
        out.append("--dcp-size 1 (no decode context parallelism: the allocator pages at the page size)")
    if dep.algorithm in DFLASH_FAMILY:
        for d in range(dep.draft_tokens - 1, 1 if dep.algorithm == "DSPARK" else 0, -1):
            state = _overflows(dep.version, dep, page, D=d)
            if state is None:
                break
            if not state:
                flag = (f"--speculative-dspark-block-size {d - 1}" if dep.algorithm == "DSPARK" else
                        f"--speculative-dflash-block-size {d}")
                out.append(f"{flag} ({d} draft tokens, where the draft model runs with that block)")
                break
        return out
    steps = next((s for s in range(dep.num_steps - 1, 0, -1)
                  if _overflows(dep.version, dep, page, steps=s, D=dep.draft_tokens if dep.topk > 1 else s + 1)
                  is False), None)
    if steps is not None:
        out.append(f"--speculative-num-steps {steps}")
    if dep.topk > 1 and _overflows(dep.version, dep, page, topk=1, D=dep.num_steps + 1) is False:
        out.append(f"--speculative-eagle-topk 1 ({dep.num_steps + 1} draft tokens: SGLang sets steps + 1 then)")
    return out


def _unread(dep: Deployment, v: Verdict, exc: BadInput) -> List[Verdict]:
    """The line where the release's sizing is not read: NOT LAUNCHED where the release lacks the DFlash family's
    decode preparation, none where it lacks EAGLE's (the module docstring), else UNKNOWN with the reason."""
    from kvfence.contracts.req_to_token import release_read as rr

    preparation = PREPARATION[dep.algorithm]
    absent = (rr.load(dep.version)["functions"][preparation].get("absent")
              if isinstance(exc, rr.Unreadable) else None)
    if absent and preparation == "eagle":
        return []
    if absent:
        v.status = "not launched"
        v.condition = (f"sglang {dep.version} has no DFlash-family decode preparation ({absent}): "
                       f"--speculative-algorithm {dep.algorithm} is not in this release")
        return [v]
    v.status, v.condition = "unknown", f"the row sizing is not read: {exc}"
    return [v]


def _arithmetic(dep: Deployment, doc, extra, reserve, page: int, page_note: str) -> dict:
    """The step's arithmetic at the admitted wall: the row, the reservation's end, the positions past the row,
    and the words that state them."""
    adm, D = doc["admission"], dep.draft_tokens
    K = adm.get("minus")
    adm_text = (f"ctx - {K} = {dep.ctx - K}, {adm['max_req_len']['source']}"
                if K is not None else f"the admission bound is not read in this release: ctx = {dep.ctx} assumed")
    K = K or 0
    width, unit = dep.ctx + extra.value, page * dep.dcp_size
    wall_end = align(dep.ctx - K + reserve.value, unit)
    eagle = "" if dep.algorithm in DFLASH_FAMILY else f", steps {dep.num_steps}, topk {dep.topk}"
    setting = (f"page {page}" + (f" ({page_note})" if page_note else "") + f", ctx {dep.ctx}, D {D}{eagle}"
               + (f", DCP {dep.dcp_size}" if dep.dcp_size > 1 else ""))
    aligned = (f" aligned to the allocator's page {page} x DCP {dep.dcp_size} = {unit}" if dep.dcp_size > 1
               else " page-aligned" if page > 1 else "")
    what = ("2 * D" if reserve.value == 2 * D else
            "2 * max(steps * topk, D)" if reserve.value == 2 * max(dep.num_steps * dep.topk, D) and page == 1 else
            "the step reservation")
    text = (f"a request at the admitted wall ({adm_text}) reserves {reserve.value} positions ({what}) past its "
            f"committed length, to {wall_end}" + aligned
            + f"; its row holds ctx + {extra.value} = {width}")
    return {"K": K, "width": width, "past": wall_end - width, "setting": setting, "text": text, "unit": unit}


def rows_verdicts(dep: Deployment, releases: List[str], out: Path, device: str) -> List[Verdict]:
    """The contract's line for an EAGLE, EAGLE3, DFLASH or DSPARK deployment (see the module docstring)."""
    if dep.algorithm not in PREPARATION:
        return []
    from kvfence.contracts.req_to_token import release_read as rr

    page, page_note = page_of(dep)
    v = Verdict(NAME, "not affected", site=f"{dep.algorithm} decode step, page {page}"
                + (f", DCP {dep.dcp_size}" if dep.dcp_size > 1 else ""))
    step(f"{NAME}: reading sglang=={dep.version}'s rows and {dep.algorithm}'s reservation")
    try:
        doc, extra, reserve, checks = _reading(dep.version, dep, page)
    except BadInput as exc:  # not read, no wheel offline, a wheel unreadable: could not tell
        return _unread(dep, v, exc)
    adm = doc["admission"]
    v.evidence = rr.merge(extra.lines, reserve.lines) + (
        [f"{adm[k]['source']}: {adm[k]['text']}" for k in ("max_req_len", "new_tokens_cap") if k in adm])
    a = _arithmetic(dep, doc, extra, reserve, page, page_note)
    v.basis = BASIS_ARITHMETIC
    if a["past"] <= 0:
        v.condition = f"{a['text']}: every admitted request's reservation fits its row (arithmetic), at {a['setting']}"
        return [v]
    unit = a["unit"]
    first = (a["width"] // unit) * unit - reserve.value + 1  # the least committed length whose aligned end passes W
    v.arithmetic = ["ROW_RESERVED_PAST_WIDTH"]
    base = (f"{a['text']}: {a['past']} position(s) past the row (arithmetic: ROW_RESERVED_PAST_WIDTH), for every "
            f"request committed at {first} or more; at {a['setting']}")
    running = [c for c in checks if c["runs"]]
    if running:
        v.status, v.severity, v.impact = "affected", SERVER_DOWN, IMPACT[SERVER_DOWN]
        v.arithmetic.append("HOST_CHECK_FIRED")
        v.reader = "the release's host check of the row width (" + "; ".join(c["where"] for c in running) + ")"
        v.condition = (f"{base}; the release's check of the row fires before the launch ("
                       + "; ".join(f"{c['where']}: {c['text']}" for c in running) + "): no kernel runs")
        return [v]
    v.reader = WRITER
    _witnessed(dep, v, base, page, a, reserve.value, out, device)
    if v.status != "affected":
        return [v]
    step(f"{NAME}: the releases after {dep.version}")
    v.fixed_in, v.fixed_text = fixed_in(dep.version, releases, lambda version: _overflows(version, dep, page))
    v.avoid = _avoid(dep, page)
    return [v]


def _witnessed(dep: Deployment, v: Verdict, base: str, page: int, a: dict, reserve: int, out: Path,
               device: str) -> None:
    """The release's kernel on the wall case: AFFECTED with the kind it showed, else UNKNOWN with the arithmetic
    (a setting the case cannot hold, a kernel kvfence cannot run, a kernel that kept to the row)."""
    from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
    from kvfence.engine import kernels
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed
    from kvfence.release.upstream import Refused

    v.status = "unknown"
    too_big = [f"{n} {x}" for n, x in (("D", dep.draft_tokens), ("steps", dep.num_steps), ("topk", dep.topk))
               if x > MAX_SETTING]
    if too_big:
        v.condition = (f"{base}; kvfence's case holds D, steps and topk up to {MAX_SETTING} ({', '.join(too_big)}): "
                       "the release's kernel is not run")
        return
    try:
        kernels.resolve(REQ_TO_TOKEN, f"sglang=={dep.version}")
    except Refused as exc:
        v.condition = f"{base}; what the release's kernel writes there is not known, kvfence cannot run it: {exc}"
        return
    step(f"{NAME}: running sglang=={dep.version}'s kernel on the wall at {a['setting']}")
    launch, findings = _witness(dep, page, a["K"], reserve, device)
    kinds = sorted({f.kind.value for f in findings})
    v.seen = [k for k in kinds if observed(REQ_TO_TOKEN, k)]
    v.arithmetic = sorted(set(v.arithmetic) | {k for k in kinds if not observed(REQ_TO_TOKEN, k)})
    v.case_file = str(write_case(launch, findings, out_dir=out / dep.version / NAME, device=device,
                                 source="affected"))
    if not any(k in DAMAGE for k in v.seen):
        v.condition = (f"{base}; but the release's kernel showed {', '.join(v.seen) or 'nothing'} past the row on "
                       "the wall case")
        return
    witness_ctx = launch.case.ctx
    v.status, v.severity, v.impact = "affected", SILENT, IMPACT[SILENT]
    v.basis, v.reader = BASIS_OBSERVED, ""
    v.condition = base + (f"; the witness ran at ctx {witness_ctx} (the same ctx mod {a['unit']})"
                          if witness_ctx != dep.ctx else "")
