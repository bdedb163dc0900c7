"""The ``upstream matrix --shipped`` table (kvfence.workflow.shipped_matrix): one row per release, one column
per backend x mode; and the ``upstream sizing VERSION`` listing."""

from __future__ import annotations

from pathlib import Path
from typing import List

#: Short names of the backends' classes in column headers (the full name is in the legend).
_SUFFIX = "MultiStepDraftBackend"


def short(backend: str) -> str:
    return backend[:-len(_SUFFIX)] if backend.endswith(_SUFFIX) else backend


def cell_text(cell: dict) -> str:
    status = cell["status"]
    c = cell.get("case")
    if c:
        where = "ctx limit" if c["at_context_limit"] else "ordinary"
        return f"{status}: topk={c['topk']} n={c['requests']} L={c['seq_len']} ({where})"
    return status


def columns(doc: dict) -> List[str]:
    seen = []
    for row in doc["rows"]:
        for cell in row["cells"]:
            key = f"{cell['backend']} {cell['mode']}"
            if key not in seen:
                seen.append(key)
    return sorted(seen)


def markdown(doc: dict) -> str:
    cols = columns(doc)
    d = doc["domain"]
    lines = [f"Shipped sizing per release (domain: ctx={d['ctx']}, num_steps={d['num_steps']}, max_bs={d['max_bs']}, "
             f"topk <= {d['max_topk']}; device {doc['device']}; {doc['elapsed_s']} s)", "",
             "| release | " + " | ".join(f"{short(c.split()[0])} {c.split()[1]}" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for row in doc["rows"]:
        by = {f"{c['backend']} {c['mode']}": c for c in row["cells"]}
        if not row["cells"]:
            lines.append(f"| {row['version']} | {row['note']} |" + " |" * (len(cols) - 1))
            continue
        lines.append(f"| {row['version']} | " + " | ".join(cell_text(by[c]) if c in by else "-" for c in cols) + " |")
    lines += ["", "Legend:"] + [f"- `{k}`: {v}" for k, v in doc["statuses"].items()]
    lines += [f"- `{short(c.split()[0])}`: {c.split()[0]}" for c in dict.fromkeys(x for x in cols)
              if c.endswith(" graph")]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text(markdown(doc), encoding="utf-8")
    return path


def sizing_lines(version: str, record: dict) -> List[str]:
    """``upstream sizing VERSION``: per backend, both widths, the host check and where each came from."""
    from kvfence.cases.shipped import site_state

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
