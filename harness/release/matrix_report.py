"""Render the upstream release matrix (``harness/release/release_matrix.py``) as ``report.md`` and ``report.html``.

One row per release, one column per sizing x contract, a note column for what a whole release is (no
kernel, ABI unsupported, not cached) and a legend of the statuses. Case files are linked relative to the
report's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Tuple

from kvfence.reports.markup import Markup, escape, file_link, html, join

#: Short cell text per status.
SHORT = {"clean": "clean", "findings": "findings", "not-applicable": "n/a", "abi-unsupported": "ABI unsupported",
         "error": "error", "not-cached": "not cached", "pending": "not run"}
_COLOURS = {"clean": "#dff3e4", "findings": "#fbe3e4", "error": "#fff1c2", "abi-unsupported": "#ececec",
            "not-applicable": "#f6f6f6", "not-cached": "#f6f6f6", "pending": "#ffffff"}


def _columns(doc: dict) -> List[Tuple[str, str]]:
    return [(s, c) for s in doc["sizings"] for c in doc["contracts"]]


def _header(doc: dict, sizing: str, contract: str) -> str:
    return sizing if len(doc["contracts"]) == 1 else f"{sizing} / {contract}"


def _grid(doc: dict) -> Dict[Tuple[str, str, str], dict]:
    return {(c["version"], c["sizing"], c["contract"]): c for c in doc.get("cells", [])}


def _release_note(release: dict, cells: List[dict]) -> str:
    """What the note column says about a release: why none of it ran, and each cell's error message."""
    if release.get("status"):
        return release.get("reason", "")
    notes = []
    abis = release.get("abis") or {}
    if abis:
        notes.append(f"{release.get('source_path')}: " + ", ".join(f"{k} ({v})" for k, v in abis.items()))
    notes += sorted({c["message"] for c in cells
                     if c["status"] in ("clean", "findings", "not-applicable") and c.get("message")})
    notes += [f"{c['sizing']}/{c['contract']}: {c['message']}" for c in cells
              if c["status"] == "error" and c.get("message")]
    return "; ".join(notes)


def _counts(doc: dict) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for c in doc.get("cells", []):
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    return counts


def headline(doc: dict) -> str:
    """One sentence: what the exit code says about the releases."""
    safe = set(doc.get("safe_sizings", []))
    bad = [c for c in doc.get("cells", []) if c["sizing"] in safe and c["status"] in ("findings", "error")]
    if doc.get("interrupted"):
        lead = f"interrupted by {doc['interrupted']} ({doc.get('pending', 0)} cell(s) not run); of the cells run, "
    else:
        lead = ""
    if bad:
        from kvfence.release.release_matrix import version_key

        names = sorted({c["version"] for c in bad}, key=version_key)
        return lead + (f"{len(bad)} cell(s) of a correct sizing ({', '.join(sorted(safe))}) have findings or "
                       f"errors, in sglang {', '.join(names)} (exit 1)")
    return lead + f"every applicable cell of a correct sizing ({', '.join(sorted(safe))}) is clean (exit 0)"


def _settings(doc: dict) -> str:
    tools = ", ".join(f"{k} {v}" for k, v in sorted((doc.get("tool_versions") or {}).items()))
    return (f"device {doc['device']}, {doc['max_examples']} examples per cell, seed {doc['seed']}, "
            f"{len(doc['versions'])} release(s) x {len(doc['sizings'])} sizing(s) x {len(doc['contracts'])} "
            f"contract(s), {doc.get('elapsed_s', 0):.0f} s" + (f"; {tools}" if tools else ""))


def _cell_text(cell: dict) -> str:
    text = SHORT.get(cell["status"], cell["status"])
    if cell["kinds"]:
        text += ": " + ", ".join(cell["kinds"])
    return text


