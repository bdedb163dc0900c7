"""``affected`` for the request-row writer (``RowsTool.deployment_verdicts``, docs/contract.md §10): a DFLASH or
DSPARK deployment's rows against its decode step's reservation, both read from the release's wheel
(``release_read``) at the deployment's algorithm, draft tokens ``D``, page size and context length, and the
release's own kernel (``sglang==VERSION``) run on the wall case under the release's sizing
(``sglang==VERSION:ALGORITHM``): request 0 committed at the longest length the scheduler admits, in pool row 0,
request 1 in pool row 1, its neighbour in production's contiguous table.

The line states the arithmetic (the row, the reservation, the positions past the row: ``ROW_RESERVED_PAST_WIDTH``
is decided before the launch), names damage only from kinds the kernel was seen to do
(``kvfence.engine.findings.observed``), and says the condition: the page size (SGLang's for the backend when
``--page-size`` is not given), the context length and ``D``. EAGLE and EAGLE3 deployments get no line: the
reservation issue SGLang tracks (#33579) is the DFlash family's; except under decode context parallelism
(``--dcp-size`` above 1, any algorithm kvfence reads): the step's end is then aligned to the allocator's page
``page_size * dcp_size`` (read from the wheel, ``release_read.alloc_page``), which SGLang 0.5.18's row headroom
does not hold (sglang#35424, fixed in 0.5.19).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.contracts.req_to_token.case import MAX_CTX, MAX_SETTING, align
from kvfence.errors import BadInput
from kvfence.release.affected import DFLASH_FAMILY, SERVER_DOWN, SILENT, Deployment, Verdict, fixed_in, step

NAME = "req-to-token"
#: What the deployment suffers, by class.
IMPACT = {SILENT: "the step's slots past the row land at the head of the next pool row (production's contiguous "
                  "req_to_token), over another request's earlier tokens: its attention reads the wrong KV, silently",
          SERVER_DOWN: "the release's host check raises before the launch: the server process fails"}
#: Kinds that are damage of this kernel when the kernel shows them.
DAMAGE = ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH")
#: Page sizes tried as a way out (SGLang's backends run with these).
OTHER_PAGES = (16, 32, 64)
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


def _reading(version: str, algorithm: str, D: int, page: int, dcp: int = 1, steps: int = 1, topk: int = 1):
    """``(doc, row headroom, reservation, host checks)`` of the release at one config (``Unreadable`` /
    ``BadInput`` when not read, also when its allocator under DCP does not page at ``page * dcp``)."""
    from kvfence.contracts.req_to_token import release_read as rr

    doc = rr.load(version)
    config = rr.Config(algorithm, D, steps, topk, page, dcp)
    unit = rr.alloc_page(doc, config)
    if unit.value != page * dcp:
        raise rr.Unreadable(f"the allocator pages at {unit.value}, not page x DCP = {page * dcp}")
    return doc, rr.row_width_extra(doc, config), rr.reservation(doc, config), rr.host_checks(doc, config)


def _dcp_reading(dep: Deployment, version: str, D: int, page: int, dcp: int):
    """``_reading`` at the deployment's steps and topk."""
    return _reading(version, dep.algorithm, D, page, dcp, dep.num_steps, dep.topk)


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


def _avoid(dep: Deployment, page: int, K: int) -> List[str]:
    """Flag values that avoid the spill, the rest kept: another page size, a smaller block."""
    out = []
    for p in OTHER_PAGES:
        if p == page or (dep.backend in FORCED_PAGES and p not in FORCED_PAGES[dep.backend][0]):
            continue
        try:
            _, extra, reserve, _ = _dcp_reading(dep, dep.version, dep.draft_tokens, p, dep.dcp_size)
        except BadInput:
            continue
        if _past(dep.ctx, K, extra.value, reserve.value, p * dep.dcp_size) <= 0:
            out.append(f"--page-size {p} (the row then widens to hold the reservation)")
            break
    if dep.dcp_size > 1:
        try:
            _, extra, reserve, _ = _dcp_reading(dep, dep.version, dep.draft_tokens, page, 1)
            if _past(dep.ctx, K, extra.value, reserve.value, page) <= 0:
                out.append("--dcp-size 1 (no decode context parallelism: the allocator pages at the page size)")
        except BadInput:
            pass
    for d in range(dep.draft_tokens - 1, 1 if dep.algorithm == "DSPARK" else 0, -1):
        if dep.algorithm not in DFLASH_FAMILY:
            break
        try:
            _, extra, reserve, _ = _dcp_reading(dep, dep.version, d, page, dep.dcp_size)
        except BadInput:
            break
        if _past(dep.ctx, K, extra.value, reserve.value, page * dep.dcp_size) <= 0:
            flag = (f"--speculative-dspark-block-size {d - 1}" if dep.algorithm == "DSPARK" else
                    f"--speculative-dflash-block-size {d}")
            out.append(f"{flag} ({d} draft tokens, where the draft model runs with that block)")
            break
    return out


def _overflows(dep: Deployment, version: str, page: int) -> Optional[bool]:
    """Whether release ``version`` spills (or checks) the deployment's wall; None where it is not read."""
    try:
        later, e, r, c = _dcp_reading(dep, version, dep.draft_tokens, page, dep.dcp_size)
    except BadInput:
        return None
    if any(x["runs"] for x in c):
        return True
    return _past(dep.ctx, later["admission"].get("minus") or 0, e.value, r.value, page * dep.dcp_size) > 0


