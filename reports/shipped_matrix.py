"""The ``upstream matrix --shipped`` table (kvfence.workflow.shipped_matrix): one row per release, one column
per backend x mode; and the ``upstream sizing VERSION`` listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

#: Short names of the backends' classes in column headers (the full name is in the legend).
_SUFFIX = "MultiStepDraftBackend"


def short(backend: str) -> str:
    return backend[:-len(_SUFFIX)] if backend.endswith(_SUFFIX) else backend


#: A cell's status in the table, short.
SHORT = {"silent overflow": "OVERFLOW", "host check fires": "check fires", "host check rejects a fitting case":
         "check too strict", "clean": "clean", "topk > 1 refused": "clean (topk>1 refused)", "unreadable": "unreadable",
         "no buffer": "no buffer", "not cached": "not cached", "error": "ERROR"}


def cell_text(cell: dict) -> str:
    """Short: the status, and for an overflow whether it needs the context limit."""
    text = SHORT.get(cell["status"], cell["status"])
    c = cell.get("case")
    if cell["status"] == "silent overflow" and c:
        text += " at ctx limit" if c["at_context_limit"] else " at ordinary lengths"
    if cell.get("refuses_topk") and cell["status"] != "topk > 1 refused":
        text += " (topk>1 refused)"
    return text


def columns(doc: dict) -> List[str]:
    """``BACKEND MODE`` of every cell of any release, backends in name order, graph before eager."""
    backends = sorted({c["backend"] for row in doc["rows"] for c in row["cells"]})
    return [f"{b} {m}" for b in backends for m in ("graph", "eager")]


def _signature(row: dict, cols: List[str]) -> tuple:
    by = {f"{c['backend']} {c['mode']}": cell_text(c) for c in row["cells"]}
    return (row["note"],) + tuple(by.get(c, "-") for c in cols)


def grouped(doc: dict) -> List[Tuple[List[str], tuple]]:
    """Consecutive releases with the same row, as ``(versions, row)``."""
    cols = columns(doc)
    groups: List[Tuple[List[str], tuple]] = []
    for row in doc["rows"]:
        sig = _signature(row, cols)
        if groups and groups[-1][1] == sig:
            groups[-1][0].append(row["version"])
        else:
            groups.append(([row["version"]], sig))
    return groups


def witnesses(doc: dict) -> List[dict]:
    """The minimal case of each distinct failure (status, backend, mode, case), with the releases it covers."""
    seen: Dict[tuple, dict] = {}
    for row in doc["rows"]:
        for c in row["cells"]:
            if c.get("case"):
                key = (c["status"], c["backend"], c["mode"], json.dumps(c["case"], sort_keys=True), tuple(c["kinds"]))
                seen.setdefault(key, {**c, "releases": []})["releases"].append(row["version"])
    return list(seen.values())


def _span(versions: List[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]} .. {versions[-1]} ({len(versions)})"


def markdown(doc: dict) -> str:
    from kvfence.workflow.shipped_matrix import case_text

    cols = [c for c in columns(doc)]
    used = [i for i, c in enumerate(cols) if any(sig[1 + i] != "-" for _, sig in grouped(doc))]
    d = doc["domain"]
    lengths = f"lengths up to ctx - num_steps" if d.get("ordinary_only") else "lengths up to ctx"
    lines = [f"Shipped sizing per release: ctx={d['ctx']}, num_steps={d['num_steps']}, max_bs={d['max_bs']}, "
             f"topk <= {d['max_topk']}, {lengths}; device {doc['device']}; {len(doc['rows'])} release(s) in "
             f"{doc['elapsed_s']} s. Consecutive releases with the same row are one line.", "",
             "| releases | " + " | ".join(f"{short(cols[i].split()[0])} {cols[i].split()[1]}" for i in used) + " |",
             "|---|" + "---|" * len(used)]
    for versions, sig in grouped(doc):
        if sig[0]:
            lines.append(f"| {_span(versions)} | {sig[0]} |" + " |" * (len(used) - 1))
        else:
            lines.append(f"| {_span(versions)} | " + " | ".join(sig[1 + i] for i in used) + " |")
    lines += ["", "Minimal case of each distinct failure (the first release's case file replays it with "
              "`python -m kvfence repro FILE`):", "", "| status | backend mode | kinds | minimal case | releases | case file |",
              "|---|---|---|---|---|---|"]
    for w in witnesses(doc):
        lines.append(f"| {w['status']} | {short(w['backend'])} {w['mode']} | {', '.join(w['kinds'])} | "
                     f"{case_text(w['case'])} | {_span(w['releases'])} | {w['case_file']} |")
    lines += ["", "Legend:"] + [f"- `{k}`: {v}" for k, v in doc["statuses"].items()]
    lines.append("- backends: " + ", ".join(f"`{short(c.split()[0])}` = {c.split()[0]}" for c in cols[::2]))
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text(markdown(doc), encoding="utf-8")
    return path


def sizing_lines(version: str, record: dict) -> List[str]:
    """``upstream sizing VERSION``: per backend, both widths, the host check and where each came from."""
    from kvfence.cases.shipped_sizing import site_state

    out = [f"sglang=={version}: {len(record['backends'])} draft backend(s) (classes that launch the kernel, "
           "and their subclasses)"]
    for name, b in sorted(record["backends"].items()):
        out.append("")
        base = f" (subclass of {', '.join(b['bases'])})" if b["bases"] else ""
        out.append(f"{name}{base}: {b['file']}:{b['line']}")
        for mode in ("graph", "eager"):
            site = b[mode]
            state, text = site_state(site)
            if state == "ok":
                line = f"  {mode:<6} W = {text}   ({site['source']}: {site['formula_text']})"
                for p, v in site.get("params", {}).items():
                    line += f"\n         {p} = {v['formula']} [{v['unit']}]   ({v['source']}: {v['text']})"
            else:
                line = f"  {mode:<6} {state}: {text}"
            out.append(line)
        check = b.get("host_check")
        state, text = site_state(check)
        out.append(f"  check  {'none' if state == 'absent' else (text + ' <= W   (' + check['source'] + ')') if state == 'ok' else state + ': ' + text}")
        if b.get("refuses"):
            out.append(f"  refuses {b['refuses']['refuses']}   ({b['refuses']['source']}: if {b['refuses']['text']}: raise)")
    return out
