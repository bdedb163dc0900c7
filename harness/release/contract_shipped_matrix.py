"""``upstream matrix --shipped --contracts C,...`` and ``upstream sizing VERSION --contract C`` for plug-in
contracts: each release's backends under their own shipped sizing, a cell per (contract, backend, CUDA-graph
mode, forward mode). It knows no contract by name.

Per release and contract: the release's kernel is extracted from the wheel (the record's ``resolve``; a release
without it, or with another signature, is a ``no kernel`` cell with the reason), the sites are read
(``kvfence.release.contract_shipped``, cached as ``CACHE/sglang-V/contracts/C.shipped.json`` so an offline host
reads the same record), and each readable site is assessed over the production domain. A cell's status rests
on what the release's kernel did: an ``overflows`` site's witness (one request at the longest length the
scheduler admits, on the width the release computes) is launched in guarded tables, and the cell names the
kinds it showed (``GUARD_OVERWRITE``: pages landed past the row; ``TABLE_TRUNCATED`` /
``PUBLISHED_PAST_TABLE``: a length the consumer reads past its row); a ``fits`` site's longest fitting launch
must come back clean. A witness that shows nothing is an ``error`` cell; a fitting launch with findings is the kernel's own bug
(``findings on a fitting launch``).
Each witness is written as a contract case file that ``kvfence repro`` replays (its width is the release's).
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

#: The kinds that say the launch's length does not fit its row, by what they mean for the cell.
DAMAGE = {"GUARD_OVERWRITE": "writes past its row", "TABLE_TRUNCATED": "truncates",
          "PUBLISHED_PAST_TABLE": "publishes a length past its row"}


def _record_path(version: str, contract) -> Path:
    from kvfence.release import upstream

    return upstream.cache_root() / f"sglang-{version}" / "contracts" / f"{contract.name}.shipped.json"


def load_record(version: str, contract, *, announce=None) -> dict:
    """The contract's shipped record of ``sglang==version``: from the cache, else read from the wheel."""
    from kvfence.release import contract_shipped as cs
    from kvfence.release import upstream

    upstream.check_version(version)
    path = _record_path(version, contract)
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            doc = None
        if isinstance(doc, dict) and doc.get("format") == cs.FORMAT and doc.get("contract") == contract.name \
                and isinstance(doc.get("sites"), list) and all(isinstance(s, dict) for s in doc["sites"]) \
                and [s.get("site") for s in doc["sites"]] == json.loads(json.dumps(
                    [dataclasses.asdict(s) for s in contract.shipped_sites])):
            try:
                return cs.validate(doc)
            except (BadInput, RecursionError):
                pass  # a damaged cache record is read again from the wheel (offline: one line, exit 2)
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = upstream._find_wheel(version, None, upstream.offline_by_env(), Path(tmp), announce)
        doc = cs.read(contract, wheel)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(staging, path)
    return json.loads(path.read_text(encoding="utf-8"))  # what a later run reads (tuples as lists)


def site_name(site: dict) -> str:
    return f"{site['backend']} {site['mode']} {site['forward_mode'].replace('_', ' ')}"


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
                out.append(f"    {label}: {v['formula']}" + (f"   <- {v['text']} ({v['source']})" if v["source"] else ""))
        if s["site"].get("note"):
            out.append(f"    note: {s['site']['note']}")
    return out


def _case_file(out: Path, launch, findings, device: str) -> Path:
    from kvfence.engine.casefile import write_case

    return write_case(launch, findings, out_dir=out, device=device, source="shipped-matrix")


def shipped_sizing(version: str, site: dict) -> str:
    """The sizing a witness case file names: the release's, for one site (its width is in the file)."""
    return f"sglang=={version}:{site['backend']}:{site['mode']}:{site['forward_mode']}"


def settle_cell(contract, version: str, kernel, s: dict, adm: dict, device: str, out: Path, **domain) -> dict:
    """One site's cell: its assessment (``domain``: ``contexts``/``draft_tokens`` of ``assess``, default the
    matrix's), and the release's kernel run on the witness (or on the longest fitting launch)."""
    from kvfence.release import contract_shipped as cs

    a = cs.assess(s, adm, **domain)
    cell = {"site": site_name(s["site"]), "assessment": a, "status": a["status"]}
    if a["status"] not in ("overflows", "fits"):
        cell["why"] = a["why"]
        return cell
    point = a["witness"] if a["status"] == "overflows" else a["fits_at"]
    case = contract.wall_case(point["ctx"], point["page_size"], point["delta"], point["length"])
    # How it ran: in a CUDA graph for a graph site on CUDA (the width is the release's, recorded with the case).
    launch = contract.bind(case, shipped_sizing(version, s["site"]), kernel, s["site"]["mode"], point["width"])
    findings = contract.check_launch(launch, device)
    kinds = sorted({f.kind.value for f in findings})
    cell.update(kinds=kinds, point=point)
    damage = [DAMAGE[k] for k in DAMAGE if k in kinds]
    if a["status"] == "overflows":
        cell["case_file"] = str(_case_file(out / version / contract.name, launch, findings, device))
        cell["status"] = ", ".join(damage) if damage else "error"
        if not damage:
            cell["why"] = "the arithmetic says the length needs more pages than the row, the kernel showed none"
    elif findings:
        cell["status"] = "findings on a fitting launch"
        cell["case_file"] = str(_case_file(out / version / contract.name, launch, findings, device))
        cell["why"] = f"a launch that fits its row has findings: {', '.join(kinds)}"
    return cell