def markdown(doc: dict, out_dir: Path) -> str:
    """report.md: the table (split by columns to fit ``text_table.WIDTH``), then each release's note and
    each findings cell's first case file, relative to ``out_dir`` (report.html links them in its cells)."""
    from kvfence.reports.text_table import markdown_tables, shown_path

    grid, cols = _grid(doc), _columns(doc)
    lines = ["# kvfence upstream release matrix", "", f"**{headline(doc)}**", "", _settings(doc), ""]
    rows, notes, files = [], [], []
    for release in doc["releases"]:
        v = release["version"]
        cells = [grid.get((v, s, c)) for s, c in cols]
        row = []
        for (sizing, contract), cell in zip(cols, cells):
            if cell is None:
                row.append(SHORT["pending"])
                continue
            text = _cell_text(cell)
            row.append(text if cell["status"] != "findings" else f"**{text}**")
            if cell["case_files"]:
                files.append(f"- {v} {_header(doc, sizing, contract)}: {shown_path(cell['case_files'][0], out_dir)}")
        rows.append([v, *row])
        note = _release_note(release, [c for c in cells if c])
        if note:
            notes.append(f"- {v}: {note}")
    lines += markdown_tables(["release"] + [_header(doc, s, c) for s, c in cols], rows)
    counts = _counts(doc)
    lines += ["", "Cells: " + ", ".join(f"{n} {SHORT.get(s, s)}" for s, n in sorted(counts.items()))]
    if notes:
        lines += ["", "## Notes", ""] + notes
    if files:
        lines += ["", "## Case files (replay one with `kvfence repro FILE`)", ""] + files
    lines += ["", "## Legend", ""]
    lines += [f"* **{SHORT.get(s, s)}** — {text}" for s, text in doc["statuses"].items()]
    lines += [f"* a correct sizing is {', '.join(doc.get('safe_sizings', []))}: a finding there is a bug in the "
              "release (exit 1); findings under the other sizings are the expected overflows of those policies",
              "* a findings cell's first case file is listed under Case files", ""]
    return "\n".join(lines)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
        "th{background:#f3f3f3}.note{color:#555;font-size:12px}a{color:inherit}")


def html_report(doc: dict, out_dir: Path) -> str:
    """report.html of the matrix; every value goes through ``kvfence.reports.markup`` (escaped)."""
    grid, cols = _grid(doc), _columns(doc)
    parts = [html("<!doctype html><html><head><meta charset='utf-8'><title>kvfence upstream release matrix</title>"
                  "<style>{}</style></head><body><h1>kvfence upstream release matrix</h1><p><b>{}</b></p>"
                  "<p class='note'>{}</p><table><tr><th>release</th>", Markup(_CSS), headline(doc), _settings(doc))]
    parts += [html("<th>{}</th>", _header(doc, s, c)) for s, c in cols] + [Markup("<th>note</th></tr>")]
    for release in doc["releases"]:
        v = release["version"]
        cells = [grid.get((v, s, c)) for s, c in cols]
        parts.append(html("<tr><td>{}</td>", v))
        for cell in cells:
            status = cell["status"] if cell else "pending"
            text = escape(_cell_text(cell)) if cell else escape(SHORT["pending"])
            if cell and cell["case_files"]:
                text = file_link(cell["case_files"][0], out_dir, text)
            title = cell["message"] if cell and cell.get("message") else ""
            parts.append(html("<td style='background:{}' title='{}'>{}</td>", _COLOURS.get(status, "#fff"), title,
                              text))
        parts.append(html("<td class='note'>{}</td></tr>", _release_note(release, [c for c in cells if c])))
    parts.append(html("</table><p>Cells: {}</p><h2>Legend</h2><ul>",
                      ", ".join(f"{n} {SHORT.get(s, s)}" for s, n in sorted(_counts(doc).items()))))
    parts += [html("<li style='background:{}'><b>{}</b>: {}</li>", _COLOURS.get(s, "#fff"), SHORT.get(s, s), text)
              for s, text in doc["statuses"].items()]
    parts.append(html("<li>a correct sizing is {}: a finding there is a bug in the release (exit 1); findings under "
                      "the other sizings are the expected overflows of those policies</li><li>a findings cell links "
                      "its first case file; replay it with <code>kvfence repro FILE</code></li></ul></body></html>\n",
                      ", ".join(doc.get("safe_sizings", []))))
    return str(join(parts))


def write(doc: dict, out_dir: Path) -> None:
    """``report.md`` and ``report.html`` in ``out_dir`` (each replaced whole)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("report.md", markdown(doc, out_dir)), ("report.html", html_report(doc, out_dir))):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out_dir / name)
