"""Render the nightly sweep (``harness/sweep.py``): per case, the canary verdict beside each
compute-sanitizer tool's verdict and slowdown, as one self-contained HTML page."""

from __future__ import annotations

import html
from pathlib import Path


def _cell(verdict: dict) -> str:
    if verdict.get("timed_out"):
        return "timed out"
    findings = verdict["findings"]
    if not findings:
        return f"clean (exit {verdict['exit_code']})"
    parts = [f"{f['extra'].get('count', f['count'])} &times; {html.escape(f['extra'].get('message', f['region']))}"
             for f in findings]
    return "<br>".join(parts) + f"<br><small>exit {verdict['exit_code']}, from {verdict['source']}</small>"


def sweep_html(doc: dict) -> str:
    tools = doc["tools"]
    head = "".join(f"<th>{t}</th><th>{t} slowdown</th>" for t in tools)
    rows = []
    for r in doc["cases"]:
        canary = "<br>".join(html.escape(x) for x in r["canary"]["regions"]) or "clean"
        cells = "".join(f"<td>{_cell(r['tools'][t])}</td><td>{r['tools'][t]['slowdown']}x</td>" for t in tools)
        rows.append(f"<tr><td><code>{html.escape(Path(r['case']).name)}</code><br>{r['mode']}</td>"
                    f"<td>{r['need']} / {r['width']}</td><td>{canary}</td>{cells}</tr>")
    summary = "".join(f"<li>{t}: {v['cases_with_findings']} case(s) with findings, median slowdown "
                      f"{v['median_slowdown']}x</li>" for t, v in doc["per_tool"].items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kvfence sweep</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:4px 8px;vertical-align:top;font-size:13px}}th{{background:#eee}}</style></head><body>
<h1>kvfence nightly sweep</h1>
<p>{doc['explored']} cases explored by the canary harness ({doc['failing']} failing) in {doc['canary_seconds']} s;
{len(doc['cases'])} re-run under compute-sanitizer. Canaries: {doc['canary_cases_with_findings']} case(s) with
findings.</p><ul>{summary}</ul>
<table><tr><th>case</th><th>need / width</th><th>canary verdict</th>{head}</tr>
{''.join(rows)}</table></body></html>
"""


def write_sweep_reports(doc: dict, out_dir) -> Path:
    path = Path(out_dir) / "sweep.html"
    path.write_text(sweep_html(doc))
    return path
