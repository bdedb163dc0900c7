"""``upstream matrix --shipped --contracts C,...`` and ``upstream sizing VERSION --contract C`` for plug-in
contracts: each release's backends under their own shipped sizing, a cell per (contract, backend, CUDA-graph
mode, forward mode). It knows no contract by name.

Per release and contract: the release's kernel is extracted from the wheel (``kvfence.engine.kernels``; a release
without it, or with another signature, is a ``no kernel`` row with the reason, and no range the report quotes spans
it), the sites are read (``kvfence.release.contract_shipped``, cached in the contract's own entry,
``CACHE/contracts/sglang-V/C.shipped.json``, so an offline host reads the same record), and each readable site is
classified over the whole space of context lengths, page sizes and draft tokens (``kvfence.release.contract_space``:
each class's condition from the width formula and the kernel's block arithmetic, checked at every point). Every
class is then confirmed on the release's kernel by its smallest witness (one request at the longest length the
scheduler admits, on the width the release computes, in guarded tables): ``writes past its row`` must show an
*observed* kind (``GUARD_OVERWRITE``: pages landed past the row; observed-ness is the record's
``FindingKind.observed``, kvfence's own kinds but the arithmetic ones otherwise); ``width formula short`` must show
none (the kernel kept to its row, so only the arithmetic, ``SIZING_VIOLATION`` and the contract's arithmetic kinds,
says a consumer given that length reads past it); ``fits`` must come back clean (else ``findings on a fitting
launch``, the kernel's own bug). A witness that contradicts its class, or whose launch failed, makes the cell an
``error``: a kernel that stores nothing is one. Each witness is written as a contract case file that ``kvfence
repro`` replays (its width is the release's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import List, Optional, TextIO

from kvfence.errors import BadInput
from kvfence.release.knowledge import shipped, wall_case
from kvfence.release.wheels import cache_writes

#: What a witness's kernel was seen to do (observed kinds) that makes it write past its row.
DAMAGE = {"GUARD_OVERWRITE": "writes past its row", "STRAY_WRITE": "writes past its row"}
#: The classes' words (``kvfence.release.contract_space``): the kernel wrote past its row; it kept to its row
#: while the width formula is short (arithmetic: a consumer given the length reads past the row).
PAST, ARITHMETIC = "writes past its row", "width formula short"
#: Kinds that say the launch itself failed: the cell is an error, not a verdict.
FAILED = ("LAUNCH_ERROR", "CRASH", "HANG")


def _record_path(version: str, contract) -> Path:
    from kvfence.release.contract_kernels import contract_entry

    return contract_entry(version, contract.name)[0].with_suffix(".shipped.json")


def load_record(version: str, contract, *, announce=None) -> dict:
    """The contract's shipped record of ``sglang==version``: from the cache, else read from the wheel."""
    from kvfence.release import contract_shipped as cs
    from kvfence.release import upstream, wheels

    wheels.check_version(version)
    path = _record_path(version, contract)
    why = "missing from the cache"
    if path.is_file():
        why = "damaged in the cache (not a shipped record of this contract and kvfence)"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            doc, why = None, f"damaged in the cache ({type(exc).__name__})"
        if isinstance(doc, dict) and doc.get("format") == cs.FORMAT and doc.get("contract") == contract.name \
                and isinstance(doc.get("sites"), list) and all(isinstance(s, dict) for s in doc["sites"]) \
                and [s.get("site") for s in doc["sites"]] == json.loads(json.dumps(
                    [dataclasses.asdict(s) for s in shipped(contract.name).sites])):
            try:
                return cs.validate(doc)
            except (BadInput, RecursionError):
                pass  # a damaged cache record is read again from the wheel (offline: one line, exit 2)
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = upstream.find_wheel(version, None, wheels.offline_by_env(), Path(tmp), announce, (path, why))
        doc = cs.read(contract, wheel)
    with cache_writes(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, path)
    return json.loads(path.read_text(encoding="utf-8"))  # what a later run reads (tuples as lists)


def site_name(site: dict) -> str:
    return (f"{site['backend']} {site['mode']} {site['forward_mode'].replace('_', ' ')}"
            + (", torch-filled" if site.get("fill") else ""))


