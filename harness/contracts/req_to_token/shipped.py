"""What SGLang's releases say of the request-row writer (``kvfence.release.knowledge``, entry-point group
``kvfence.shipped``): where the wheels define the kernel, and the release tooling of this contract (its shipped
sizing is no list of backend sites: it is the row width the pool is built with against the reservation each
algorithm's decode step writes, both read from the wheel by ``release_read``).

``upstream sizing V --contract req-to-token`` prints, per algorithm, page size and representative setting (the
first setting also under decode context parallelism, ``--dcp-size`` 2 and 8: the allocator then pages at
``page_size * attn_dcp_size``, which the step's end is aligned to), the row's headroom past the context, the
step's reservation, the longest committed length the scheduler admits, the
positions a request at that length writes past its row, and the lines each came from.
``upstream matrix --shipped --contracts req-to-token`` does so for several releases and launches each
release's own kernel on a witness of every row that spills, in production's contiguous table, writing a case
file ``kvfence repro`` replays.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, List, Tuple

from kvfence.contracts.req_to_token.case import align
from kvfence.errors import BadInput
from kvfence.release.knowledge import Shipped, Upstream

#: Where releases define the kernel (the newest first; the first of them a wheel holds is read). 0.5.23's is
#: ``mem_cache/allocation.py``; the others are where earlier SGLang trees kept it (unchecked against their wheels).
PATHS = ("sglang/srt/mem_cache/allocation.py", "sglang/srt/mem_cache/common.py", "sglang/srt/speculative/spec_utils.py",
         "sglang/srt/speculative/eagle_utils.py", "sglang/srt/managers/schedule_batch.py")
PAGES = (1, 16, 64)
#: DCP sizes the first setting of each algorithm is also read at (SGLang's ``--dcp-size``).
DCPS = (2, 8)
#: Settings per algorithm: (label, D, steps, topk). DFlash's block is 16 without a draft config
#: (``_handle_dflash``); DSPARK's gamma is 7 by default (``dspark_config.py:21``), D = gamma + 1; EAGLE's
#: defaults are (steps, topk, D) = (3, 1, 4), Llama's and Grok's (5, 4, 8) (``_auto_choose_speculative_params``).
SETTINGS = {
    "DFLASH": (("D 16 (default)", 16, 1, 1), ("D 8", 8, 1, 1)),
    "DSPARK": (("gamma 7, D 8 (default)", 8, 1, 1), ("gamma 16, D 17", 17, 1, 1)),
    "EAGLE": (("steps 3, topk 1, D 4", 4, 3, 1), ("steps 5, topk 4, D 8", 8, 5, 4)),
    "EAGLE3": (("steps 3, topk 1, D 4", 4, 3, 1), ("steps 5, topk 4, D 8", 8, 5, 4)),
    "UNO": (("D 8", 8, 1, 1),),
}
#: Contexts over which the spill is the largest (the page alignment depends on ctx mod P).
CONTEXTS = (4096, 4095, 32768, 32000, 131072, 131071)
WITNESS_CTX = 256


def row(doc: dict, version: str, algorithm: str, page: int, setting, dcp: int = 1) -> dict:
    """One row of the shipped table (``status``: ``spills``, ``fits``, ``not read``)."""
    from kvfence.contracts.req_to_token import release_read as rr

    label, D, steps, topk = setting
    out = {"version": version, "algorithm": algorithm, "page_size": page, "setting": label, "D": D,
           "steps": steps, "topk": topk, "dcp_size": dcp}
    config = rr.Config(algorithm, D, steps, topk, page, dcp)
    try:
        extra, reserve = rr.row_width_extra(doc, config), rr.reservation(doc, config)
        unit = rr.alloc_page(doc, config)
        checks = rr.host_checks(doc, config)
    except BadInput as exc:
        return {**out, "status": "not read", "why": str(exc)}
    if unit.value != page * dcp:
        return {**out, "status": "not read", "why": f"the allocator pages at {unit.value}, not page_size x "
                                                    f"dcp_size = {page * dcp} ({', '.join(unit.lines)})"}
    K = doc["admission"].get("minus")
    spill = max(align(ctx - (K or 0) + reserve.value, unit.value) - (ctx + extra.value) for ctx in CONTEXTS)
    running = [c for c in checks if c["runs"]]
    if algorithm in ("DFLASH", "DSPARK"):  # the smallest block that spills at this page size
        out["spills_from_D"] = next((d for d in range(1, 65)
                                     if _spill(doc, rr.Config(algorithm, d, 1, 1, page, dcp)) > 0), None)
    out.update(headroom=extra.value, reserve=reserve.value, K=K, spill=max(0, spill), checks=checks,
               alloc_page=unit.value, lines={"row": extra.lines, "reserve": reserve.lines, "page": unit.lines})
    if spill <= 0:
        out["status"] = "fits"
    else:
        out["status"] = "host check" if running else "spills"
    out["reach"] = (f"the scheduler admits committed lengths up to ctx - {K} "
                    f"({doc['admission']['max_req_len']['source']})" if K is not None
                    else "the admission bound is not read in this release: lengths up to ctx assumed")
    return out


def _spill(doc: dict, config) -> int:
    from kvfence.contracts.req_to_token import release_read as rr

    extra, reserve = rr.row_width_extra(doc, config).value, rr.reservation(doc, config).value
    unit = rr.alloc_page(doc, config).value
    K = doc["admission"].get("minus") or 0
    return max(align(ctx - K + reserve, unit) - (ctx + extra) for ctx in CONTEXTS)


def table(version: str, announce=None) -> Tuple[dict, List[dict]]:
    from kvfence.contracts.req_to_token import release_read as rr

    doc = rr.load(version, announce)
    return doc, [row(doc, version, algorithm, page, s) for algorithm, settings in SETTINGS.items()
                 for page in PAGES for s in settings] + [
        row(doc, version, algorithm, page, settings[0], dcp) for algorithm, settings in SETTINGS.items()
        for page in PAGES for dcp in DCPS]


def lines_of(version: str, doc: dict, rows: List[dict]) -> List[str]:
    f = doc["functions"]
    out = [f"sglang=={version}, req-to-token (the request-row writer):"]
    for key, what in (("pool", "row width"), ("extra", "headroom"), ("dispatch", "decode dispatch"),
                      ("writer", "the writer's launch")):
        e = f[key]
        where = e["absent"] if "absent" in e else f"{e['file']}:{e['line']}"
        out.append(f"  {what}: {where}")
    adm = doc["admission"]
    out.append(f"  scheduler: committed <= ctx - {adm['minus']} ({adm['max_req_len']['source']}, "
               f"{adm['new_tokens_cap']['source']})" if "minus" in adm else
               "  scheduler: the admission bound is not read (committed lengths up to ctx assumed)")
    for r in rows:
        dcp = r.get("dcp_size", 1)
        head = f"  {r['algorithm']:<6} page {r['page_size']:<3} " + (f"DCP {dcp} " if dcp > 1 else "") + \
            f"{r['setting']}: "
        if r["status"] == "not read":
            out.append(head + f"not read: {r['why']}")
            continue
        text = (f"row ctx + {r['headroom']}, reserve {r['reserve']} past committed -> "
                + (f"{r['spill']} position(s) past the row at the wall" if r["spill"] else "fits"))
        if r.get("spills_from_D"):
            text += f" (spills from D {r['spills_from_D']})"
        if r["status"] == "host check":
            text += "; a host check fires first: " + "; ".join(c["where"] for c in r["checks"] if c["runs"])
        out.append(head + text)
        out.append(f"      row: {', '.join(r['lines']['row'])}; reserve: {', '.join(r['lines']['reserve'])}"
                   + (f"; allocator page {r['alloc_page']}: {', '.join(r['lines']['page'])}" if dcp > 1 else ""))
    return out


class RowsTool:
    """This contract's release tooling (``kvfence.release.knowledge.ReleaseTool``)."""

    def sizing_lines(self, version: str, announce: Callable[[str], None]) -> List[str]:
        doc, rows = table(version, announce)
        return lines_of(version, doc, rows)

    def shipped_matrix(self, versions: List[str], options: dict, *, device: str, offline: bool, out,
                       progress) -> Tuple[dict, str]:
        start = time.monotonic()
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        rows, text = [], []
        for version in versions:
            try:
                doc, found = table(version, lambda m: print(m, file=progress, flush=True))
            except BadInput as exc:
                rows.append({"version": version, "status": "not read", "why": str(exc)})
                text.append(f"sglang=={version}: not read: {exc}")
                continue
            for r in found:
                if r["status"] == "spills":
                    r.update(witness(version, r, device, out))
            rows += found
            text += lines_of(version, doc, found)
            text += [f"  witness {r['algorithm']} page {r['page_size']}"
                     + (f" DCP {r['dcp_size']}" if r.get("dcp_size", 1) > 1 else "") + f" {r['setting']}: {r['seen']}"
                     + (f"; case {r['case_file']}" if r.get("case_file") else "") for r in found if "seen" in r]
        damaged = any(r.get("damage") for r in rows)
        doc = {"contract": "req-to-token", "rows": rows, "exit_code": 1 if damaged else 0,
               "elapsed_s": round(time.monotonic() - start, 1)}
        (out / "shipped.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return doc, "\n".join(text) + "\n"

    def deployment_verdicts(self, deployment, releases: List[str], out, device: str) -> list:
        """``affected``: a DFLASH or DSPARK deployment's line (``kvfence.contracts.req_to_token.affected``); none
        for another algorithm."""
        from kvfence.contracts.req_to_token.affected import rows_verdicts

        return rows_verdicts(deployment, releases, Path(out), device)


def witness(version: str, r: dict, device: str, out: Path) -> dict:
    """The release's own kernel on the wall of row ``r``: request 0 committed at the longest admitted length, in
    pool row 0; request 1, committed at half the context, in pool row 1 (its neighbour in production's contiguous
    table, whose head holds request 1's earlier tokens)."""
    from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
    from kvfence.engine.casefile import write_case
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.launch import bind

    dcp = r.get("dcp_size", 1)
    ctx = WITNESS_CTX
    if dcp > 1:  # the context whose wall lands one past an allocator page: the step's end overshoots the most
        ctx += (1 - (ctx - (r["K"] or 0) + r["reserve"])) % r["alloc_page"]
    wall = ctx - (r["K"] or 0)
    case = REQ_TO_TOKEN.from_json({
        "ctx": ctx, "page_size": r["page_size"], "draft_tokens": r["D"], "steps": r["steps"], "topk": r["topk"],
        "reserve": r["reserve"], "committed": [wall, ctx // 2], "allocated": [wall, ctx // 2],
        "req_pool_indices": [0, 1],
        "pool_rows": 2, "seed": 0, "dcp_size": dcp})
    sizing = f"sglang=={version}:{r['algorithm']}"
    launch = bind(REQ_TO_TOKEN, case, sizing, f"sglang=={version}", "eager", "production")
    try:
        findings = TableChecker(REQ_TO_TOKEN, device).check(launch)
    except BadInput as exc:
        return {"seen": f"not run: {exc}"}
    kinds = sorted({f.kind.value for f in findings})
    damage = [k for k in kinds if k in ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH")]
    path = write_case(launch, findings, out_dir=out, device=device, source="shipped-matrix")
    return {"seen": ", ".join(kinds) or "clean", "damage": damage, "case_file": str(path)}


def wall(ctx: int, page_size: int, draft_tokens: int, length: int) -> dict:
    """One request of committed length ``length`` whose step reserves ``2 * draft_tokens`` (the DFlash family)."""
    return {"ctx": ctx, "page_size": page_size, "draft_tokens": draft_tokens, "steps": 1, "topk": 1,
            "reserve": 2 * draft_tokens, "committed": [length], "allocated": [length], "req_pool_indices": [0],
            "pool_rows": 1, "seed": 0}


REQ_TO_TOKEN = Shipped(Upstream("assign_req_to_token_pool", PATHS), (), wall, ("safe", "pr33581"),
                       tool=RowsTool())
