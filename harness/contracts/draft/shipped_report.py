"""The ``upstream matrix --shipped`` table (kvfence.release.shipped_matrix): one row per release, one column
per backend x mode; and the ``upstream sizing VERSION`` listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple


def short(backend: str) -> str:
    """A backend class as a deployer names it: SGLang's ``--attention-backend`` (the legend gives the class)."""
    from kvfence.release.affected import attention_backend_name

    return attention_backend_name(backend)


#: A cell's status in the table, in a few letters (the legend spells each out).
CODE = {"silent overflow": "OVF", "host check fires": "fires", "host check rejects a fitting case": "strict",
        "clean": "ok", "topk > 1 refused": "ok*", "unreadable": "unread", "no buffer": "none",
        "not launched at replay": "cap", "not cached": "n/c", "error": "ERROR"}
CODE_LEGEND = {"OVF": "silent overflow at ordinary lengths", "wall": "silent overflow, only at the context limit",
               "fires": "the host check fires (the launch is refused, loudly)",
               "strict": "the host check rejects a case that fits", "ok": "clean", "none": "no buffer to size",
               "cap": "graph mode: launched while capturing only, no real batch reaches the kernel",
               "unread": "the sizing could not be read", "n/c": "not cached", "ERROR": "the cell could not be checked",
               "*": "the backend refuses topk > 1 (its verdict covers topk 1)", "-": "the release has no such backend",
               "A/B": "graph mode A, eager mode B (one code when both agree)"}


def cell_text(cell: dict) -> str:
    """Short: the status's code, for an overflow whether it needs the context limit, ``*`` when the backend
    refuses topk > 1."""
    text = CODE.get(cell["status"], cell["status"])
    c = cell.get("case")
    if cell["status"] == "silent overflow" and c and c["at_context_limit"]:
        text = "wall"
    if cell.get("refuses_topk") and cell["status"] != "topk > 1 refused":
        text += "*"
    return text


def backends(doc: dict) -> List[str]:
    """Every backend class of any release, in name order."""
    return sorted({c["backend"] for row in doc["rows"] for c in row["cells"]})


def _signature(row: dict, names: List[str]) -> tuple:
    by = {(c["backend"], c["mode"]): cell_text(c) for c in row["cells"]}

    def both(b: str) -> str:
        graph, eager = by.get((b, "graph"), "-"), by.get((b, "eager"), "-")
        return graph if graph == eager else f"{graph}/{eager}"

    return (row["note"],) + tuple(both(b) for b in names)


def grouped(doc: dict) -> List[Tuple[List[str], tuple]]:
    """Consecutive releases with the same row, as ``(versions, row)``."""
    names = backends(doc)
    groups: List[Tuple[List[str], tuple]] = []
    for row in doc["rows"]:
        sig = _signature(row, names)
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


def markdown(doc: dict, out: Optional[Path] = None) -> str:
    """The report: a table of releases x backends (split to fit ``text_table.WIDTH``), each distinct failure's
    minimal case and case file (relative to ``out``, the report's folder), and the legend."""
    from kvfence.contracts.draft.shipped_matrix import case_text
    from kvfence.reports.text_table import markdown_tables, shown_path

    names = backends(doc)
    groups = grouped(doc)
    used = [i for i, _ in enumerate(names) if any(sig[1 + i] != "-" for _, sig in groups)]
    d = doc["domain"]
    lengths = "lengths up to ctx - num_steps" if d.get("ordinary_only") else "lengths up to ctx"
    lines = [f"Shipped sizing per release: ctx={d['ctx']}, num_steps={d['num_steps']}, max_bs={d['max_bs']}, "
             f"topk <= {d['max_topk']}, {lengths};",
             f"device {doc['device']}; {len(doc['rows'])} release(s) in {doc['elapsed_s']} s. "
             "Consecutive releases with the same row are one line; a cell is graph/eager.", ""]
    rows = []
    for versions, sig in groups:
        rows.append([_span(versions)] + ([sig[0]] + [""] * (len(used) - 1) if sig[0] else [sig[1 + i] for i in used]))
    lines += markdown_tables(["releases"] + [short(names[i]) for i in used], rows)
    lines += ["", "Minimal case of each distinct failure (`kvfence repro FILE` replays the first release's):", ""]
    for w in witnesses(doc):
        lines.append(f"- {short(w['backend'])} {w['mode']}, {_span(w['releases'])}: {w['status']} "
                     f"({', '.join(w['kinds'])})")
        lines.append(f"  {case_text(w['case'])}")
        lines.append(f"  {shown_path(w['case_file'], out)}")
    lines += ["", "Legend:"] + [f"- `{k}`: {v}" for k, v in CODE_LEGEND.items()]
    lines += ["", "Backends, by SGLang's `--attention-backend` name:"] + [f"- `{short(b)}`: {b}" for b in names]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text(markdown(doc, out), encoding="utf-8")
    return path


def sizing_lines(version: str, record: dict) -> List[str]:
    """``upstream sizing VERSION``: per backend, both widths, the host check and where each came from."""
    from kvfence.contracts.draft.shipped_sizing import site_state
    from kvfence.contracts.draft.shipped_wheel import unread_note

    # What was not read (too many backend classes, members left out) is said on the first line: a count of
    # backends alone would hide that the rest of the wheel was never looked at.
    out = [f"sglang=={version}: {len(record['backends'])} draft backend(s) (classes that launch the kernel, "
           "and their subclasses)" + unread_note(record)]
    for name, b in sorted(record["backends"].items()):
        out.append("")
        base = f" (subclass of {', '.join(b['bases'])})" if b["bases"] else ""
        out.append(f"{name}{base}: {b['file']}:{b['line']}")
        for mode in ("graph", "eager"):
            site = b[mode]
            state, text = site_state(site)
            if state == "ok":  # one item per output line: a caller escapes a newline inside one (a wheel's text)
                out.append(f"  {mode:<6} W = {text}   ({site['source']}: {site['formula_text']})")
                out.extend(f"         {p} = {v['formula']} [{v['unit']}]   ({v['source']}: {v['text']})"
                           for p, v in site.get("params", {}).items())
            else:
                out.append(f"  {mode:<6} {state}: {text}")
        check = b.get("host_check")
        state, text = site_state(check)
        shown = ("none" if state == "absent" else (text + " <= W   (" + check["source"] + ")") if state == "ok"
                 else state + ": " + text)
        out.append(f"  check  {shown}")
        if b.get("refuses"):
            out.append(f"  refuses {b['refuses']['refuses']}   "
                       f"({b['refuses']['source']}: if {b['refuses']['text']}: raise)")
    return out