def sizing_lines(version: str, contract, record: dict) -> List[str]:
    """``upstream sizing VERSION --contract C``: each site's width and delta with their lines."""
    out = [f"sglang=={version}, {contract.name}:"]
    adm = record["admission"]
    if "max_length" in adm:
        out.append(f"  scheduler: {adm['max_req_len']['text']} ({adm['max_req_len']['source']}), max_new_tokens "
                   f"capped by {adm['new_tokens_cap']['text']} ({adm['new_tokens_cap']['source']}): a verify "
                   f"starts from a length up to {adm['max_length']}")
    else:
        out.append("  scheduler: the admission bound is not read in this release (lengths up to ctx assumed)")
    for s in record["sites"]:
        out.append(f"  {site_name(s['site'])} ({s['site']['cls']}):")
        if "absent" in s:
            out.append(f"    {s['absent']}")
            continue
        for key, label in (("width", "row width (pages)"), ("delta", "tokens added to each length")):
            v = s[key]
            if "unreadable" in v:
                out.append(f"    {label}: not read: {v['unreadable']['why']}: {v['unreadable']['text']} "
                           f"({v['unreadable']['source']})")
            else:
                out.append(f"    {label}: {v['formula']}"
                           + (f"   <- {v['text']} ({v['source']})" if v["source"] else ""))
        if s.get("fill"):
            out.append(f"    filled by torch, the copy sliced to the row: {s['fill']['text']} ({s['fill']['source']})")
        if s["site"].get("note"):
            out.append(f"    note: {s['site']['note']}")
    return out


def _case_file(out: Path, launch, findings, device: str) -> Path:
    from kvfence.engine.casefile import write_case

    return write_case(launch, findings, out_dir=out, device=device, source="shipped-matrix")


def shipped_sizing(version: str, site: dict) -> str:
    """The sizing a witness case file names: the release's, for one site (its width is in the file)."""
    return f"sglang=={version}:{site['backend']}:{site['mode']}:{site['forward_mode']}"


#: Witnesses already run, by (kernel text, contract, launch): releases sharing a kernel text and a width
#: formula run each witness once.
_RUNS: dict = {}


def _kernel_text(contract, kernel: str) -> str:
    from kvfence.release.contract_kernels import contract_entry
    from kvfence.release.upstream import SPEC_PREFIX
    from kvfence.release.wheels import sha256_hex

    if not kernel.startswith(SPEC_PREFIX):
        return kernel
    module = contract_entry(kernel[len(SPEC_PREFIX):].partition(":")[0], contract.name)[0]
    try:
        return sha256_hex(module.read_bytes())
    except OSError:
        return kernel


def run_witness(contract, version: str, kernel: str, site: dict, point: dict, device: str):
    """``(launch, findings)`` of the release's kernel on one request at ``point`` (its width the release's)."""
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.launch import bind, to_record

    case = wall_case(contract, point["ctx"], point["page_size"], point["delta"], point["length"])
    # How it ran: in a CUDA graph for a graph site on CUDA (the width is the release's, recorded with the case).
    launch = bind(contract, case, shipped_sizing(version, site), kernel, site["mode"], width=point["width"])
    key = (_kernel_text(contract, kernel), contract.name, device,
           json.dumps({k: v for k, v in to_record(contract, launch).items() if k not in ("sizing", "kernel")},
                      sort_keys=True))
    if key not in _RUNS:
        _RUNS[key] = TableChecker(contract, device).check(launch)
    return launch, _RUNS[key]


def judge(contract, expected: str, kinds: List[str]) -> Optional[str]:
    """Why a witness of class ``expected`` does not confirm it (None when it does), from its kinds: observed
    ones (the record's ``FindingKind.observed``, kvfence's own but the arithmetic) are what the kernel did."""
    from kvfence.engine.findings import observed

    seen = [k for k in kinds if observed(contract, k)]
    failed = [k for k in kinds if k in FAILED]
    if failed:
        return f"the witness's launch failed ({', '.join(failed)})"
    if expected == PAST:
        if not any(k in DAMAGE for k in seen):
            return (f"the block arithmetic says pages land past the row, the release's kernel showed "
                    f"{', '.join(seen) or 'nothing'} (no GUARD_OVERWRITE)")
        other = [k for k in seen if k not in DAMAGE]
        return f"beyond writing past its row the kernel showed {', '.join(other)}" if other else None
    if expected == ARITHMETIC:
        if seen:
            return (f"the launch ends at the row, yet the release's kernel showed {', '.join(seen)}: the witness is "
                    "not the width formula's alone")
        return None if kinds else "the width formula says the row is short, the launch's own arithmetic says it fits"
    return None if not kinds else f"a launch that fits its row has findings: {', '.join(kinds)}"


