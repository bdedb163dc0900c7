"""Render the nightly sweep (``harness/sanitizer/sweep.py``): per case, the canary verdict beside each
compute-sanitizer tool's verdict, its own signals and slowdown, and the detection matrix when the sweep
ran it, as one self-contained HTML page. ``matrix_markdown`` gives the matrix as a Markdown table (for
README / BENCHMARKS, from a real run's ``sweep.json``)."""

from __future__ import annotations

from pathlib import Path

from kvfence.reports.markup import Markup, html, join


def _cell(verdict: dict) -> Markup:
    parts = []
    if verdict.get("timed_out"):
        parts.append("timed out")
    for f in verdict["findings"]:
        parts.append(html("{} &times; {}", f["extra"].get("count", f["count"]), f["extra"].get("message", f["region"])))
    for f in verdict.get("tool_errors", []):
        parts.append(html("<b>tool error</b>: {}", f["extra"].get("problem", f["detail"])))
    if not parts:
        parts.append("clean")
    return html("{}<br><small>exit {}, child {}, from {}</small>", join(parts, "<br>"), verdict["exit_code"],
                verdict.get("child_exit"), verdict["source"])


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


_MATRIX_COLOURS = {"seen": "#cfc", "missed": "#fcc", "error": "#fc9"}


def _matrix_html(matrix: dict) -> Markup:
    header, rows = matrix_rows(matrix)
    body = join(html("<tr><td>{}</td>{}</tr>", r[0], join(
        html("<td style='background:{}'>{}</td>", _MATRIX_COLOURS.get(c.split(" ")[0], "#fff"), c) for c in r[1:]))
        for r in rows)
    detail = join(html("<li><b>{}</b>: {} (<code>{}</code>)</li>", r["class"], r["description"], r["kernel"])
                  for r in matrix["classes"])
    return html("<h2>Detection matrix</h2><p>Which detector saw each bug class ({} tool error(s) across all cells; "
                "an errored cell is never counted as missed).</p><ul>{}</ul><table><tr>{}</tr>{}</table>",
                matrix["tool_errors"], detail, join(html("<th>{}</th>", h) for h in header), body)


_CSS = """body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;
padding:4px 8px;vertical-align:top;font-size:13px}th{background:#eee}"""


def sweep_html(doc: dict) -> str:
    """sweep.html; every value of sweep.json goes through ``kvfence.reports.markup`` (escaped)."""
    tools = doc["tools"]
    head = join(html("<th>{}</th><th>{} slowdown</th>", t, t) for t in tools)
    rows = []
    for r in doc["cases"]:
        canary = join(r["canary"]["regions"], "<br>") or "clean"
        cells = join(html("<td>{}</td><td>{}x</td>", _cell(r["tools"][t]), r["tools"][t]["slowdown"]) for t in tools)
        base = join(html("<br><b>baseline error</b>: {}", e["extra"]["problem"]) for e in r.get("baseline_errors", []))
        rows.append(html("<tr><td><code>{}</code><br>{}</td><td>{} / {}</td><td>{}</td><td>{} s, exit {}{}</td>{}</tr>",
                         Path(r["case"]).name, r["mode"], r["need"], r["width"], canary, r["baseline_s"],
                         r.get("baseline_exit"), base, cells))
    summary = join(html("<li>{}: {} case(s) with findings, {} with tool errors, median slowdown {}x</li>", t,
                        v["cases_with_findings"], v.get("cases_with_tool_errors", 0), v["median_slowdown"])
                   for t, v in doc["per_tool"].items())
    matrix = _matrix_html(doc["detection_matrix"]) if doc.get("detection_matrix") else ""
    return str(html(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>kvfence sweep</title><style>{}</style></head>"
        "<body>\n<h1>kvfence nightly sweep</h1>\n<p>Kernel {}: {} cases explored by the canary harness ({} failing) "
        "in {} s; {} re-run under compute-sanitizer. Canaries: {} case(s) with findings; the children's own verdicts "
        "(production layout): {}. Baseline errors: {}. Slowdown: each tool's run against the same child (layout, "
        "flags, allocator) without a tool.</p><ul>{}</ul>\n<table><tr><th>case</th><th>need / width</th>"
        "<th>canary verdict</th><th>baseline</th>{}</tr>\n{}</table>{}</body></html>\n",
        Markup(_CSS), doc.get("kernel", "reference"), doc["explored"], doc["failing"], doc["canary_seconds"],
        len(doc["cases"]), doc["canary_cases_with_findings"], doc.get("child_cases_with_findings", 0),
        doc.get("baseline_errors", 0), summary, head, join(rows), matrix))


def write_sweep_reports(doc: dict, out_dir) -> Path:
    path = Path(out_dir) / "sweep.html"
    path.write_text(sweep_html(doc))
    return path