def run(contracts, versions: List[str], *, device: str, out: Path, progress: Optional[TextIO] = None) -> dict:
    """Every (release, contract) pair: its cells (see the module docstring), and the exit code (1 when a
    release's kernel was seen to write or publish past its row, or a cell is an error). ``progress``: the
    stream of a bar over the releases (``None``: quiet)."""
    from kvfence.engine.progress import CountBar

    start = time.monotonic()
    bar = CountBar(len(versions), "releases", progress) if progress is not None else None
    announce = bar.note if bar is not None else None
    rows = []
    for version in versions:
        for contract in contracts:
            row = {"version": version, "contract": contract.name}
            try:
                contract.resolve(f"sglang=={version}")
            except BadInput as exc:
                row.update(status="no kernel", why=str(exc))
                rows.append(row)
                continue
            record = load_record(version, contract, announce=announce)
            row["admission"] = record["admission"]
            row["cells"] = [settle_cell(contract, version, f"sglang=={version}", s, record["admission"], device, out)
                            for s in record["sites"]]
            rows.append(row)
        if bar is not None:
            bar.advance(f"sglang=={version}")
    if bar is not None:
        bar.close()
    bad = any(c["status"] in ("error", "findings on a fitting launch") or c["assessment"].get("status") == "overflows"
              for r in rows for c in r.get("cells", ()))
    return {"contracts": [c.name for c in contracts], "versions": versions, "device": device, "rows": rows,
            "elapsed_s": round(time.monotonic() - start, 1), "exit_code": 1 if bad else 0}


def markdown(doc: dict, out: Optional[Path] = None) -> str:
    """One table per contract: a row per run of consecutive releases with the same cells, a column per site
    (split to fit ``text_table.WIDTH``); then the newest release's witnesses, case files relative to ``out``."""
    from kvfence.reports.text_table import markdown_tables, shown_path

    out_lines: List[str] = []
    for name in doc["contracts"]:
        rows = [r for r in doc["rows"] if r["contract"] == name]
        have = [r for r in rows if "cells" in r]
        out_lines.append(f"## {name}\n")
        missing = [r["version"] for r in rows if "cells" not in r]
        if missing:
            out_lines.append(f"No kernel (absent, or another signature): {_ranges(missing, doc['versions'])}.\n")
        if not have:
            continue
        sites = [c["site"] for c in have[-1]["cells"]]
        groups: List[tuple] = []
        for r in have:
            cells = {c["site"]: c for c in r["cells"]}
            sig = tuple(_short(cells.get(s)) for s in sites)
            if groups and groups[-1][1] == sig:
                groups[-1][0].append(r["version"])
            else:
                groups.append(([r["version"]], sig))
        span = lambda vs: vs[0] if len(vs) == 1 else f"{vs[0]} .. {vs[-1]} ({len(vs)})"  # noqa: E731
        out_lines += markdown_tables(["releases"] + sites, [[span(vs), *sig] for vs, sig in groups])
        out_lines.append("")
        last = have[-1]
        out_lines.append(f"Witnesses of {last['version']} (one request at the longest admitted length):")
        for c in last["cells"]:
            if c.get("point"):
                p = c["point"]
                out_lines.append(f"- {c['site']}: {c['status']}; kinds {', '.join(c.get('kinds', [])) or 'none'}")
                out_lines.append(f"  ctx {p['ctx']}, page {p['page_size']}, d {p['d']}: length {p['length']} + "
                                 f"{p['delta']} needs {p['need']} pages, the row holds {p['width']}; "
                                 f"{c['assessment']['overflow']} of {c['assessment']['points']} domain points overflow")
                if c.get("case_file"):
                    out_lines.append(f"  {shown_path(c['case_file'], out)}")
            elif c.get("why"):
                out_lines.append(f"- {c['site']}: {c['status']}: {c['why']}")
        out_lines.append("")
    return "\n".join(out_lines) + "\n"


def _short(cell: Optional[dict]) -> str:
    if cell is None:
        return "-"
    if cell.get("point") and cell["assessment"]["status"] == "overflows":
        return f"{cell['status'].upper()} (d >= {cell['point']['d']})"
    return cell["status"]


def _ranges(versions: List[str], order: List[str]) -> str:
    """``a..b`` runs of consecutive releases of ``order``."""
    idx = sorted(order.index(v) for v in versions)
    runs, begin = [], idx[0]
    for prev, cur in zip(idx, idx[1:] + [None]):
        if cur != prev + 1:
            runs.append(order[begin] if begin == prev else f"{order[begin]}..{order[prev]}")
            begin = cur
    return ", ".join(runs)