def _confirm(contract, version: str, kernel, s: dict, space: dict, device: str) -> dict:
    """Each class of ``space`` run on its smallest witness (over the page sizes): ``{class: entry}``, each
    entry with its point, kinds, conditions, whether it is confirmed (``judge``) and its launch and findings."""
    from kvfence.release import contract_space as sp

    classes = {}
    for name in space["classes"]:
        points = [p["classes"][name]["witness"] for p in space["pages"] if name in p["classes"]]
        key = (lambda w: (-w["d"], w["ctx"], w["page_size"])) if name == sp.FITS else \
            (lambda w: (w["d"], w["ctx"], w["page_size"]))
        point = min(points, key=key)
        launch, findings = run_witness(contract, version, kernel, s["site"], point, device)
        kinds = sorted({f.kind.value for f in findings})
        entry = {"point": point, "kinds": kinds, "observed": sorted(k for k in kinds if _observed(contract, k)),
                 "conditions": {str(p["page_size"]): p["classes"][name]["condition"] for p in space["pages"]
                                if name in p["classes"]}, "_run": (launch, findings)}
        why = judge(contract, name, kinds)
        if why:
            entry["why"] = why
        entry["confirmed"] = why is None
        classes[name] = entry
    return classes


def settle_cell(contract, version: str, kernel, s: dict, adm: dict, device: str, out: Path) -> dict:
    """One site's cell: its classes over the whole space (``kvfence.release.contract_space``) under the first
    reach model whose every class the release's kernel confirms on its smallest witness (the declared model
    first), and the status the worst class gives; no model confirmed: an ``error`` (the declared model's)."""
    from kvfence.release import contract_shipped as cs
    from kvfence.release import contract_space as sp

    a = cs.assess(s, adm)
    cell = {"site": site_name(s["site"]), "assessment": a, "status": a["status"]}
    if a["status"] not in ("overflows", "fits"):
        cell["why"] = a["why"]
        return cell
    tried = []
    for model in sp.models(shipped(contract.name).block_pages):
        space = sp.space(s, adm, model)
        classes = _confirm(contract, version, kernel, s, space, device)
        tried.append((space, classes))
        if all(e["confirmed"] for e in classes.values()) or space["classes"] == [sp.FITS]:
            break
    else:
        tried = tried[:1]  # no model holds: the declared one's contradiction is the cell's error
    space, classes = tried[-1]
    cell["space"], cell["reach"] = space, sp.REACH[space["reach"]]
    for name, entry in classes.items():
        launch, findings = entry.pop("_run")
        if name != sp.FITS or findings:
            entry["case_file"] = str(_case_file(out / version / contract.name, launch, findings, device))
    cell["classes"] = classes
    failed = [n for n, e in classes.items() if not e["confirmed"] and n != sp.FITS]
    worst = next((n for n in sp.CLASSES if n in classes), sp.FITS)
    if failed:
        cell["status"], cell["why"] = "error", f"{failed[0]}: {classes[failed[0]]['why']}"
    elif sp.FITS in classes and not classes[sp.FITS]["confirmed"]:
        cell["status"], cell["why"] = "findings on a fitting launch", classes[sp.FITS]["why"]
    else:
        cell["status"] = worst
    primary = classes.get(failed[0] if failed else worst) or classes[sp.FITS]
    cell.update(point=primary["point"], kinds=primary["kinds"], observed=primary["observed"])
    if primary.get("case_file"):
        cell["case_file"] = primary["case_file"]
    overflow = [p["d_min"] for p in space["pages"] if "d_min" in p]
    if overflow:
        cell["d_min"] = min(overflow)
    return cell


def _observed(contract, kind: str) -> bool:
    from kvfence.engine.findings import observed

    return observed(contract, kind)