def rows_verdicts(dep: Deployment, releases: List[str], out: Path, device: str) -> List[Verdict]:
    """The contract's line for a DFLASH or DSPARK deployment, or any under decode context parallelism; none for
    another."""
    if dep.algorithm not in DFLASH_FAMILY and dep.dcp_size == 1:
        return []
    from kvfence.contracts.req_to_token import release_read as rr

    page, page_note = page_of(dep)
    D, unit = dep.draft_tokens, page * dep.dcp_size
    v = Verdict(NAME, "not affected", site=f"{dep.algorithm} decode step, page {page}"
                + (f", DCP {dep.dcp_size}" if dep.dcp_size > 1 else ""))
    step(f"{NAME}: reading sglang=={dep.version}'s rows and {dep.algorithm}'s reservation")
    try:
        doc, extra, reserve, checks = _dcp_reading(dep, dep.version, D, page, dep.dcp_size)
    except rr.Unreadable as exc:
        absent = rr.load(dep.version)["functions"]["dflash"].get("absent") if dep.algorithm in DFLASH_FAMILY else None
        v.status = "not launched" if absent else "unknown"
        v.condition = (f"sglang {dep.version} has no DFlash-family decode preparation ({absent}): "
                       f"--speculative-algorithm {dep.algorithm} is not in this release" if absent else
                       f"the row sizing is not read: {exc}")
        return [v]
    except BadInput as exc:  # no wheel offline, a release whose wheel is unreadable: could not tell
        v.status, v.condition = "unknown", f"the row sizing is not read: {exc}"
        return [v]
    adm = doc["admission"]
    K = adm.get("minus")
    adm_text = (f"ctx - {K} = {dep.ctx - K}, {adm['max_req_len']['source']}"
                if K is not None else f"the admission bound is not read in this release: ctx = {dep.ctx} assumed")
    K = K or 0
    v.evidence = rr.merge(extra.lines, reserve.lines) + (
        [f"{adm[k]['source']}: {adm[k]['text']}" for k in ("max_req_len", "new_tokens_cap") if k in adm])
    width = dep.ctx + extra.value
    wall_end = align(dep.ctx - K + reserve.value, unit)
    past = wall_end - width
    setting = f"page {page}" + (f" ({page_note})" if page_note else "") + f", ctx {dep.ctx}, D {D}" + (
        f", DCP {dep.dcp_size}" if dep.dcp_size > 1 else "")
    aligned = (f" aligned to the allocator's page {page} x DCP {dep.dcp_size} = {unit}" if dep.dcp_size > 1
               else " page-aligned" if page > 1 else "")
    what = "2 * D" if reserve.value == 2 * D and dep.algorithm in DFLASH_FAMILY else "the step reservation"
    arith = (f"a request at the admitted wall ({adm_text}) reserves {reserve.value} positions "
             f"({what}) past its committed length, to "
             f"{wall_end}" + aligned + f"; its row holds ctx + {extra.value} = {width}")
    if past <= 0:
        v.condition = f"{arith}: every admitted request's reservation fits its row (arithmetic), at {setting}"
        return [v]
    first = (width // unit) * unit - reserve.value + 1  # the least committed length whose aligned end passes W
    v.arithmetic = ["ROW_RESERVED_PAST_WIDTH"]
    base = (f"{arith}: {past} position(s) past the row (arithmetic: ROW_RESERVED_PAST_WIDTH), for every request "
            f"committed at {first} or more; at {setting}")
    running = [c for c in checks if c["runs"]]
    if running:
        v.status, v.severity, v.impact = "affected", SERVER_DOWN, IMPACT[SERVER_DOWN]
        v.arithmetic.append("HOST_CHECK_FIRED")
        v.condition = (f"{base}; the release's check of the row fires before the launch ("
                       + "; ".join(f"{c['where']}: {c['text']}" for c in running) + "): no kernel runs")
        return [v]
    if D > MAX_SETTING:
        v.status = "unknown"
        v.condition = f"{base}; kvfence's case holds D up to {MAX_SETTING}: the release's kernel is not run"
        return [v]
    from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
    from kvfence.engine import kernels
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed
    from kvfence.release.upstream import Refused

    try:
        kernels.resolve(REQ_TO_TOKEN, f"sglang=={dep.version}")
    except Refused as exc:
        v.status = "unknown"
        v.condition = f"{base}; what the release's kernel writes there is not known, kvfence cannot run it: {exc}"
        return [v]
    step(f"{NAME}: running sglang=={dep.version}'s kernel on the wall at {setting}")
    launch, findings = _witness(dep, page, K, reserve.value, device)
    kinds = sorted({f.kind.value for f in findings})
    v.seen = [k for k in kinds if observed(REQ_TO_TOKEN, k)]
    v.arithmetic = sorted(set(v.arithmetic) | {k for k in kinds if not observed(REQ_TO_TOKEN, k)})
    v.case_file = str(write_case(launch, findings, out_dir=out / dep.version / NAME, device=device,
                                 source="affected"))
    if not any(k in DAMAGE for k in v.seen):
        v.status = "unknown"
        v.condition = (f"{base}; but the release's kernel showed {', '.join(v.seen) or 'nothing'} past the row on "
                       "the wall case")
        return [v]
    witness_ctx = launch.case.ctx
    v.status, v.severity, v.impact = "affected", SILENT, IMPACT[SILENT]
    v.condition = base + (f"; the witness ran at ctx {witness_ctx} (the same ctx mod {page})"
                          if witness_ctx != dep.ctx else "")
    step(f"{NAME}: the releases after {dep.version}")
    v.fixed_in, v.fixed_text = fixed_in(dep.version, releases, lambda later: _overflows(dep, later, page))
    v.avoid = _avoid(dep, page, K)
    return [v]
