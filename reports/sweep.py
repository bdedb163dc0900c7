"""Render the nightly sweep (``harness/tools/sweep.py``): per case, the canary verdict beside each
compute-sanitizer tool's verdict, its own signals and slowdown, and the detection matrix when the sweep
ran it, as one self-contained HTML page. ``matrix_markdown`` gives the matrix as a Markdown table (for
README / BENCHMARKS, from a real run's ``sweep.json``)."""

from __future__ import annotations

import html
from pathlib import Path


def _cell(verdict: dict) -> str:
    parts = []
    if verdict.get("timed_out"):
        parts.append("timed out")
    for f in verdict["findings"]:
        parts.append(f"{f['extra'].get('count', f['count'])} &times; "
                     f"{html.escape(f['extra'].get('message', f['region']))}")
    for f in verdict.get("tool_errors", []):
        parts.append(f"<b>tool error</b>: {html.escape(f['extra'].get('problem', f['detail']))}")
    if not parts:
        parts.append("clean")
    child = verdict.get("child_exit")
    return "<br>".join(parts) + (f"<br><small>exit {verdict['exit_code']}, child {child}, "
                                 f"from {verdict['source']}</small>")


def _matrix_cell(cell) -> str:
    if cell is None:
        return "not run"
    word = "seen" if cell["seen"] else ("error" if cell["tool_errors"] else "missed")
    return word + ("" if not cell["tool_errors"] or not cell["seen"] else " (+tool error)")


def matrix_rows(matrix: dict):
    """``(header, rows)`` of the matrix: one row per bug class, one column per (mode, detector)."""
    header = ["bug class"] + [f"{m} {d}" for m in matrix["modes"] for d in matrix["detectors"]]
    rows = []
    for row in matrix["classes"]:
        rows.append([row["class"]] + [_matrix_cell(row["cells"].get(m, {}).get(d))
                                      for m in matrix["modes"] for d in matrix["detectors"]])
    return header, rows


def matrix_markdown(matrix: dict) -> str:
    header, rows = matrix_rows(matrix)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _matrix_html(matrix: dict) -> str:
    header, rows = matrix_rows(matrix)
    color = {"seen": "#cfc", "missed": "#fcc", "error": "#fc9"}
    body = "".join("<tr>" + f"<td>{html.escape(r[0])}</td>"
                   + "".join(f"<td style='background:{color.get(c.split(' ')[0], '#fff')}'>{c}</td>" for c in r[1:])
                   + "</tr>" for r in rows)
    detail = "".join(f"<li><b>{html.escape(r['class'])}</b>: {html.escape(r['description'])} "
                     f"(<code>{html.escape(r['kernel'])}</code>)</li>" for r in matrix["classes"])
    return (f"<h2>Detection matrix</h2><p>Which detector saw each bug class ({matrix['tool_errors']} tool "
            f"error(s) across all cells; an errored cell is never counted as missed).</p><ul>{detail}</ul>"
            f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in header)}</tr>{body}</table>")


def sweep_html(doc: dict) -> str:
    tools = doc["tools"]
    head = "".join(f"<th>{t}</th><th>{t} slowdown</th>" for t in tools)
    rows = []
    for r in doc["cases"]:
        canary = "<br>".join(html.escape(x) for x in r["canary"]["regions"]) or "clean"
        cells = "".join(f"<td>{_cell(r['tools'][t])}</td><td>{r['tools'][t]['slowdown']}x</td>" for t in tools)
        base = "".join(f"<br><b>baseline error</b>: {html.escape(e['extra']['problem'])}"
                       for e in r.get("baseline_errors", []))
        rows.append(f"<tr><td><code>{html.escape(Path(r['case']).name)}</code><br>{r['mode']}</td>"
                    f"<td>{r['need']} / {r['width']}</td><td>{canary}</td>"
                    f"<td>{r['baseline_s']} s, exit {r.get('baseline_exit')}{base}</td>{cells}</tr>")
    summary = "".join(f"<li>{t}: {v['cases_with_findings']} case(s) with findings, "
                      f"{v.get('cases_with_tool_errors', 0)} with tool errors, median slowdown "
                      f"{v['median_slowdown']}x</li>" for t, v in doc["per_tool"].items())
    matrix = _matrix_html(doc["detection_matrix"]) if doc.get("detection_matrix") else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kvfence sweep</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:4px 8px;vertical-align:top;font-size:13px}}th{{background:#eee}}</style></head><body>
<h1>kvfence nightly sweep</h1>
<p>Kernel {html.escape(str(doc.get('kernel', 'reference')))}: {doc['explored']} cases explored by the canary
harness ({doc['failing']} failing) in {doc['canary_seconds']} s; {len(doc['cases'])} re-run under compute-sanitizer.
Canaries: {doc['canary_cases_with_findings']} case(s) with findings; the children's own verdicts (production
layout): {doc.get('child_cases_with_findings', 0)}. Baseline errors: {doc.get('baseline_errors', 0)}.
Slowdown: each tool's run against the same child (layout, flags, allocator) without a tool.</p><ul>{summary}</ul>
<table><tr><th>case</th><th>need / width</th><th>canary verdict</th><th>baseline</th>{head}</tr>
{''.join(rows)}</table>{matrix}</body></html>
"""


def write_sweep_reports(doc: dict, out_dir) -> Path:
    path = Path(out_dir) / "sweep.html"
    path.write_text(sweep_html(doc))
    return path