def run(contracts, versions: List[str], *, device: str, out: Path, progress: Optional[TextIO] = None) -> dict:
    """Every (release, contract) pair: its cells (see the module docstring), and the exit code (1 when a
    release's kernel was seen to write or publish past its row, or a cell is an error). ``progress``: the
    stream of a bar over the releases (``None``: quiet)."""
    from kvfence.engine import kernels
    from kvfence.engine.progress import CountBar

    start = time.monotonic()
    bar = CountBar(len(versions), "releases", progress) if progress is not None else None
    announce = bar.note if bar is not None else None
    rows = []
    for version in versions:
        for contract in contracts:
            row = {"version": version, "contract": contract.name}
            try:
                kernels.resolve(contract, f"sglang=={version}")
            except BadInput as exc:
                row.update(status="no kernel", why=str(exc))
                rows.append(row)
                continue
            record = load_record(version, contract, announce=announce)
            row["admission"] = record["admission"]
            row["cells"] = [settle_cell(contract, version, f"sglang=={version}", s, record["admission"], device, out)
                            for s in record["sites"] if not s["site"].get("fill")]  # no kernel fills those
            rows.append(row)
        if bar is not None:
            bar.advance(f"sglang=={version}")
    if bar is not None:
        bar.close()
    bad = any(c["status"] in ("error", "findings on a fitting launch", PAST, ARITHMETIC)
              for r in rows for c in r.get("cells", ()))
    return {"contracts": [c.name for c in contracts], "versions": versions, "device": device, "rows": rows,
            "elapsed_s": round(time.monotonic() - start, 1), "exit_code": 1 if bad else 0}


def markdown(doc: dict, out: Optional[Path] = None) -> str:
    """One table per contract: a row per run of releases with the same cells, consecutive in the releases asked
    for (a release without the kernel breaks a run, so no range quoted spans one: they are named apart), a column
    per site (split to fit ``text_table.WIDTH``); then the newest release's classes, each with its condition over
    the whole space and the witness that confirmed it on the release's kernel (case files relative to ``out``)."""
    from kvfence.reports.text_table import markdown_tables

    out_lines: List[str] = []
    order = doc["versions"]
    for name in doc["contracts"]:
        rows = [r for r in doc["rows"] if r["contract"] == name]
        have = [r for r in rows if "cells" in r]
        out_lines.append(f"## {name}\n")
        missing = [r for r in rows if "cells" not in r]
        for why, vs in _by_reason(missing):
            out_lines.append(f"No kernel in {_ranges(vs, order)}: {why}.")
        if missing:
            out_lines.append("")
        if not have:
            continue
        sites = [c["site"] for c in have[-1]["cells"]]
        groups: List[tuple] = []
        for r in have:
            cells = {c["site"]: c for c in r["cells"]}
            sig = tuple(_short(cells.get(s)) for s in sites)
            adjacent = groups and order.index(r["version"]) == order.index(groups[-1][0][-1]) + 1
            if adjacent and groups[-1][1] == sig:
                groups[-1][0].append(r["version"])
            else:
                groups.append(([r["version"]], sig))
        out_lines += markdown_tables(["releases"] + sites, [[span(vs), *sig] for vs, sig in groups])
        out_lines.append("")
        out_lines += class_lines(have[-1], out)
        out_lines.append("")
    return "\n".join(out_lines) + "\n"


def span(versions: List[str]) -> str:
    """A run of consecutive releases as quoted: ``a .. b (n)``."""
    return versions[0] if len(versions) == 1 else f"{versions[0]} .. {versions[-1]} ({len(versions)})"


def class_lines(row: dict, out: Optional[Path] = None) -> List[str]:
    """The classes of one release's cells: per site, each class with its condition per page size over the whole
    space (ctx, d ranges) and the witness the release's kernel ran."""
    from kvfence.reports.text_table import shown_path

    lines = [f"Classes of {row['version']} over every context length and draft-token count of the space (one "
             "request at the longest admitted length), each confirmed by a witness on the release's kernel:"]
    for c in row["cells"]:
        if "classes" not in c:
            lines.append(f"- {c['site']}: {c['status']}" + (f": {c['why']}" if c.get("why") else ""))
            continue
        sp = c["space"]
        lines.append(f"- {c['site']}: {c['status']} (ctx {sp['ctx'][0]}..{sp['ctx'][1]}, d {sp['d'][0]}..{sp['d'][1]}; "
                     + "; ".join(f"page {p['page_size']}: W = {p['width']}" for p in sp["pages"])
                     + f"; {c['reach']})")
        for cls, e in c["classes"].items():
            p = e["point"]
            conds = "; ".join(f"page {k}: {v}" for k, v in e["conditions"].items())
            state = "confirmed" if e["confirmed"] else f"NOT confirmed: {e['why']}"
            lines.append(f"  - {cls}: {conds}. Witness ctx {p['ctx']}, page {p['page_size']}, d {p['d']}: length "
                         f"{p['length']} + {p['delta']} needs {p['need']} pages, the row holds {p['width']}: kinds "
                         f"{', '.join(e['kinds']) or 'none'} ({state})")
            if e.get("case_file"):
                lines.append(f"    {shown_path(e['case_file'], out)}")
    return lines


def _by_reason(rows: List[dict]) -> List[tuple]:
    found: dict = {}
    for r in rows:
        why = r.get("why", "")
        # The reason without its release, so releases refused alike are one line.
        found.setdefault(why.replace(f"sglang=={r['version']}", "sglang==V"), []).append(r["version"])
    return list(found.items())


def _short(cell: Optional[dict]) -> str:
    if cell is None:
        return "-"
    if cell["status"] in (PAST, ARITHMETIC) and "d_min" in cell:
        # Every overflowing class the space holds, the worst first: a release whose kernel only truncates in
        # some contexts is not the same row as one that always writes past.
        shown = [n for n in (PAST, ARITHMETIC) if n in cell.get("classes", {})] or [cell["status"]]
        return f"{shown[0].upper()} (d >= {cell['d_min']})" + "".join(f" + {n.upper()}" for n in shown[1:])
    return cell["status"]


def _ranges(versions: List[str], order: List[str]) -> str:
    """``a..b`` runs of consecutive releases of ``order``."""
    idx = sorted(order.index(v) for v in versions)
    runs, begin = [], idx[0]
    for prev, cur in zip(idx, idx[1:] + [-1]):  # -1: past the last, never prev + 1
        if cur != prev + 1:
            runs.append(order[begin] if begin == prev else f"{order[begin]}..{order[prev]}")
            begin = cur
    return ", ".join(runs)


def sentences(doc: dict) -> List[str]:
    """The sentences the docs quote of a shipped matrix (docs/shipped-sizing.md holds them all, README and
    BENCHMARKS some; tests/test_affected_sites.py checks them against ``doc``): per contract and site, its cells
    by the releases that have them (ranges of releases consecutive in the matrix, so a release without the kernel
    is never inside one), then the newest release's classes with their conditions."""
    out = []
    order = doc["versions"]
    for name in doc["contracts"]:
        have = [r for r in doc["rows"] if r["contract"] == name and "cells" in r]
        if not have:
            continue
        sites = [c["site"] for c in have[-1]["cells"]]
        for site in sites:
            by: dict = {}
            for r in have:
                cell = next((c for c in r["cells"] if c["site"] == site), None)
                by.setdefault(_short(cell), []).append(r["version"])
            shown = [(k, vs) for k, vs in by.items() if k not in ("-", "absent")]
            if not shown or all(k in ("fits", "unreadable") for k, _ in shown):
                continue
            out.append(f"{name}, {site}: " + "; ".join(f"{k} in {_ranges(vs, order)}" for k, vs in shown) + ".")
            last: dict = next((c for c in have[-1]["cells"] if c["site"] == site), {})
            for cls, e in last.get("classes", {}).items():
                if cls == "fits":
                    continue
                conds = "; ".join(f"page {k}: {v}" for k, v in e["conditions"].items())
                p = e["point"]
                out.append(f"On {have[-1]['version']}, {name}, {site}, {cls} ({last['reach']}): {conds}; witness ctx "
                           f"{p['ctx']}, page {p['page_size']}, d {p['d']}: {', '.join(e['kinds']) or 'no kinds'}.")
    return out
